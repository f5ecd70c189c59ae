"""Attention without a bias: PyTorch's fused scaled-dot-product kernel, whole or block by block under a
document mask or sliding window. The fold (fold.py) runs through ``sdpa`` as well."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from extrapos.attention.mask import AttentionMask, causal_mask


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    scale: float | None = None,
    causal: bool = True,
    mask: Tensor | None = None,
) -> Tensor:
    """Fused SDPA, causal with bottom-right alignment (or unmasked), or with an explicit boolean ``mask``
    (True = visible) instead; GQA without copying k/v."""
    Tq, Tk = q.shape[2], k.shape[2]
    kwargs: dict[str, Any] = {"dropout_p": dropout_p, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
    if Tq == 1:  # the one new token sees every key
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(Tq, Tk, q.device), **kwargs)


def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, mask: AttentionMask) -> Tensor:
    """Fused SDPA under a document mask and / or a sliding window, block by block (``mask.blocks``)."""
    outs = []
    for q0, q1, k0, k1 in mask.blocks():
        visible = None  # one query of a window alone: its keys are exactly k0..k1, nothing to mask
        if mask.documents is not None or q1 - q0 > 1:
            visible = mask.visible((q0, q1), (k0, k1), q.device)
        outs.append(
            sdpa(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], dropout_p, causal=mask.causal, mask=visible)
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
