"""Absolute encodings added once to the token embeddings: none, sinusoidal, learned (+ interpolation).

* ``nope``: no positional information at all (causal attention still leaks some, Haviv et al. 2022).
* ``sinusoidal`` (Vaswani et al. 2017): p[n, 2t] = sin(n / 10000^(2t/d)), p[n, 2t+1] = cos(...),
  added to the token embeddings multiplied by sqrt(d_model) (§3.4; option ``scale_embeddings``).
* ``learned``: a trainable table of ``max_length`` vectors (default L_t). Longer inputs need the
  table extended by linear interpolation (segmented-sequences §3.2), either on the fly
  (option ``interpolate_to``, no retraining) or permanently (``extend_table``, for extension training).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from extrapos.bounds import BASE_WHY, MAX_POSITION, Bound, CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, PositionalEncoding
from extrapos.positions.registry import register


class NoPE(PositionalEncoding):
    """No positional encoding: every hook is the identity."""

    family = "none"
    paper = (
        "Haviv et al. 2022, Transformer LMs without positional encodings still learn positional information"
    )


class Sinusoidal(PositionalEncoding):
    """Fixed sine/cosine table added once to the embeddings (Vaswani et al. 2017, §3.5).

    ``scale_embeddings`` (default True) multiplies the token embeddings by sqrt(d_model) before the
    sines are added, as Vaswani et al. 2017 §3.4 do and as fairseq (``embed_scale``) and Hugging Face
    (``scale_embedding``) sinusoidal models do: without it, unit-amplitude sines swamp embeddings drawn
    with std 0.02 (about 35 times larger) and the baseline loses most of its token signal at the
    input. False keeps the plain sum h + p of earlier extrapos versions, for runs trained with it.
    """

    family = "absolute"
    paper = "Vaswani et al. 2017, Attention is all you need"

    @classmethod
    def acts_on_embeddings(cls, options: CheckedOptions) -> bool:
        return True

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {"base": Bound(2, 1e10, why=BASE_WHY)}
        base: float = 10000.0
        scale_embeddings: bool = True  # h * sqrt(d_model) + p (§3.4); False: h + p

    options: Options

    # A checkpoint saved since the option existed holds this marker; one without it was trained with the
    # plain sum h + p, so loading it switches the scale off (an older run evaluates as it was trained).
    MARKER = "scale_option_marker"

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        self.register_buffer(self.MARKER, torch.ones(()))

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        *args: Any,
    ) -> None:
        key = prefix + self.MARKER
        older = key not in state_dict
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)
        if older:
            if key in missing_keys:
                missing_keys.remove(key)
            self.options = dataclasses.replace(self.options, scale_embeddings=False)

    def table(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """p[n, 2t] = sin(n / base^(2t/d)), p[n, 2t+1] = cos(n / base^(2t/d)); (B, T, d) in dtype."""
        d = self.ctx.d_model
        inv_freq = self.options.base ** (
            -torch.arange(0, d, 2, device=positions.device, dtype=torch.float64) / d
        )
        angles = positions.to(dtype).unsqueeze(-1) * inv_freq.to(dtype)  # (B, T, ceil(d/2))
        p = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # interleave sin, cos
        return p[..., :d]

    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        # fp32 at least: angles of long positions need the precision even under bf16 autocast
        p = self.table(positions, torch.float64 if h.dtype == torch.float64 else torch.float32)
        if self.options.scale_embeddings:
            h = h * math.sqrt(self.ctx.d_model)
        return h + p.to(h.dtype)


def interpolation_weights(
    positions: Tensor, old_length: int, new_length: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Rows and weights of segmented-sequences §3.2 linear interpolation from old_length to new_length rows.

    e'_i = ((beta - i % beta) / beta) e_{floor(i/beta)} + ((i % beta) / beta) e_{floor(i/beta)+1}, beta =
    L_e / L_t,
    with rows past the last original one (i > beta (L_t - 1)) set to the last row.

    Computed as the fractional row u = i * L_t / L_e in exact integer arithmetic: lo = (i L_t) // L_e and
    frac = ((i L_t) % L_e) / L_e. For integral beta this is exactly the paper's formula; for a
    non-integral beta it is the same linear interpolation at u = i / beta (the natural extension: the
    paper only states the integral case). Returns (lo, hi, frac) with hi = min(lo + 1, L_t - 1) and
    frac zeroed where lo is the last row.
    """
    num = positions.long() * old_length
    lo = torch.div(num, new_length, rounding_mode="floor")
    frac = (num - lo * new_length).to(torch.float64) / new_length
    last = old_length - 1
    past = lo >= last
    lo = lo.clamp(max=last)
    hi = (lo + 1).clamp(max=last)
    frac = frac.masked_fill(past, 0.0)
    return lo, hi, frac


class LearnedAbsolute(PositionalEncoding):
    """A trainable table of position vectors added once to the embeddings (GPT-2, BERT)."""

    family = "absolute"
    paper = "Radford et al. 2019 (GPT-2); interpolation: Karypis et al., segmented sequences §3.2"

    @classmethod
    def acts_on_embeddings(cls, options: CheckedOptions) -> bool:
        return True

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {
            "max_length": Bound(1, MAX_POSITION),
            "interpolate_to": Bound(1, MAX_POSITION),
            "init_std": Bound(0, 10),
        }
        max_length: int | None = None  # rows of the table; None: L_t
        interpolate_to: int | None = None  # L_e: read the table linearly interpolated to this length
        init_std: float = 0.02

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        length = self.options.max_length or ctx.train_length
        self.table = nn.Parameter(torch.randn(length, ctx.d_model) * self.options.init_std)
        self.options_changed()

    @property
    def length(self) -> int:
        return self.table.shape[0]

    def options_changed(self) -> None:
        target = self.options.interpolate_to
        if target is not None and target < self.length:
            raise UserError(
                f"interpolate_to={target} is shorter than the learned position table ({self.length} rows); "
                f"give --position-option interpolate_to={self.length} or more, or pass --interpolate, which "
                "stretches the table only to windows longer than it."
            )

    def interpolated(self, new_length: int) -> Tensor:
        """The whole table interpolated to new_length rows (new_length, d); differentiable."""
        idx = torch.arange(new_length, device=self.table.device)
        return self._rows(idx, new_length)

    def _rows(self, positions: Tensor, new_length: int) -> Tensor:
        lo, hi, frac = interpolation_weights(positions, self.length, new_length)
        frac = frac.to(self.table.dtype).unsqueeze(-1)
        return self.table[lo] * (1 - frac) + self.table[hi] * frac

    @torch.no_grad()
    def extend_table(self, new_length: int) -> None:
        """Permanently replace the table by its interpolation to new_length rows (for extension training).

        The parameter object changes: build the optimizer after calling this.
        """
        if new_length < self.length:
            raise UserError(
                f"cannot shrink the learned position table from {self.length} to {new_length} rows."
            )
        new = self.interpolated(new_length).detach().clone()
        self.table = nn.Parameter(new)
        self.options = dataclasses.replace(self.options, max_length=new_length, interpolate_to=None)

    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        limit = self.options.interpolate_to or self.length
        if positions.numel():
            hi, lo = int(positions.max()), int(positions.min())
            if lo < 0:
                raise UserError("learned absolute positions must be non-negative.")
            if hi >= limit:
                raise UserError(
                    f"position {hi} is beyond the learned position table ({limit} positions); pass "
                    "--interpolate to stretch the table to each longer window (or --position-option "
                    f"interpolate_to={max(2 * self.length, hi + 1)}), or train a longer table with "
                    "extrapos extend RUN --factor K."
                )
        if self.options.interpolate_to is None or self.options.interpolate_to == self.length:
            p = self.table[positions]
        else:
            p = self._rows(positions, self.options.interpolate_to)
        return h + p.to(h.dtype)


register("nope", NoPE, "no positional encoding")
register("sinusoidal", Sinusoidal, "fixed sine/cosine vectors added once to the embeddings")
register(
    "learned", LearnedAbsolute, "trainable absolute table added once; linear interpolation to longer lengths"
)
