"""xPos: RoPE with an exponential decay per dimension (Sun et al. 2022, "A length-extrapolatable
transformer", §3.2, eq. for f_q / f_k; blockwise causal attention §3.3).

Each rotated pair i (i = 0 .. d_rot/2 - 1, paired by ``rotate_half`` as in rotary.py) gets

    zeta_i = (2i / d_rot + gamma) / (1 + gamma),  gamma = 0.4,  in (0, 1)

and the query at position n is multiplied by zeta_i^(n / B), the key at position m by
zeta_i^(-m / B) (scale base B = 512), on top of the rotation. The logit of the pair is then
RoPE's times zeta_i^((n - m) / B): it decays with the distance n - m, more for low i (the
high-frequency pairs), which is what stabilises the attention far beyond the training length.

Exponents come from the ``positions`` argument, never from indices, and both factors are fixed
functions of each token's own position, so keys are cached already scaled and cached decoding is
the full forward. The product depends on n - m only (shift invariant); the factors themselves grow
as zeta_0^(-m / B) = 3.5^(m / 512), which overflows fp32 near m = 36k: positions beyond
``max_position`` (32,576 in fp32 / bf16, where the factors reach 2^115; ~850 in fp16) are a
UserError rather than silent infinities. Reference implementations centre the exponent on the middle of the
current sequence instead, which keeps the factors small but makes keys depend on the call they were
computed in, i.e. breaks the KV cache; we keep n and m.

Blockwise causal attention (§3.3, option ``blockwise``): at inference each query attends only the
keys of its own block and of the previous block, blocks of ``block_length`` positions (p //
block_length); by default L_t / 2, so no visible distance exceeds L_t - 1, the range seen in
training. It is a ``PairwiseBias`` of 0 / -inf on position features, so it runs on the chunked
path and works with the KV cache (the cache keeps every key; masked ones get zero weight, so
memory is not reduced). Off by default; turn it on for evaluation with ``set_options``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from extrapos.bounds import MAX_POSITION, Bound
from extrapos.errors import UserError
from extrapos.positions.base import PairwiseBias
from extrapos.positions.bias import feature_dtype
from extrapos.positions.registry import register
from extrapos.positions.rotary import RoPE

#: the factors may reach max / 2^13 of the dtype (2^115 in fp32 / bf16, 2^1011 in fp64): headroom for
#: the values of q and k they multiply and for the sums of products in q.k
_HEADROOM_LOG2 = 13.0


def xpos_zeta(rot_dim: int, gamma: float) -> Tensor:
    """zeta_i = (2i / d_rot + gamma) / (1 + gamma), i = 0 .. d_rot/2 - 1, in fp64."""
    i = torch.arange(rot_dim // 2, dtype=torch.float64)
    return (2 * i / rot_dim + gamma) / (1 + gamma)


class XPos(RoPE):
    """RoPE whose pair i is scaled by zeta_i^(n/B) on queries and zeta_i^(-m/B) on keys (Sun et al. 2022,
    §3.2)."""

    family = "rotary"
    paper = "Sun et al. 2022, A length-extrapolatable transformer (xPos, blockwise causal attention)"
    causal_only = (
        "its factor zeta^((n - m) / B) decays only for keys before the query and grows without bound "
        "for keys after it; use rope for a bidirectional rotary encoding."
    )

    @dataclass(frozen=True)
    class Options(RoPE.Options):
        # zeta = (2i/d + gamma) / (1 + gamma): gamma 0 makes zeta_0 = 0 and its key factor infinite
        BOUNDS: ClassVar[dict[str, Bound]] = {
            **RoPE.Options.BOUNDS,
            "scale_base": Bound(0, 1e9, low_open=True),
            "gamma": Bound(0, 1e3, low_open=True),
            "block_length": Bound(1, MAX_POSITION),
        }
        scale_base: float = 512.0
        gamma: float = 0.4
        blockwise: bool = False  # blockwise causal attention (an inference-time option in the paper)
        block_length: int | None = None  # None: L_t // 2

    options: Options
    # the last forward's (positions, their version, dtype, up, down) decays, as RoPE's cos/sin memo
    _decay_memo: tuple[Tensor, int | None, torch.dtype, Tensor, Tensor] | None

    def options_changed(self) -> None:
        super().options_changed()
        o = self.options
        if o.scale_base <= 0 or o.gamma <= 0:
            raise UserError(f"xpos needs scale_base > 0 and gamma > 0, got {o.scale_base} and {o.gamma}.")
        if o.block_length is not None and o.block_length < 1:
            raise UserError(
                f"xpos option block_length must be a positive number of positions, got {o.block_length}."
            )
        self.log_zeta = xpos_zeta(self.rot_dim, o.gamma).log()
        self._decay_memo = None

    @property
    def block_length(self) -> int:
        return self.options.block_length or max(1, self.ctx.train_length // 2)

    def max_position(self, dtype: torch.dtype) -> int:
        """The largest |position| whose scale factors stay within 2^(+-115) in fp32 / bf16 (see
        _HEADROOM_LOG2)."""
        top = math.log2(torch.finfo(dtype).max) - _HEADROOM_LOG2
        return int(top * math.log(2) * self.options.scale_base / -float(self.log_zeta.min()))

    def decay(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """zeta^(n / B) as (B, 1, T, d_rot) in dtype (keys use its reciprocal)."""
        limit = self.max_position(dtype)
        if positions.numel() and int(positions.abs().max()) > limit:
            raise UserError(
                f"xpos cannot scale positions beyond {limit} in {dtype} (its key factors "
                f"zeta^(-m/{self.options.scale_base:g}) overflow); use shorter sequences or a larger "
                "scale_base."
            )
        work = torch.float64 if dtype == torch.float64 else torch.float32
        power = positions.to(work).unsqueeze(-1) / self.options.scale_base
        log_scale = power * self.log_zeta.to(device=positions.device, dtype=work)
        return torch.cat((log_scale, log_scale), dim=-1).unsqueeze(1).exp()

    # ---- hooks -----------------------------------------------------------------------------
    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        self._decay_memo = None
        return super().embed(h, positions)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        q, k = super().rotate(q, k, positions)
        version = None if positions.is_inference() else positions._version
        memo = self._decay_memo
        if memo is not None and memo[0] is positions and memo[1] == version and memo[2] == q.dtype:
            up, down = memo[3], memo[4]
        else:
            scale = self.decay(positions, q.dtype)
            up, down = scale.to(q.dtype), scale.reciprocal().to(q.dtype)
            self._decay_memo = (positions, version, q.dtype, up, down)
        return self._scale(q, up), self._scale(k, down)

    def _scale(self, x: Tensor, s: Tensor) -> Tensor:
        r = self.rot_dim
        if r == x.shape[-1]:
            return x * s
        return torch.cat((x[..., :r] * s, x[..., r:]), dim=-1)

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias | None:
        if not self.options.blockwise:
            return None
        p = positions.to(feature_dtype(x))[:, None, :, None]
        length = float(self.block_length)

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            # key j is visible from query i if block(j) >= block(i) - 1 (the causal mask does the rest)
            qb = torch.div(qf, length, rounding_mode="floor")
            kb = torch.div(kf, length, rounding_mode="floor").transpose(-1, -2)
            return torch.zeros_like(qb - kb).masked_fill(kb < qb - 1, float("-inf"))

        return PairwiseBias(q_feat=p, k_feat=p, fn=fn)


register(
    "xpos",
    XPos,
    "xPos: RoPE with a per-pair exponential decay zeta^((n-m)/512); blockwise causal attention as an option",
)
