"""CABLE: context-aware biases for length extrapolation (CABLE paper, anonymous EMNLP submission, §3).

Per layer and head, from the normed block input X (B, T, d):

    f = ReLU(X w_c) >= 0              (eq. 2)   per-token "distance" increments
    S = cumsum(f) over positions       (eq. 3-4) inclusive, so S_i - S_j = f_{j+1} + ... + f_i
    g = Softplus(X w_s) > 0            (eq. 6)   per-query weights
    B_ij = -g_i (S_i - S_j), j <= i    (eq. 7, signed as a penalty growing with the "context
                                                 distance", as in the authors' code)

Registered names: ``cable`` (the above), ``cable-nw`` (g = 1, ``weighted = false``), ``k-cable``
(``kernel = true``: B_ij = -log(1 + (g_i (S_i - S_j))^2)) and ``cable-official``
(``variant = "official"``, the authors' public code: CABLE-NW with softplus increments, added to
q.k logits that are not divided by sqrt(d_h)).

-g_i S_i is a row constant, so B_ij = g_i S_j up to it: a ``FoldedBias`` that runs through fused
attention; K-CABLE's kernel is not rank one: a ``PairwiseBias``.

Bidirectional (the encoder flavour; the paper defines the causal form only): S is the same
inclusive cumulative sum, over the whole sequence, and B_ij = -g_i |S_i - S_j|, so the keys at or
before the query get exactly the causal bias and a later key j is charged f_{i+1} + ... + f_j, the
increments between the two tokens; |S_i - S_j| is a distance (symmetric in i and j), g_i weighs
the query's row. Not rank one: a ``PairwiseBias``. K-CABLE squares S_i - S_j already: unchanged.
Why this form and not a mirrored one: docs/encoder.md. The KV cache keeps the running sum
S per layer (``state["cable_S"]``). The choices the paper leaves open (projections, init, the
official variant's logit scale) are in docs/attention.md, "Encoding choices".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extrapos.bounds import CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, FoldedBias, PairwiseBias, PositionalEncoding
from extrapos.positions.bias import gate_projection, running_sum
from extrapos.positions.registry import register

STATE_KEY = "cable_S"


def _linear(d: int, h: int, bias: bool) -> nn.Linear:
    lin = nn.Linear(d, h, bias=bias)
    nn.init.normal_(lin.weight, std=0.02)
    if bias:
        nn.init.zeros_(lin.bias)
    return lin


def abs_cable_fn(qf: Tensor, kf: Tensor) -> Tensor:
    """Bidirectional CABLE block: -g_i |S_i - S_j| from qf (.., tq, 2) = (g, S) and kf (.., Tk, 1) = S."""
    g, s_i = qf[..., 0:1], qf[..., 1:2]
    return -g * (s_i - kf.transpose(-1, -2)).abs()


def k_cable_fn(qf: Tensor, kf: Tensor) -> Tensor:
    """K-CABLE block: -log(1 + (g_i (S_i - S_j))^2) from qf (.., tq, 2) = (g, S) and kf (.., Tk, 1) = S."""
    g, s_i = qf[..., 0:1], qf[..., 1:2]
    if torch.is_grad_enabled() and (qf.requires_grad or kf.requires_grad):
        return _KCableBlock.apply(g, s_i, kf)
    return (g * (s_i - kf.transpose(-1, -2))).square_().log1p_().neg_()


def abs_cable_pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
    """``abs_cable_fn`` for one pair (FlexAttention's score_mod): qi = (g_i, S_i), kj = (S_j,)."""
    return -qi[0] * (qi[1] - kj[0]).abs()


def k_cable_pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
    """``k_cable_fn`` for one pair, plain autograd (flex differentiates it): qi = (g_i, S_i), kj = (S_j,)."""
    return -torch.log1p((qi[0] * (qi[1] - kj[0])) ** 2)


class _KCableBlock(torch.autograd.Function):
    """-log1p((g_i (s_i - S_j))^2) with a hand-written backward that saves no (tq, Tk) block.

    With w = g_i (s_i - S_j) and G the incoming gradient, dz/dw = -2 w / (1 + w^2) =: D, so
    grad g_i = sum_j D (s_i - S_j) = s_i sum_j D - (D S)_i, grad s_i = g_i sum_j D and
    grad S_j = -(g^T D)_j: two matrix-vector products instead of broadcast reductions, and w is
    recomputed rather than stored (autograd of the plain expression keeps four blocks alive)."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, s_i: Tensor, kf: Tensor) -> Tensor:  # ctx: torch types it Any
        ctx.save_for_backward(g, s_i, kf)
        return -torch.log1p((g * (s_i - kf.transpose(-1, -2))) ** 2)  # the same ops as the plain form

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        g, s_i, kf = ctx.saved_tensors
        w = g * (s_i - kf.transpose(-1, -2))
        d = w.mul(-2).div_(w.square_().add_(1)).mul_(grad)  # dz/dw * G, (B, H, tq, Tk)
        row = d.sum(-1, keepdim=True)  # (B, H, tq, 1)
        grad_g = s_i * row - d @ kf
        grad_s = g * row
        grad_k = -(d.transpose(-1, -2) @ g)  # (B, H, Tk, 1)
        return _reduce_to(grad_g, g), _reduce_to(grad_s, s_i), _reduce_to(grad_k, kf)


def _reduce_to(grad: Tensor, like: Tensor) -> Tensor:
    """Sum a gradient over the dimensions ``like`` broadcast along."""
    dims = [i for i, (a, b) in enumerate(zip(grad.shape, like.shape)) if b == 1 and a != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


class CABLE(PositionalEncoding):
    """Context-aware additive biases B_ij = -g_i (S_i - S_j) (CABLE paper §3, eq. 2-7); see module doc."""

    family = "cable"
    paper = "CABLE: Context-aware Biases for Length Extrapolation (anonymous EMNLP submission)"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        weighted: bool = True  # g = Softplus(X w_s); false: g = 1 (CABLE-NW)
        kernel: bool = False  # K-CABLE: -log(1 + (g_i (S_i - S_j))^2)
        variant: Literal["paper", "official"] = "paper"  # "official": the authors' public code
        unscaled_logits: bool = True  # official variant only: replicate its missing 1/sqrt(d_h)

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        o = self.options
        if o.variant not in ("paper", "official"):
            raise UserError(f"cable option variant must be 'paper' or 'official', got {o.variant!r}.")
        if o.variant == "official" and (o.weighted or o.kernel):
            raise UserError(
                "the official CABLE code has no weights g and no kernel; use the encoding 'cable-official' "
                "(or set weighted = false and kernel = false)."
            )
        d, h, n = ctx.d_model, ctx.n_heads, ctx.n_layers
        if o.variant == "official":
            self.w = nn.ModuleList(_linear(d, h, bias=True) for _ in range(n))
        else:
            self.w_c = nn.ModuleList(_linear(d, h, bias=False) for _ in range(n))
            if o.weighted:
                self.w_s = nn.ModuleList(_linear(d, h, bias=False) for _ in range(n))

    def increments_and_weights(self, x: Tensor, layer: int) -> tuple[Tensor, Tensor | None]:
        """f (B, H, T) >= 0 and g (B, H, T) > 0 (None when unweighted), in the feature dtype."""
        if self.options.variant == "official":
            return F.softplus(gate_projection(self.w[layer], x)).transpose(1, 2), None
        f = F.relu(gate_projection(self.w_c[layer], x)).transpose(1, 2)
        g = F.softplus(gate_projection(self.w_s[layer], x)).transpose(1, 2) if self.options.weighted else None
        return f, g

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> FoldedBias | PairwiseBias:
        f, g = self.increments_and_weights(x, layer)
        S = running_sum(f)  # inclusive
        if state is not None:
            if STATE_KEY in state:  # continue the running sum of the cached tokens
                S = S + state[STATE_KEY].unsqueeze(-1)
            state[STATE_KEY] = S[..., -1]
        if g is None:
            g = torch.ones_like(S)
        if self.options.kernel or not self.ctx.causal:
            fn, pair = (k_cable_fn, k_cable_pair) if self.options.kernel else (abs_cable_fn, abs_cable_pair)
            q_feat = torch.stack((g, S), dim=-1)
            return PairwiseBias(q_feat=q_feat, k_feat=S.unsqueeze(-1), fn=fn, pair=pair)
        # -g_i (S_i - S_j) = g_i S_j - g_i S_i, the last a row constant
        return FoldedBias(q_feat=g, k_feat=S)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        if self.options.variant == "official" and self.options.unscaled_logits:
            # cancel attention's 1/sqrt(d_h): the authors' logits are q.k + B (see module doc)
            return q * math.sqrt(q.shape[-1]), k
        return q, k


register("cable", CABLE, "CABLE: context-aware bias -g_i (S_i - S_j), S a cumsum of ReLU(X w_c) (folded)")
register("cable-nw", CABLE, "CABLE-NW: CABLE without the per-token weights g (g = 1)", weighted=False)
register(
    "k-cable",
    CABLE,
    "K-CABLE: kernelised CABLE bias -log(1 + (g_i (S_i - S_j))^2) (query-chunked)",
    kernel=True,
)
register(
    "cable-official",
    CABLE,
    "CABLE as in the authors' public code: softplus increments with bias, no g, unscaled q.k logits",
    variant="official",
    weighted=False,
)
