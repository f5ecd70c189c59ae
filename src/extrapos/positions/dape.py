"""DAPE: data-adaptive positional encoding (Zheng et al. 2024, "DAPE: Data-Adaptive Positional
Encoding for Length Extrapolation", §3).

A static relative bias B (Kerple by default) is corrected by an MLP that also sees the attention
logits A = q.k / sqrt(d_h) of the same (query, key) pair:

    logit_ij = A_ij + B_ij + f(A_ij, B_ij)

f acts on every pair (i, j) separately; its input is the 2h values [A_ij of every head, B_ij of
every head] and its output one value per head: Linear(2h, width) -> LeakyReLU -> Linear(width, h),
width 32, one MLP per layer (the paper's D_DAPE; the authors' code mixes the heads this way).
The MLP keeps PyTorch's default Linear init, as the authors' code.

The MLP needs the logits, so the bias is a ``LogitBias``: ``attention/chunked.py`` evaluates it one block of
queries at a time (the MLP's hidden layer holds width / h score blocks, like FIRE's). The base
bias is any query-chunked relative encoding of the registry (``base``: kerple-log, kerple-power,
t5, fire) with its own parameters and default options; its true values (not rank-one foldings,
which drop row constants the MLP would see) are fed to the MLP. Its features are positions, which
the KV cache concatenates, so cached decoding needs no state. Shift invariant when the base is.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import ClassVar, Literal, cast

import torch
from torch import Tensor, nn

from extrapos.bounds import Bound, CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, LogitBias, PairwiseBias, PositionalEncoding
from extrapos.positions.registry import build_encoding, register

#: the static biases B that DAPE corrects (each query-chunked)
Base = Literal["kerple-log", "kerple-power", "t5", "fire"]
BASES = typing.get_args(Base)


class DAPE(PositionalEncoding):
    """logit += B + MLP([A, B]) per (i, j) over the heads (Zheng et al. 2024, §3); B = Kerple by default."""

    family = "dape"
    paper = "Zheng et al. 2024, DAPE: Data-Adaptive Positional Encoding for Length Extrapolation"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {"mlp_width": Bound(1, 4096)}
        base: Base = "kerple-log"  # the static bias B
        mlp_width: int = 32

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        o, h = self.options, ctx.n_heads
        if o.base not in BASES:
            raise UserError(f"dape option base must be one of {', '.join(BASES)}, got {o.base!r}.")
        if o.mlp_width < 1:
            raise UserError(f"dape option mlp_width must be a positive integer, got {o.mlp_width}.")
        self.base = build_encoding(o.base, ctx)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(2 * h, o.mlp_width), nn.LeakyReLU(), nn.Linear(o.mlp_width, h))
            for _ in range(ctx.n_layers)
        )

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> LogitBias:
        base = self.base.bias(x, positions, layer, None)
        assert isinstance(base, PairwiseBias)  # every name of BASES is query-chunked
        mlp, base_fn = cast(nn.Sequential, self.mlps[layer]), base.fn
        first = cast(nn.Linear, mlp[0])

        def fn(scores: Tensor, q: Tensor, qf: Tensor, kf: Tensor, visible: Tensor) -> Tensor:
            b = base_fn(qf, kf).to(scores.dtype).expand_as(scores)  # (B, H, tq, Tk)
            pairs = torch.cat((scores, b), dim=1).permute(0, 2, 3, 1)  # (B, tq, Tk, 2H)
            correction = mlp(pairs.to(first.weight.dtype)).permute(0, 3, 1, 2)
            return b + correction.to(scores.dtype)

        return LogitBias(q_feat=base.q_feat, k_feat=base.k_feat, fn=fn)


register("dape", DAPE, "DAPE: Kerple bias + per-pair MLP over all heads' [logit, bias] (chunked)")
