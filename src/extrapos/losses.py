"""The language-modelling loss: masked token cross-entropy, and the same fused with the output head.

``masked_loss_sum(logits, targets, mask)`` is the plain definition (fp32 log-softmax over the whole
(B, T, V) logits). ``linear_cross_entropy_sum(h, weight, targets, mask)`` computes the same sum from
the final hidden states and the head's weight, ``chunk`` rows at a time, and never holds all the
logits: each block's logits are turned into their gradient (softmax minus the one-hot target) while
they are still in cache and the head's two backward matmuls run right away, so backward is a
multiplication by the incoming scalar (the fused linear cross-entropy of Hsu et al. 2024, "Liger
Kernel: efficient Triton kernels for LLM training", §3.2, here in plain torch ops). At d = 128, V = 8192
the full fp32 log-softmax and its
backward are most of a CPU step's non-matmul time (``benchmarks/bench_train.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

#: rows of logits per block: 256 x 8192 fp32 = 8 MB, in cache on common CPUs
CHUNK_ROWS = 256


def masked_loss_sum(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Sum of token cross-entropies over the loss mask, in fp32 (fp64 stays fp64): the definition."""
    logits = logits.to(_loss_dtype(logits.dtype))
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return (losses * mask.flatten()).sum()


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_t mask_t * CE(h_t W^T, y_t); the gradients are computed in forward, block by block."""

    @staticmethod
    def forward(
        ctx: Any,  # torch's autograd context object, which torch.autograd.Function types as Any
        h: Tensor,
        weight: Tensor,
        targets: Tensor,
        mask: Tensor,
        chunk: int,
        grads: bool,
        matmul_dtype: torch.dtype | None = None,
    ) -> Tensor:
        n = h.shape[0]
        need_h, need_w = grads and ctx.needs_input_grad[0], grads and ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        # with matmul_dtype the weight's gradient sums the blocks in fp32 (bf16 weights too: FSDP2's
        # bf16 parameters), rounded to the weight's dtype once at the end
        acc = weight.dtype if matmul_dtype is None else _loss_dtype(weight.dtype)
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        dtype = _loss_dtype(h.dtype)
        total = h.new_zeros((), dtype=dtype)
        rows = torch.arange(min(chunk, n), device=h.device)
        # matmul_dtype (bf16 autocast): the three matmuls in it, as autocast would run the head's linear,
        # the weight cast once; the loss, its gradient and the accumulated gradients stay in h's dtype
        w = weight if matmul_dtype is None else weight.to(matmul_dtype)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            hc, y, m = h[s:e], targets[s:e], mask[s:e].to(dtype)
            if matmul_dtype is not None:
                hc = hc.to(matmul_dtype)
            logits = (hc @ w.t()).to(dtype)  # (c, V)
            lse = torch.logsumexp(logits, dim=-1)
            r = rows[: e - s]
            total += ((lse - logits[r, y]) * m).sum()
            if grad_h is not None or grad_w is not None:
                # d loss / d logits = mask * (softmax - onehot), computed in place on the block
                grad = logits.sub_(lse.unsqueeze(-1)).exp_()
                grad[r, y] -= 1
                grad.mul_(m.unsqueeze(-1))
                grad = grad.to(hc.dtype)
                if matmul_dtype is None:  # the fp32 / fp64 path, into the gradients' own memory
                    if grad_h is not None:
                        torch.mm(grad, weight, out=grad_h[s:e])
                    if grad_w is not None:
                        grad_w.addmm_(grad.t(), hc)
                else:  # the products in matmul_dtype, accumulated in the gradients' dtype
                    if grad_h is not None:
                        grad_h[s:e] = grad @ w
                    if grad_w is not None:
                        grad_w += grad.t() @ hc
        if grad_w is not None and grad_w.dtype != weight.dtype:
            grad_w = grad_w.to(weight.dtype)
        ctx.save_for_backward(grad_h, grad_w)
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        g = grad_out
        return (
            None if grad_h is None else grad_h * g.to(grad_h.dtype),
            None if grad_w is None else grad_w * g.to(grad_w.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy_sum(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    mask: Tensor,
    chunk: int = CHUNK_ROWS,
    matmul_dtype: torch.dtype | None = None,
) -> Tensor:
    """``masked_loss_sum(h @ weight.T, targets, mask)`` without materializing the logits.

    h (..., d), weight (V, d), targets and mask (...), fp32 or fp64. ``matmul_dtype`` (bf16): the head's
    matmuls in it, their logits rounded to it as autocast rounds the head's linear, everything else in
    fp32; call it with autocast off (``model.Decoder.forward`` does, under bf16 autocast on a CPU).
    """
    grads = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)  # none in validation
    return _LinearCrossEntropy.apply(
        h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1), mask.reshape(-1), chunk, grads, matmul_dtype
    )


def model_loss_sum(
    model: Callable[..., Tensor],
    tokens: Tensor,
    positions: Tensor,
    targets: Tensor,
    mask: Tensor,
    fused: bool = True,
    documents: Tensor | None = None,
) -> Tensor:
    """The masked loss sum of a ``Decoder`` (or a DDP / FSDP2 / compiled wrapper of one): its forward
    computes the loss, fused with the head when it can be (``fused``, a decoder, no autocast);
    ``documents``: a packed row's document numbers (document mask), passed only when set."""
    if documents is None:  # the call every wrapper has always seen
        return model(tokens, positions, targets=targets, loss_mask=mask, fused=fused)
    return model(tokens, positions, targets=targets, loss_mask=mask, fused=fused, documents=documents)
