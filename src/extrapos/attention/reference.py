"""The plain materialized attention every kernel is tested against (in fp64 it is the ground truth),
and a bias description expanded to its (queries, keys) block."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from extrapos.attention.common import expand_kv, softmax_dtype
from extrapos.attention.mask import check_window
from extrapos.positions.base import Bias, FoldedBias, LogitBias, PairwiseBias


def bias_block(bias: Bias, q_slice: slice | None = None) -> Tensor:
    """Materialize the bias for a block of queries: (B, H or 1, tq, Tk)."""
    if isinstance(bias, FoldedBias):
        qf = bias.q_feat if q_slice is None else bias.q_feat[:, :, q_slice]
        return qf.unsqueeze(-1) * bias.k_feat.unsqueeze(-2)
    if isinstance(bias, PairwiseBias):
        qf = bias.q_feat if q_slice is None else bias.q_feat[:, :, q_slice]
        return bias.fn(qf, bias.k_feat)
    if isinstance(bias, LogitBias):
        raise TypeError("a LogitBias depends on the attention logits; use attention_reference or attention")
    raise TypeError(f"unknown bias description {type(bias).__name__}")


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None = None,
    dropout_p: float = 0.0,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Plain materialized softmax(q k^T / sqrt(d_h) + bias (+ causal, window and document masks)) v. The
    tests' ground truth: its mask is written out from the definition here, not taken from mask.py, so a
    fault in the kernels' mask shows as a difference."""
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    check_window(window, causal)
    k, v = expand_kv(k, H), expand_kv(v, H)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
    i = torch.arange(Tq, device=q.device).unsqueeze(-1) + (Tk - Tq)
    j = torch.arange(Tk, device=q.device)
    visible = (j <= i) if causal else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
    if window is not None:
        visible = visible & (j > i - window)
    if documents is not None:
        visible = visible & (documents[:, Tk - Tq :, None] == documents[:, None, :]).unsqueeze(1)
    if isinstance(bias, LogitBias):
        scores = scores + bias.fn(scores, q, bias.q_feat, bias.k_feat, visible).to(scores.dtype)
    elif bias is not None:
        scores = scores + bias_block(bias).to(scores.dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores.to(softmax_dtype(scores.dtype)), dim=-1).to(v.dtype)
    if dropout_p:
        weights = torch.dropout(weights, dropout_p, train=True)
    return weights @ v
