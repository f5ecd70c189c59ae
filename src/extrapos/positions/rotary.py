"""RoPE (Su et al. 2021) and its context-extension scalings, as Hugging Face names them.

Rotation: the first ``d_rot = rotary_fraction * d_h`` dims of each query/key head (rounded down to
an even number) are split into halves (x1, x2) and rotated pairwise, (x1_i, x2_i) -> angle
n * inv_freq_i, with ``rotate_half`` pairing as in Llama / Hugging Face; the rest pass through.
inv_freq_i = base^(-2i / d_rot).

Scalings (``scaling`` option, with ``factor`` s and ``original_length`` L, default L_t):

* ``linear`` (position interpolation, Chen et al. 2023): angle n / s, i.e. inv_freq / s.
* ``ntk`` (NTK-aware): base' = base * s^(d_rot / (d_rot - 2)).
* ``dynamic`` (dynamic NTK): with T = max position + 1 of the current call, when T > L,
  base' = base * (s T / L - (s - 1))^(d_rot / (d_rot - 2)); otherwise plain RoPE. With a KV cache the
  keys keep the frequencies they were rotated with (as in Hugging Face), so cached decoding past L
  differs slightly from one full forward.
* ``yarn`` (Peng et al. 2023): per-frequency blend of interpolation (inv_freq / s) and extrapolation
  (inv_freq) by a linear ramp over the dims between the correction dims of beta_fast = 32 and
  beta_slow = 1 rotations within L (floor/ceil as in the reference code); plus the attention factor
  m = 0.1 ln(s) + 1: q and k are each multiplied by m, so the logits by m^2 = 1/t, the paper's
  temperature (Hugging Face does the same by scaling cos and sin). With ``rotary_fraction`` < 1 we
  scale the whole head (the paper's temperature is on the whole logit; Hugging Face scales only the
  rotated part).
* ``llama3`` (the Llama 3.1 scaling, Dubey et al. 2024): wavelengths 2 pi / inv_freq shorter than
  L / ``high_freq_factor`` are kept, longer than L / ``low_freq_factor`` are divided by s, and those
  between are blended with weight (L / wavelength - low) / (high - low) on the original frequency.
* ``longrope`` (Ding et al. 2024, LongRoPE, §3; as shipped with Phi-3, Abdin et al. 2024): one
  rescale factor per frequency, inv_freq_i / lambda_i, with ``long_factor`` lambda when the current
  call reaches past L (T = max position + 1 > L, like ``dynamic``) and ``short_factor`` otherwise;
  attention factor sqrt(1 + ln s / ln L) (s > 1) on q and k like YaRN's.

``attention_factor`` (option) replaces the default factor of yarn / longrope (e.g. an imported
checkpoint's own value).

Angles are computed in fp32 (fp64 for fp64 inputs) and cos/sin cast to q's dtype.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from extrapos.bounds import BASE_WHY, MAX_POSITION, Bound, BoundError, CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, PositionalEncoding
from extrapos.positions.registry import register

#: the scalings by name (an Options field of this type is refused when built, schema / bounds.choices)
Scaling = Literal["linear", "ntk", "dynamic", "yarn", "llama3", "longrope"]
SCALINGS = (None, *typing.get_args(Scaling))


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def default_inv_freq(base: float, dim: int) -> Tensor:
    """inv_freq_i = base^(-2i/dim), i = 0 .. dim/2 - 1, in fp64."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def yarn_correction_range(
    beta_fast: float, beta_slow: float, dim: int, base: float, length: int
) -> tuple[int, int]:
    """Dims [low, high] between which YaRN's ramp runs (reference code: floor / ceil, clamped).

    The dim index whose wavelength fits ``r`` rotations in ``length`` positions solves
    length / (2 pi base^(2i/dim)) = r, i.e. i = dim ln(length / (2 pi r)) / (2 ln base).
    """

    def dim_for(rotations: float) -> float:
        return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(dim_for(beta_fast))
    high = math.ceil(dim_for(beta_slow))
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(
    base: float, dim: int, factor: float, length: int, beta_fast: float = 32.0, beta_slow: float = 1.0
) -> Tensor:
    """YaRN's blended inverse frequencies (fp64)."""
    extrapolation = default_inv_freq(base, dim)
    interpolation = extrapolation / factor
    low, high = yarn_correction_range(beta_fast, beta_slow, dim, base, length)
    top: float = high + 0.001 if low == high else high  # a single-dim ramp: avoid dividing by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (top - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: high frequency, extrapolated as is; 0: low frequency, interpolated
    return interpolation * (1 - keep) + extrapolation * keep


def llama3_inv_freq(
    base: float,
    dim: int,
    factor: float,
    length: int,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> Tensor:
    """Llama 3.1's piecewise scaling of the inverse frequencies (fp64), see the module docstring."""
    inv_freq = default_inv_freq(base, dim)
    wavelength = 2 * math.pi / inv_freq
    low_wavelength, high_wavelength = length / low_freq_factor, length / high_freq_factor
    scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (length / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(medium, blended, scaled)


def longrope_attention_factor(factor: float, length: int) -> float:
    """sqrt(1 + ln s / ln L) for s > 1, else 1 (LongRoPE / Phi-3's default)."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(length))


def _no_attention_factor(o: Any, length: int) -> float:
    return 1.0


@dataclass(frozen=True)
class RopeScaling:
    """One scaling by its parts, as Hugging Face keeps ROPE_INIT_FUNCTIONS: ``inv_freq(options, d_rot, L,
    T)`` the inverse frequencies in fp64 (T: the current call's longest position + 1, or None), the
    default ``attention_factor(options, L)`` multiplying q and k, whether the ``attention_factor`` option
    may replace that default, and whether the frequencies follow each call's length (``per_call``)."""

    inv_freq: Callable[[Any, int, int, int | None], Tensor]
    attention_factor: Callable[[Any, int], float] = _no_attention_factor
    takes_attention_factor: bool = False
    per_call: bool = False


def _ntk_base(base: float, scale: float, dim: int) -> float:
    return base * scale ** (dim / (dim - 2))


#: every scaling of the ``scaling`` option (None: plain RoPE); the module docstring gives each formula
ROPE_SCALINGS: dict[str | None, RopeScaling] = {
    None: RopeScaling(lambda o, dim, L, T: default_inv_freq(o.base, dim)),
    "linear": RopeScaling(lambda o, dim, L, T: default_inv_freq(o.base, dim) / o.factor),
    "ntk": RopeScaling(lambda o, dim, L, T: default_inv_freq(_ntk_base(o.base, o.factor, dim), dim)),
    "dynamic": RopeScaling(
        lambda o, dim, L, T: default_inv_freq(
            _ntk_base(o.base, o.factor * max(T or L, L) / L - (o.factor - 1), dim), dim
        ),
        per_call=True,
    ),
    "yarn": RopeScaling(
        lambda o, dim, L, T: yarn_inv_freq(o.base, dim, o.factor, L, o.beta_fast, o.beta_slow),
        attention_factor=lambda o, L: 0.1 * math.log(o.factor) + 1.0,
        takes_attention_factor=True,
    ),
    "llama3": RopeScaling(
        lambda o, dim, L, T: llama3_inv_freq(o.base, dim, o.factor, L, o.low_freq_factor, o.high_freq_factor)
    ),
    "longrope": RopeScaling(
        lambda o, dim, L, T: (
            default_inv_freq(o.base, dim)
            / torch.tensor(o.long_factor if T is not None and T > L else o.short_factor, dtype=torch.float64)
        ),
        attention_factor=lambda o, L: longrope_attention_factor(o.factor, L),
        takes_attention_factor=True,
        per_call=True,
    ),
}


class RoPE(PositionalEncoding):
    """Rotary position embedding on q and k (Su et al. 2021), with HF-style scalings."""

    family = "rotary"
    paper = "Su et al. 2021, RoFormer; scalings: Chen et al. 2023 (PI), bloc97 (NTK), Peng et al. 2023 (YaRN)"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        # plausible ranges (docs/robustness.md): a base past 1e10 leaves every frequency below 1e-10 (the
        # longest-context checkpoints use a few 1e9); a factor past 1024 or betas <= 0 mean nothing
        BOUNDS: ClassVar[dict[str, Bound]] = {
            "base": Bound(2, 1e10, why=BASE_WHY),
            "rotary_fraction": Bound(0, 1, low_open=True),
            "factor": Bound(0, 1024, low_open=True),
            "original_length": Bound(1, MAX_POSITION),
            "beta_fast": Bound(0, 1e4, low_open=True),
            "beta_slow": Bound(0, 1e4, low_open=True),
            "low_freq_factor": Bound(0, 1024, low_open=True),
            "high_freq_factor": Bound(0, 1024, low_open=True),
            "attention_factor": Bound(0, 16, low_open=True),
        }
        base: float = 10000.0
        rotary_fraction: float = 1.0
        scaling: Scaling | None = None  # None: plain RoPE
        factor: float = 1.0
        original_length: int | None = None  # L of the scalings; None: L_t
        beta_fast: float = 32.0
        beta_slow: float = 1.0
        low_freq_factor: float = 1.0  # llama3
        high_freq_factor: float = 4.0  # llama3
        long_factor: Any = None  # longrope: d_rot / 2 rescale factors past L
        short_factor: Any = None  # longrope: d_rot / 2 rescale factors within L
        attention_factor: float | None = None  # yarn / longrope: None -> the method's default

        def check(self) -> None:
            if self.scaling is not None and self.factor < 1:
                raise BoundError("factor", f"at least 1 with {self.scaling} scaling", self.factor)
            # YaRN's ramp runs from the dims of beta_fast rotations down to beta_slow (Peng et al. 2023,
            # sec. 3.2): the reverse order divides by zero or inverts the ramp
            if self.scaling == "yarn" and not self.beta_fast > self.beta_slow:
                raise BoundError("beta_fast", f"greater than beta_slow = {self.beta_slow:g}", self.beta_fast)
            if self.scaling == "llama3" and not self.high_freq_factor > self.low_freq_factor:
                raise BoundError(
                    "high_freq_factor",
                    f"greater than low_freq_factor = {self.low_freq_factor:g}",
                    self.high_freq_factor,
                )

    options: Options
    # the last forward's (positions, their version, dtype, cos, sin): every block rotates with them
    _memo: tuple[Tensor, int | None, torch.dtype, Tensor, Tensor] | None

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        self.options_changed()

    # ---- derived quantities ----------------------------------------------------------------
    @property
    def rot_dim(self) -> int:
        return int(self.ctx.head_dim * self.options.rotary_fraction) // 2 * 2

    @property
    def original_length(self) -> int:
        return self.options.original_length or self.ctx.train_length

    def options_changed(self) -> None:
        o = self.options
        if o.scaling not in SCALINGS:
            raise UserError(
                f"unknown RoPE scaling {o.scaling!r}; choose one of: none, linear, ntk, dynamic, yarn, "
                "llama3, longrope."
            )
        if not 0 < o.rotary_fraction <= 1 or self.rot_dim < 2:
            raise UserError(
                f"rotary_fraction={o.rotary_fraction} leaves no pair of dims to rotate in heads of "
                f"{self.ctx.head_dim}; use a value in (0, 1] covering at least 2 dims."
            )
        if o.scaling == "longrope":
            for name in ("long_factor", "short_factor"):
                value = getattr(o, name)
                if (
                    not isinstance(value, (list, tuple))
                    or len(value) != self.rot_dim // 2
                    or not all(isinstance(v, (int, float)) and v > 0 for v in value)
                ):
                    raise UserError(
                        f"longrope scaling needs {name} = a list of {self.rot_dim // 2} positive numbers "
                        f"(one per rotated frequency), got {value!r}."
                    )
        scaling = ROPE_SCALINGS[o.scaling]
        self.inv_freq = self.inverse_frequencies()
        self.attention_factor = scaling.attention_factor(o, self.original_length)
        if o.attention_factor is not None and scaling.takes_attention_factor:
            self.attention_factor = o.attention_factor
        self._memo = None

    def inverse_frequencies(self, seq_len: int | None = None) -> Tensor:
        """inv_freq (fp64, d_rot / 2) for the configured scaling; ``seq_len`` matters for the scalings
        that follow each call's length (dynamic, longrope)."""
        o = self.options
        return ROPE_SCALINGS[o.scaling].inv_freq(o, self.rot_dim, self.original_length, seq_len)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles (B, 1, T, d_rot) in dtype (YaRN's attention factor is applied in
        rotate)."""
        inv_freq = self.inv_freq
        if ROPE_SCALINGS[self.options.scaling].per_call and positions.numel():
            inv_freq = self.inverse_frequencies(int(positions.max()) + 1)
        work = torch.float64 if dtype == torch.float64 else torch.float32
        angles = positions.to(work).unsqueeze(-1) * inv_freq.to(device=positions.device, dtype=work)
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    # ---- hooks -----------------------------------------------------------------------------
    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        self._memo = None  # called once at the start of every forward: forget the last one's cos/sin
        return h

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        if torch.compiler.is_compiling():
            # traced, the memo's identity and version checks would break the graph at every layer (Dynamo
            # cannot trace ``_version``) and recompile each block on its own; the compiled graph computes
            # cos/sin from the same positions once per layer instead, which is cheap beside attention
            cos, sin = self.cos_sin(positions, q.dtype)
            return self._rotate_one(q, cos, sin), self._rotate_one(k, cos, sin)
        # every block calls rotate with the same positions tensor: compute cos/sin once per forward
        version = None if positions.is_inference() else positions._version  # no counter in inference mode
        memo = self._memo
        if memo is not None and memo[0] is positions and memo[1] == version and memo[2] == q.dtype:
            cos, sin = memo[3], memo[4]
        else:
            cos, sin = self.cos_sin(positions, q.dtype)
            self._memo = (positions, version, q.dtype, cos, sin)
        return self._rotate_one(q, cos, sin), self._rotate_one(k, cos, sin)

    def _rotate_one(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        r = self.rot_dim
        if r == x.shape[-1]:
            out = x * cos + rotate_half(x) * sin
        else:
            xr, xp = x[..., :r], x[..., r:]
            out = torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)
        if self.attention_factor != 1.0:
            out = out * self.attention_factor
        return out


register(
    "rope",
    RoPE,
    "rotary embedding of q and k (half-split pairs); linear/ntk/dynamic/yarn/llama3/longrope scalings",
)
