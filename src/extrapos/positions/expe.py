"""ExPE and ExQPE (Datseris et al., ExPE, §2.1, §2.3): override the first l dims of the Q/K inputs with
positions.

In every block, on the normed block input x (the input of the Q and K projections):

    phi(x, n) = (p_n[0], ..., p_n[l-1], x_l, ..., x_{d-1})

Q and K read phi(x, n); V reads x unless ``apply_to_value``; the residual stream is never overridden.

* ExPE (eq. 3): p_n[k] = S + theta (n + k), i.e. (p_n, p_{n+1}, ..., p_{n+l-1}) with p_n = S + theta n.
  theta defaults to 1/(4 L_t): the paper's 1/2048 at L_t = 512 (p spans [0, 0.25] in training).
* ExQPE (eq. 5), closed form: p_n[k] = S + k theta1 + theta2 c_k(n), with c_k(n) = floor((n - k) / l) + 1
  if n >= k else 0 (how many i in [0, n] have i mod l == k): only one of the l dims grows per position,
  so values stay distinct in bf16 where ExPE's stop being so (~16e3 bf16 values in [0, 1]).

``scale`` multiplies every p (the paper's inference-time "scaled by 0.5"). Ablations of Table 7 are
switches: ``stable`` (every dim = p_n), ``l = 1``, ``once`` (override the embedding output once before
the first block, via the embed hook, and never again), ``learned`` (S and theta trainable, random init)
and ``learned_init`` (trainable, initialised to S and theta).

Precision: p is computed in fp32 (fp64 for fp64 inputs) whatever the autocast state, because the
position values are the whole point; the overridden x is then cast to x's dtype, so under bf16 the
Q/K inputs hold bf16-rounded positions, which is exactly the effect ExQPE is designed around.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from extrapos.bounds import Bound, CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, PositionalEncoding
from extrapos.positions.registry import register


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Override(PositionalEncoding):
    """Shared placement: override the first l dims of the Q/K (and optionally V) inputs."""

    family = "expe"
    options: ExPE.Options | ExQPE.Options  # both have l and apply_to_value

    @classmethod
    def acts_on_embeddings(cls, options: CheckedOptions) -> bool:
        return bool(getattr(options, "once", False))

    @property
    def l(self) -> int:  # noqa: E743 - the paper's name
        return self.options.l if self.options.l is not None else max(1, self.ctx.d_model // 8)

    def _check(self) -> None:
        if not 1 <= self.l <= self.ctx.d_model:
            raise UserError(f"option l={self.l} must be between 1 and d_model={self.ctx.d_model}.")

    def values(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """The position vectors p_n (B, T, l) in dtype."""
        raise NotImplementedError

    def override(self, x: Tensor, positions: Tensor) -> Tensor:
        """phi(x, n): x with its first l dims replaced by p_n (in x's dtype)."""
        p = self.values(positions, _work_dtype(x.dtype)).to(x.dtype)
        return torch.cat((p, x[..., self.l :]), dim=-1)

    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        return self.override(h, positions) if getattr(self.options, "once", False) else h

    def attn_input(self, x: Tensor, positions: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        if getattr(self.options, "once", False):
            return x, x
        xq = self.override(x, positions)
        return xq, (xq if self.options.apply_to_value else x)


class ExPE(_Override):
    """Exact positional encoding: p_n[k] = scale * (S + theta (n + k)) (Datseris et al., ExPE, eq. 3)."""

    paper = "Datseris et al., ExPE: Exact Positional Encodings (§2.1; ablations Table 7)"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {
            "S": Bound(-1e3, 1e3),
            "theta": Bound(0, 1e3, low_open=True),
            "l": Bound(1, 65536),
            "scale": Bound(0, 1e3, low_open=True),
        }
        S: float = 0.0
        theta: float | None = None  # None: 1 / (4 L_t), the paper's 1/2048 at L_t = 512
        l: int | None = None  # None: d_model / 8
        scale: float = 1.0  # inference-time: multiplies every p
        apply_to_value: bool = False
        stable: bool = False  # ablation: every dim = p_n
        once: bool = False  # ablation: override the embedding output only, before the first block
        learned: bool = False  # ablation: S, theta trainable, random init
        learned_init: bool = False  # ablation: S, theta trainable, initialised to the defaults

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        o = self.options
        if o.learned and o.learned_init:
            raise UserError(
                "choose one of the ExPE options learned (random init) and learned_init, not both."
            )
        self._check()
        if o.learned:
            # Random init (the paper does not say which): S ~ N(0, 0.02^2) like every other weight, and
            # theta ~ U(0, 2 theta_default), positive with the default's mean, so p still increases with n.
            self.S = nn.Parameter(torch.randn(()) * 0.02)
            self.theta = nn.Parameter(torch.rand(()) * 2 * self.default_theta)
        elif o.learned_init:
            self.S = nn.Parameter(torch.tensor(float(o.S)))
            self.theta = nn.Parameter(torch.tensor(self.default_theta))

    @property
    def default_theta(self) -> float:
        return self.options.theta if self.options.theta is not None else 1.0 / (4 * self.ctx.train_length)

    def options_changed(self) -> None:
        self._check()

    def values(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        o = self.options
        if o.stable:
            n = positions.unsqueeze(-1).expand(*positions.shape, self.l)
        else:
            n = positions.unsqueeze(-1) + torch.arange(self.l, device=positions.device)
        n = n.to(dtype)  # integers: exact in fp32 up to 2^24
        if o.learned or o.learned_init:
            p = self.S.to(dtype) + self.theta.to(dtype) * n
        else:
            p = o.S + self.default_theta * n
        return p * o.scale if o.scale != 1.0 else p


def exqpe_counts(positions: Tensor, l: int) -> Tensor:
    """c_k(n) = floor((n - k) / l) + 1 if n >= k else 0, the number of i in [0, n] with i mod l == k; (B, T,
    l)."""
    nk = positions.unsqueeze(-1) - torch.arange(l, device=positions.device)
    return torch.where(nk >= 0, torch.div(nk, l, rounding_mode="floor") + 1, torch.zeros_like(nk))


class ExQPE(_Override):
    """Exact quantizable positional encoding: p_n[k] = scale * (S + k theta1 + theta2 c_k(n)) (Datseris et
    al., ExPE, eq. 5)."""

    paper = "Datseris et al., ExPE paper, ExQPE (§2.3)"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {
            "S": Bound(-1e3, 1e3),
            "theta1": Bound(0, 1e3, low_open=True),
            "theta2": Bound(0, 1e3, low_open=True),
            "l": Bound(1, 65536),
            "scale": Bound(0, 1e3, low_open=True),
        }
        S: float = 0.0
        theta1: float = 1.0 / 2048
        theta2: float = 1.0 / 16
        l: int | None = None  # None: d_model / 8
        scale: float = 1.0
        apply_to_value: bool = False

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        self._check()

    def options_changed(self) -> None:
        self._check()

    def values(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        o, l = self.options, self.l
        k = torch.arange(l, device=positions.device).to(dtype)
        p = o.S + k * o.theta1 + o.theta2 * exqpe_counts(positions, l).to(dtype)
        return p * o.scale if o.scale != 1.0 else p


register("expe", ExPE, "override the first l dims of the Q/K inputs with S + theta (n + k)")
register("expe-stable", ExPE, "ExPE ablation: all l dims equal p_n", stable=True)
register("expe-l1", ExPE, "ExPE ablation: l = 1", l=1)
register(
    "expe-once", ExPE, "ExPE ablation: override the embedding output once, before the first block", once=True
)
register("expe-learned", ExPE, "ExPE ablation: S and theta learned from a random init", learned=True)
register(
    "expe-learned-init",
    ExPE,
    "ExPE ablation: S and theta learned, initialised to the defaults",
    learned_init=True,
)
register("exqpe", ExQPE, "ExPE placement; one of the l dims grows by theta2 per position (bf16-stable)")
