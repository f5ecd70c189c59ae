"""The one place that turns q, k, v (+ a bias description) into attention outputs.

STUB: only the materialized reference for now; the fast paths (fused SDPA, folded bias, query
chunking, FlexAttention on CUDA) replace the body of ``attention`` behind the same signature.

Shapes: q (B, H, Tq, d_h); k, v (B, H_kv, Tk, d_h) with H % H_kv == 0; Tq <= Tk. Attention is
causal with the queries aligned to the END of the keys (query t sees keys j <= t + Tk - Tq),
which covers both full forwards (Tq == Tk) and cached decoding (Tq new tokens after Tk - Tq).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from extrapos.positions.base import Bias, FoldedBias, PairwiseBias


def _expand_kv(k: Tensor, n_heads: int) -> Tensor:
    if k.shape[1] == n_heads:
        return k
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


def bias_block(bias: Bias, q_slice: slice | None = None) -> Tensor:
    """Materialize the bias for a block of queries: (B, H or 1, tq, Tk)."""
    if isinstance(bias, FoldedBias):
        qf = bias.q_feat if q_slice is None else bias.q_feat[:, :, q_slice]
        return qf.unsqueeze(-1) * bias.k_feat.unsqueeze(-2)
    if isinstance(bias, PairwiseBias):
        qf = bias.q_feat if q_slice is None else bias.q_feat[:, :, q_slice]
        return bias.fn(qf, bias.k_feat)
    raise TypeError(f"unknown bias description {type(bias).__name__}")


def attention_reference(q: Tensor, k: Tensor, v: Tensor, bias: Bias | None = None, dropout_p: float = 0.0) -> Tensor:
    """Plain materialized softmax(q k^T / sqrt(d_h) + bias + causal mask) v. The tests' ground truth."""
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    k, v = _expand_kv(k, H), _expand_kv(v, H)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
    if bias is not None:
        scores = scores + bias_block(bias).to(scores.dtype)
    i = torch.arange(Tq, device=q.device).unsqueeze(-1) + (Tk - Tq)
    j = torch.arange(Tk, device=q.device)
    scores = scores.masked_fill(j > i, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    if dropout_p:
        weights = torch.dropout(weights, dropout_p, train=True)
    return weights @ v


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Bias | None = None, dropout_p: float = 0.0) -> Tensor:
    """Causal attention (see module docstring); dropout_p applies to the attention weights."""
    return attention_reference(q, k, v, bias, dropout_p)
