"""What every attention kernel shares: the shape contract, grouped-query heads, the softmax dtype."""

from __future__ import annotations

import torch
from torch import Tensor


def check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q (B, H, Tq, d_h); k, v (B, H_kv, Tk, d_h) with H % H_kv == 0 and Tq <= Tk."""
    if q.dim() != 4 or k.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"attention wants q (B,H,Tq,d), k/v (B,H_kv,Tk,d); got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1] or q.shape[2] > k.shape[2]:
        raise ValueError(f"need H % H_kv == 0 and Tq <= Tk; got q {tuple(q.shape)}, k {tuple(k.shape)}")


def expand_kv(k: Tensor, n_heads: int) -> Tensor:
    """Grouped-query keys or values (B, H_kv, T, d) repeated to ``n_heads`` heads (the paths whose
    kernels take no GQA)."""
    if k.shape[1] == n_heads:
        return k
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax (and bias addition) in fp32 for half-precision inputs, fp64 stays fp64."""
    return torch.promote_types(dtype, torch.float32)
