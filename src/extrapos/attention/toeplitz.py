"""A ``DistanceBias`` (Kerple, T5, FIRE before L: positions/bias.py) block from its table of O(T)
values instead of one call per (query, key) pair: Toeplitz windows of one vector when positions step
by one, a gather when they are only sorted."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def distance_block(
    table: Callable, qf: Tensor, kf: Tensor, offset: int, dtype: torch.dtype, reversed_rows: bool = False
) -> tuple[Tensor | None, bool]:
    """The bias of a ``DistanceBias`` block from its table, the causal mask included (-inf), or None;
    and whether its rows run in reverse query order.

    qf (B, 1, tq, 1) / kf (B, 1, Tk, 1) are positions; the block's queries are keys offset..offset+tq-1.
    Contiguous positions (every row p_j = p_0 + j, the common case): bias[i, j] = g(offset + i - j)
    is a Toeplitz matrix, the same for every row of the batch: windows of one vector u of
    tq + Tk - 1 values, u[m] = g(offset + tq - 1 - m). Window r is the row of query tq - 1 - r, so
    with ``reversed_rows`` the block is a zero-copy strided view (1, H, tq, Tk) whose rows run in
    reverse query order (the caller flips the queries); otherwise the rows are flipped into a
    (1, H, tq, Tk) copy, B times smaller than the scores (its gradient sums the windows back).
    Sorted positions (segments, random positions): d = p_i - p_j >= 0 on the visible keys, gathered
    from the table ((B, H, tq, Tk)). Anything else, or a table that does not cover the block
    (FIRE past L): None, and the caller evaluates ``fn`` on every pair.
    """
    tq, Tk = qf.shape[2], kf.shape[2]
    if qf.shape[1] != 1 or kf.shape[1] != 1 or qf.shape[-1] != 1:
        return None, False
    kp, qp = kf[:, 0, :, 0], qf[:, 0, :, 0]
    if not torch.equal(qp, kp[:, offset : offset + tq]):
        return None, False
    step = kp[:, 1:] - kp[:, :-1]
    if bool((step == 1).all()):
        windows = toeplitz_block(table, qf, offset, Tk, dtype, reversed_rows=True)
        if windows is None:
            return None, False
        return (windows, True) if reversed_rows else (windows.flip(-2), False)
    if not bool((step >= 0).all()):
        return None, False
    n = int((qp[:, -1] - kp[:, 0]).max().item()) + 1  # the largest visible distance, + 1
    g = table(qf, n)
    if g is None:
        return None, False
    d = qp.unsqueeze(-1) - kp.unsqueeze(-2)  # (B, tq, Tk), >= 0 on the visible keys
    future = torch.arange(Tk, device=qf.device) > torch.arange(tq, device=qf.device).unsqueeze(-1) + offset
    idx = d.clamp(0, n - 1).to(torch.long)
    return g.to(dtype)[:, idx].transpose(0, 1).masked_fill(future, float("-inf")), False


def toeplitz_block(
    table: Callable, qf: Tensor, offset: int, Tk: int, dtype: torch.dtype, reversed_rows: bool = False
) -> Tensor | None:
    """bias[i, j] = g(offset + i - j) (-inf on future keys) as windows of one vector (``distance_block``):
    (1, H, tq, Tk), rows in reverse query order with ``reversed_rows`` (a zero-copy view), else a copy;
    None when the table does not cover the block's queries."""
    tq = qf.shape[2]
    g = table(qf, offset + tq)  # distances 0 .. offset + tq - 1
    if g is None:
        return None
    g = g.to(dtype)
    u = torch.cat([g.flip(-1), g.new_full((g.shape[0], Tk - 1 - offset), float("-inf"))], dim=-1)
    windows = u.unfold(-1, Tk, 1).unsqueeze(0)  # (1, H, tq, Tk), window r = query tq - 1 - r
    return windows if reversed_rows else windows.flip(-2)


def steps_by_one(k_feat: Tensor, q_feat: Tensor, continues_document: Tensor | None) -> bool:
    """Key positions (B, 1, Tk, 1) that step by exactly one between neighbours of the same document
    (``continues_document`` (B, Tk - 1), ``AttentionMask.continues_document``; of the row, when None):
    then p_i - p_j = i - j on every visible pair, and the table's Toeplitz block holds the bias."""
    if k_feat.dim() != 4 or k_feat.shape[1] != 1 or k_feat.shape[-1] != 1 or q_feat.shape[1] != 1:
        return False
    p = k_feat[:, 0, :, 0]
    steps = p[:, 1:] - p[:, :-1] == 1
    if continues_document is None:
        return bool(steps.all())
    return bool((steps | ~continues_document).all())


def contiguous(k_feat: Tensor) -> bool:
    """Key positions (B, 1, Tk, 1) that step by exactly one in every row."""
    p = k_feat[:, 0, :, 0] if k_feat.dim() == 4 and k_feat.shape[1] == 1 and k_feat.shape[-1] == 1 else None
    return p is not None and bool(((p[:, 1:] - p[:, :-1]) == 1).all())
