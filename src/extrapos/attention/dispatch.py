"""``attention``: the one entry the model calls; it picks the kernel for the bias and the mask
(package docstring, docs/attention.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from extrapos.attention.chunked import chunked_attention
from extrapos.attention.common import check_shapes
from extrapos.attention.flex import flex_or_none, flex_wanted
from extrapos.attention.fold import folded_attention
from extrapos.attention.mask import AttentionMask, resolve_mask
from extrapos.attention.sdpa import masked_sdpa, sdpa
from extrapos.positions.base import Bias, FoldedBias, LogitBias, PairwiseBias


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None = None,
    dropout_p: float = 0.0,
    *,
    chunk_size: int | None = None,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
    mask: AttentionMask | None = None,
) -> Tensor:
    """Causal (or, ``causal=False``, bidirectional) attention, see the package docstring; dropout_p
    applies to the attention weights; ``documents`` (B, Tk) keeps every query inside its own document;
    ``window`` W (causal only) to its last W keys. ``mask``, the model's ``AttentionMask`` of this
    layer (built once per forward), replaces ``causal`` / ``documents`` / ``window``.

    ``chunk_size`` (queries per block of the pairwise path) defaults to ``CHUNK_ELEMENTS`` worth.
    """
    check_shapes(q, k, v)
    if mask is None:
        mask = AttentionMask.checked(q, k, causal=causal, documents=documents, window=window)
    else:
        mask = resolve_mask(q, k, mask, causal, documents, window)
    grad = torch.is_grad_enabled()
    if flex_wanted(q.device.type, grad, dropout_p, q.shape[2], q.dtype, bias, mask.masked):
        out = flex_or_none(q, k, v, bias, mask)
        if out is not None:
            return out
    if bias is None:
        if mask.masked:
            return masked_sdpa(q, k, v, dropout_p, mask)
        return sdpa(q, k, v, dropout_p, causal=mask.causal)
    if isinstance(bias, FoldedBias):
        return folded_attention(q, k, v, bias, dropout_p, mask=mask)
    if isinstance(bias, (PairwiseBias, LogitBias)):
        return chunked_attention(q, k, v, bias, dropout_p, chunk_size=chunk_size, mask=mask)
    raise TypeError(f"unknown bias description {type(bias).__name__}")
