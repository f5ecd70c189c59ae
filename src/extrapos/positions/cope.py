"""CoPE: contextual position encoding (Golovneva et al. 2024, "Contextual position encoding:
learning to count what's important", §3).

Positions are counted by the content instead of by tokens. For query i and key j <= i:

    g_ij = sigmoid(q_i . k_j / sqrt(d_h))          gates (the paper writes q_i . k_j; the authors'
                                                    code gates the scaled logits, as here)
    p_ij = sum_{t=j..i} g_it                        a fractional "position" of j seen from i:
                                                    the reversed cumulative sum of the gates
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]   interpolated embeddings,
                                                    p clamped to npos_max - 1
    logit_ij = q_i . k_j / sqrt(d_h) + q_i . e[p_ij]

e is a learned (d_h, npos_max) table per layer, shared by the heads, initialised to zeros as the
authors' code (an untrained CoPE model is NoPE). q_i . e[p] is computed as the interpolation of
the row (q_i . e[0], ..., q_i . e[npos_max - 1]), i.e. one (tq, npos_max) matmul per block.

p_ij depends on q_i . k_t for every key t between j and i, so the bias is neither rank one nor a
function of per-token features: it is a ``LogitBias``, evaluated by ``attention/chunked.py`` one block of
queries at a time from the block's logits. Cached decoding needs no state (the cached keys give
each new query its whole row). CoPE never reads the ``positions`` argument: it is shift invariant
and segmented / random-position training does not change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from extrapos.bounds import Bound, CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, LogitBias, PositionalEncoding
from extrapos.positions.registry import register


def cope_bias(scores: Tensor, q: Tensor, table: Tensor, visible: Tensor) -> Tensor:
    """q_i . e[p_ij] for one block: scores (B, H, tq, Tk) unmasked logits, q (B, H, tq, d_h),
    table e (d_h, npos_max), visible (tq, Tk). Returns (B, H, tq, Tk) in scores' dtype."""
    npos = table.shape[-1]
    gates = torch.sigmoid(scores).masked_fill(~visible, 0.0)  # future keys count nothing
    p = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=npos - 1)  # sum_{t=j..i} g_it
    floor = p.floor()
    w = p - floor
    rows = q.to(scores.dtype) @ table.to(scores.dtype)  # q_i . e[n] for n < npos_max: (B, H, tq, npos)
    lo = rows.gather(-1, floor.long())
    hi = rows.gather(-1, p.ceil().long())
    return hi * w + lo * (1 - w)


class CoPE(PositionalEncoding):
    """Contextual positions p_ij = sum_{t=j..i} sigmoid(q_i.k_t), logit += q_i.e[p_ij] (Golovneva et al.
    2024, §3)."""

    family = "contextual"
    paper = "Golovneva et al. 2024, Contextual position encoding: learning to count what's important (CoPE)"
    causal_only = (
        "its positions count the gated keys from the key up to the query in one direction, and the "
        "paper defines no count over keys after the query; use rope, alibi, cable or another encoding."
    )

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {"npos_max": Bound(2, 65536), "init_std": Bound(0, 10)}
        npos_max: int = 64  # rows of the position table; contextual positions are clamped below it
        init_std: float = 0.0  # 0: zeros, as the authors' code

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        if self.options.npos_max < 2:
            raise UserError(f"cope option npos_max must be at least 2, got {self.options.npos_max}.")
        self.table = nn.Parameter(torch.zeros(ctx.n_layers, ctx.head_dim, self.options.npos_max))
        if self.options.init_std > 0:
            nn.init.normal_(self.table, std=self.options.init_std)

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> LogitBias:
        table = self.table[layer]

        def fn(scores: Tensor, q: Tensor, qf: Tensor, kf: Tensor, visible: Tensor) -> Tensor:
            return cope_bias(scores, q, table, visible)

        B, T = positions.shape
        none = x.new_zeros(B, 1, T, 0)  # CoPE has no per-token features: the logits are enough
        return LogitBias(q_feat=none, k_feat=none, fn=fn)


register(
    "cope",
    CoPE,
    "CoPE: contextual positions (reversed cumsum of sigmoid(q.k) gates), interpolated table (chunked)",
)
