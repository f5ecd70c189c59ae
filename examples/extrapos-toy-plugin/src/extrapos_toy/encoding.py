"""toy-log-bias: a learned per-head log-distance bias, -softplus(a_h) log(1 + |i - j|), written against
extrapos' public encoding API exactly as a built-in file of ``extrapos/positions/`` would be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extrapos.bounds import Bound, CheckedOptions
from extrapos.positions import EncodingContext, PairwiseBias, PositionalEncoding, register


class ToyLogBias(PositionalEncoding):
    family = "bias"
    paper = "an example plug-in (examples/extrapos-toy-plugin)"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        init: float = 0.5  # a_h at initialisation: slope softplus(0.5) = 0.97
        BOUNDS: ClassVar[dict[str, Bound]] = {"init": Bound(-10, 10, why="softplus saturates past it")}

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        self.a = nn.Parameter(torch.full((ctx.n_heads,), float(self.options.init)))

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        p = positions.to(dtype)[:, None, :, None]  # (B, 1, T, 1): one feature, shared by the heads
        slope = F.softplus(self.a.to(dtype))

        def fn(qf: Tensor, kf: Tensor) -> Tensor:  # a block of queries x all keys -> (B, H, tq, Tk)
            return -slope[None, :, None, None] * torch.log1p((qf - kf.transpose(-1, -2)).abs())

        def pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:  # one pair: FlexAttention on CUDA
            return -slope[h] * torch.log1p((qi[0] - kj[0]).abs())

        return PairwiseBias(q_feat=p, k_feat=p, fn=fn, pair=pair)


register("toy-log-bias", ToyLogBias, "example plug-in: -softplus(a_h) log(1 + |i - j|), learned per head")
