"""Static relative biases added to the attention logits: ALiBi, Kerple, FIRE, T5.

Each returns a bias *description* from the ``bias`` hook and never a T x T tensor:

* ``alibi`` (Press et al. 2022): -m_h (i - j) = m_h * j + row constant, a ``FoldedBias``
  (q_feat = m_h, k_feat = j) that ``attention/fold.py`` folds into fused attention.
* ``kerple-log`` / ``kerple-power`` (Chi et al. 2022): -r1 log(1 + r2 |i - j|) and -r1 |i - j|^r2.
* ``fire`` (Li et al. 2023): f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), f an MLP.
* ``t5`` (Raffel et al. 2020): a learned scalar per (bucket of j - i, head).

The last three are ``DistanceBias`` (a ``PairwiseBias`` whose features are float positions, F = 1)
evaluated in query chunks. Kerple and T5 depend on i - j alone, FIRE on i - j once max(L, i) = L:
``DistanceBias.table`` gives the bias on the O(T) distances 0..n-1 and ``attention/toeplitz.py`` expands it
(strided views for contiguous positions, a gather for sorted ones) instead of evaluating ``fn`` on
every one of the O(T^2) pairs (causal attention only: the tables hold the causal mask).

Bidirectional forms (``ctx.causal`` False, the encoder flavour; table in docs/encoder.md): ALiBi
-m_h |i - j| (not rank one: a ``PairwiseBias``), Kerple unchanged (it already reads |i - j|), FIRE
normalised by the farthest key the query sees on either side, T5 with T5's bidirectional buckets.
Distances always come from the ``positions`` argument, never from
indices, so segmented training, random positions and cached decoding get the right biases. Features
are float32 (float64 when the model runs in float64): positions are exact in fp32 up to 2**24.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extrapos.bounds import MAX_POSITION, Bound, BoundError, CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import (
    EncodingContext,
    FoldedBias,
    PairwiseBias,
    PositionalEncoding,
    flex_reads_once,
)
from extrapos.positions.registry import register


@dataclass
class DistanceBias(PairwiseBias):
    """A ``PairwiseBias`` on float positions (F = 1) that is, for some query blocks, a function of the
    distance d = i - j alone: ``table(qf, n)`` returns the bias at d = 0, 1, ..., n - 1 as an
    (H or 1, n) tensor valid for every query of the block ``qf``, or None where it is not (FIRE's
    queries past L). ``fn`` stays the definition: the reference, FlexAttention and the blocks the
    table does not cover use it, and the tests hold the table path against it."""

    table: Callable[[Tensor, int], Tensor | None] | None = None


def feature_dtype(x: Tensor) -> torch.dtype:
    """fp32 for bias features (also under bf16 autocast), fp64 for fp64 models."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def gate_projection(lin: nn.Module, x: Tensor) -> Tensor:
    """``lin(x)`` in the feature dtype: the small per-token projections of the data-dependent biases
    (CABLE, FoX). Called as a function, not a module, and without a cast that changes nothing: decoding
    runs it once per layer and token, where the module call's machinery (~4 us on a CPU) costs more
    than the (d, H) matmul itself."""
    linear = cast(nn.Linear, lin)  # an entry of an nn.ModuleList of nn.Linear
    y = F.linear(x, linear.weight, linear.bias)
    dtype = feature_dtype(x)
    return y if y.dtype == dtype else y.to(dtype)


def running_sum(f: Tensor) -> Tensor:
    """Inclusive cumulative sum along the last dimension; one step (a decoded token) is its own sum."""
    return f if f.shape[-1] == 1 else torch.cumsum(f, dim=-1)


def _position_features(positions: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, T) int positions -> (B, 1, T, 1) float features, shared by all heads."""
    return positions.to(dtype)[:, None, :, None]


def _distance(qf: Tensor, kf: Tensor) -> Tensor:
    """|i - j| for a block of queries (B, 1, tq, 1) and all keys (B, 1, Tk, 1): (B, 1, tq, Tk)."""
    return (qf - kf.transpose(-1, -2)).abs()


def clamp_straight_through(p: Tensor, min: float | None = None, max: float | None = None) -> Tensor:
    """p clamped to [min, max] in value with the gradient of the identity.

    The Kerple reference clamps the parameter's ``.data`` in place before every use, so a clamped
    parameter keeps receiving gradients and can come back; a plain ``clamp`` would zero them
    forever. This does the same without mutating parameters inside forward.
    """
    return p + (p.clamp(min=min, max=max) - p).detach()


# ---- ALiBi ------------------------------------------------------------------------------------


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al.'s slopes: a geometric sequence start^(k+1), start = 2^(-8/h), for h a power of
    two; otherwise those of the closest lower power of two p, then every other slope of 2p."""
    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = [2.0 ** (-8.0 * (k + 1) / p) for k in range(p)]
    if p < n_heads:
        slopes += [2.0 ** (-8.0 * (k + 1) / (2 * p)) for k in range(0, 2 * p, 2)][: n_heads - p]
    return slopes


class ALiBi(PositionalEncoding):
    """Bias -m_h (i - j) with fixed per-head slopes m_h (Press et al. 2022, §3).

    Bidirectional: -m_h |i - j|, symmetric in i and j (the paper defines the causal form only). The
    causal fold (m_h j plus a row constant) does not extend: |i - j| is not rank one in (i, j), so
    the bidirectional bias is a ``PairwiseBias`` on the query-chunked path.
    """

    family = "bias"
    paper = "Press et al. 2022, Train short, test long: attention with linear biases (ALiBi)"
    slopes: Tensor  # (H,) fp64, a buffer

    def __init__(self, ctx: EncodingContext, options: CheckedOptions | None = None):
        super().__init__(ctx, options)
        self.register_buffer(
            "slopes", torch.tensor(alibi_slopes(ctx.n_heads), dtype=torch.float64), persistent=False
        )

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> FoldedBias | PairwiseBias:
        dtype = feature_dtype(x)
        B, T = positions.shape
        if not self.ctx.causal:
            slopes = self.slopes.to(dtype)[None, :, None, None]
            p = _position_features(positions, dtype)

            def fn(qf: Tensor, kf: Tensor) -> Tensor:
                return -slopes * _distance(qf, kf)

            m = slopes[0, :, 0, 0]

            def pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
                return -m[h] * (qi[0] - kj[0]).abs()

            return PairwiseBias(q_feat=p, k_feat=p, fn=fn, pair=pair)
        m = self.slopes.to(dtype)[None, :, None].expand(B, -1, T)
        # -m (i - j) = m * j - m * i, and -m * i is a row constant the softmax ignores
        j = positions.to(dtype)[:, None, :].expand(B, self.ctx.n_heads, T)
        return FoldedBias(q_feat=m, k_feat=j)


# ---- Kerple -----------------------------------------------------------------------------------


class Kerple(PositionalEncoding):
    """Kernelized relative biases (Chi et al. 2022; as summarised in the CABLE paper §2), per head and per
    layer:

    log form: -r1 log(1 + r2 |i - j|); power form: -r1 |i - j|^r2; r1, r2 > 0 (>= 1e-2), r2 <= 2.

    Each layer has its own r1, r2 (option ``per_layer``). Note: the authors' gpt-neox code builds
    one Kerple module and hands it to every layer, i.e. shares the parameters; set
    ``per_layer = false`` for that. Init as their code: log form r1 ~ U(0, 2), r2 ~ U(0, 1);
    power form r1 ~ U(0, 1), r2 ~ U(0, 2).
    """

    family = "bias"
    paper = "Chi et al. 2022, KERPLE: kernelized relative positional embedding for length extrapolation"
    EPS = 1e-2

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        form: Literal["log", "power"] = "log"
        per_layer: bool = True

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        if self.options.form not in ("log", "power"):
            raise UserError(f"kerple option form must be 'log' or 'power', got {self.options.form!r}.")
        n = ctx.n_layers if self.options.per_layer else 1
        r1_scale, r2_scale = (2.0, 1.0) if self.options.form == "log" else (1.0, 2.0)
        self.r1 = nn.Parameter(torch.rand(n, ctx.n_heads) * r1_scale)
        self.r2 = nn.Parameter(torch.rand(n, ctx.n_heads) * r2_scale)

    def params(self, layer: int) -> tuple[Tensor, Tensor]:
        """Clamped (r1, r2) of one layer, each (H,)."""
        idx = layer if self.options.per_layer else 0
        r1 = clamp_straight_through(self.r1[idx], min=self.EPS)
        r2 = clamp_straight_through(
            self.r2[idx], min=self.EPS, max=2.0 if self.options.form == "power" else None
        )
        return r1, r2

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias:
        dtype = feature_dtype(x)
        p = _position_features(positions, dtype)
        r1, r2 = (t.to(dtype)[:, None, None] for t in self.params(layer))
        if self.options.form == "log":

            def kernel(d: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
                return -r1 * torch.log1p(r2 * d)

        else:

            def kernel(d: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
                return -r1 * d.pow(r2)

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            return kernel(_distance(qf, kf), r1, r2)

        def table(qf: Tensor, n: int) -> Tensor:
            # the same expression on the n distinct distances: (H, 1, 1) params -> (H, n)
            return kernel(torch.arange(n, dtype=dtype, device=qf.device), r1[:, :, 0], r2[:, :, 0])

        r1h, r2h = r1[:, 0, 0], r2[:, 0, 0]

        def pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
            return kernel((qi[0] - kj[0]).abs(), r1h[h], r2h[h])

        return DistanceBias(q_feat=p, k_feat=p, fn=fn, pair=pair, table=table)


# ---- FIRE -------------------------------------------------------------------------------------


class FIRE(PositionalEncoding):
    """b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1) (Li et al. 2023, eq. 7).

    f: MLP 1 -> 32 -> h with ReLU; c (init 0.1) and L (init L_t) learnable, one set per layer.
    Following the FIRE paper's reference code, psi uses |c x| (c cannot flip the log's sign), and
    L = L_t * |l_scale| with l_scale a learnable multiplier initialised to 1 (learning L on the
    scale of 1 rather than of L_t); the normaliser gets ``eps`` so psi(max(L, i)) = 0 (e.g. L -> 0
    at i = 0) cannot divide by zero. max, not min: queries before L share one normaliser, later
    ones are normalised by their own position (the paper; one public implementation has min).

    Bidirectional (the paper defines the causal form): the normaliser's i is the distance to the
    farthest key the query sees, max(i - first, last - i) over the keys' positions, as i is in the
    causal case (positions from 0), so u = psi(|i - j|) / psi(max(L, reach_i)) stays in [0, 1] at
    every length; the bias is mirror-symmetric (reversing the positions maps it onto itself).

    Option ``grid`` (default 0: the exact MLP): evaluate f once per layer and forward on the G = grid
    nodes u_k = k / (G - 1) of [0, 1] (the range of u on the visible pairs) and interpolate linearly
    between them: per pair one truncation to the cell and two gathers instead of the MLP (or the
    piecewise form's bucketize over its breakpoints). It changes the numbers: f is piecewise linear
    in u, so the interpolant is exact in every cell without a ReLU breakpoint and off by at most
    (1 / (G - 1)) / 4 * sum_m |w1_m W2[h, m]| in one that has them (O(1 / G) at worst, O(1 / G^2) on
    average over u); gradients reach the MLP through the nodes and c, L through u. Measured error and
    cost: docs/attention.md.

    Option ``piecewise`` (default false; exact form only): under autograd too, blocks past L evaluate
    f as the piecewise-linear function it is (``_mlp_piecewise``, what inference always runs) instead
    of the MLP's (pairs x width) hidden layer: the same function and, almost everywhere in u, the same
    gradients (those of the units active on u's interval), equal up to rounding, so off by default
    (the default training numbers stay bit-identical).
    """

    family = "bias"
    paper = (
        "Li et al. 2024, Functional interpolation for relative positions improves long context "
        "transformers (FIRE)"
    )

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {
            "mlp_width": Bound(1, 4096),
            "init_c": Bound(0, 1e3, low_open=True),
            "init_L": Bound(0, MAX_POSITION, low_open=True),
            "eps": Bound(0, 1, low_open=True, high_open=True),
            "grid": Bound(None, 2**20),  # and 0 or at least 2 (check)
        }
        mlp_width: int = 32
        init_c: float = 0.1
        init_L: float | None = None  # None: the training length L_t
        eps: float = 1e-6
        grid: int = 0  # 0: the exact MLP; G >= 2: f on G nodes of [0, 1], linearly interpolated
        piecewise: bool = False  # the exact MLP as its piecewise-linear form under autograd too

        def check(self) -> None:
            grid = self.grid
            if isinstance(grid, int) and not isinstance(grid, bool) and grid != 0 and grid < 2:
                raise BoundError("grid", "0 (the exact MLP) or a number of grid nodes >= 2", grid)

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        self.options_changed()
        o, n = self.options, ctx.n_layers
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(1, o.mlp_width), nn.ReLU(), nn.Linear(o.mlp_width, ctx.n_heads))
            for _ in range(n)
        )
        self.c = nn.Parameter(torch.full((n,), o.init_c))
        self.l_scale = nn.Parameter(torch.ones(n))
        self.register_buffer("init_L", torch.tensor(float(o.init_L or ctx.train_length)), persistent=False)

    init_L: Tensor  # the initial threshold L, a buffer

    def options_changed(self) -> None:
        grid = self.options.grid
        if isinstance(grid, bool) or not isinstance(grid, int) or grid == 1 or grid < 0:
            raise UserError(
                f"fire option grid must be 0 (the exact MLP) or a number of grid nodes >= 2, got {grid!r}."
            )

    def layer_mlp(self, layer: int) -> nn.Sequential:
        """The MLP f of layer ``layer`` (an nn.ModuleList entry, typed)."""
        return cast(nn.Sequential, self.mlps[layer])

    def threshold(self, layer: int) -> Tensor:
        """The learnable L of one layer."""
        return self.init_L * self.l_scale[layer].abs()

    def grid_tables(self, layer: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The linear interpolant of layer ``layer``'s f through its values V_k at the nodes
        u_k = k / (G - 1), k = 0..G-1, as intercepts A and slopes S (H, G - 1) in x = u (G - 1):
        on cell k (k <= x <= k + 1) it is A_k + S_k x = V_k + (x - k) (V_{k+1} - V_k). The MLP runs
        in full precision (outside autocast) on the G nodes only; the tables are in ``dtype``."""
        mlp, G = self.layer_mlp(layer), self.options.grid
        w = _linears(mlp)[0].weight
        with torch.autocast(w.device.type, enabled=False):
            nodes = torch.arange(G, dtype=w.dtype, device=w.device) / (G - 1)
            V = mlp(nodes.unsqueeze(-1)).t().to(dtype)  # (H, G)
        S = V[:, 1:] - V[:, :-1]
        A = V[:, :-1] - torch.arange(G - 1, dtype=dtype, device=w.device) * S
        return A, S

    def normalised(self, c: Tensor, L: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        """u(qf, kf) = psi(|i - j|) / psi(max(L, reach_i)) for a block of queries and its keys,
        (B, 1, tq, Tk), in the dtype of the positions."""
        causal, eps = self.ctx.causal, self.options.eps

        def u(qf: Tensor, kf: Tensor) -> Tensor:
            num = torch.log1p(c * _distance(qf, kf))  # psi(i - j), (B, 1, tq, Tk)
            # causal: the farthest visible key is at position 0; bidirectional: either end of the keys
            reach = (
                qf
                if causal
                else torch.maximum(qf - kf.amin(dim=-2, keepdim=True), kf.amax(dim=-2, keepdim=True) - qf)
            )
            den = torch.log1p(c * torch.maximum(reach, L)) + eps  # psi(max(L, i)), (B, 1, tq, 1)
            return num / den

        return u

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias:
        dtype = feature_dtype(x)
        p = _position_features(positions, dtype)
        c, L, eps = self.c[layer].abs().to(dtype), self.threshold(layer).to(dtype), self.options.eps
        mlp, causal, piecewise = self.layer_mlp(layer), self.ctx.causal, self.options.piecewise
        first, last = _linears(mlp)
        if self.options.grid:
            return self._grid_bias(p, c, L, *self.grid_tables(layer, dtype))
        normalised = self.normalised(c, L)

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            u = normalised(qf, kf).to(first.weight.dtype)
            if not torch.is_grad_enabled():
                return _mlp_piecewise(mlp, u) if u.numel() >= PIECEWISE_MIN else _mlp_by_unit(mlp, u)
            if piecewise and u.numel() >= PIECEWISE_MIN:
                return _mlp_piecewise(mlp, u)
            out = mlp(u.unsqueeze(-1))  # (B, 1, tq, Tk, H)
            return out.squeeze(1).permute(0, 3, 1, 2)

        def table(qf: Tensor, n: int) -> Tensor | None:
            # queries strictly before L share the normaliser psi(L) (strictly: at i = L, maximum's
            # gradient is split between i and L), so their bias is a function of i - j alone
            if qf.numel() == 0 or not bool(qf.max() < L):
                return None
            d = torch.arange(n, dtype=dtype, device=qf.device)
            u = (torch.log1p(c * d) / (torch.log1p(c * L) + eps)).to(first.weight.dtype)
            return mlp(u.unsqueeze(-1)).transpose(0, 1)  # (H, n)

        # the MLP's weights as tensors (a score_mod that captures a module is compiled once per layer),
        # every one read by scalar indexing and the hidden layer unrolled (PairwiseBias.pair); each hidden
        # unit's weights are tensors of their own where flex will differentiate them (flex_reads_once)
        w1, b1, w2, b2 = first.weight[:, 0], first.bias, last.weight, last.bias
        w1s, b1s, w2s = flex_reads_once([w1[:, None], b1[:, None], w2.t()])
        c1, L1 = c.reshape(1), L.reshape(1)

        def pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
            c, L = c1[0], L1[0]
            u = torch.log1p(c * (qi[0] - kj[0]).abs()) / (torch.log1p(c * torch.maximum(qi[0], L)) + eps)
            u = u.to(w1.dtype)
            out = b2[h]
            for m in range(len(w1s)):
                out = out + w2s[m][h] * torch.relu(w1s[m][0] * u + b1s[m][0])
            return out

        # bidirectional FIRE normalises by the farthest key of the row: no per-pair form
        return DistanceBias(q_feat=p, k_feat=p, fn=fn, pair=pair if causal else None, table=table)

    def _grid_bias(self, p: Tensor, c: Tensor, L: Tensor, A: Tensor, S: Tensor) -> DistanceBias:
        """``bias`` with f replaced by its interpolant on the grid (``grid_tables``): the same u, the
        same table / fn / pair structure (the table path before L, every pair after it)."""
        normalised, eps, cells = self.normalised(c, L), self.options.eps, A.shape[-1]

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            return _grid_interpolate(A, S, normalised(qf, kf))

        def table(qf: Tensor, n: int) -> Tensor | None:
            if qf.numel() == 0 or not bool(qf.max() < L):  # as the exact form's table
                return None
            d = torch.arange(n, dtype=p.dtype, device=qf.device)
            u = torch.log1p(c * d) / (torch.log1p(c * L) + eps)
            return _grid_interpolate(A, S, u.reshape(1, 1, 1, n))[0, :, 0]  # (H, n)

        c1, L1 = c.reshape(1), L.reshape(1)

        def pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
            c, L = c1[0], L1[0]
            u = torch.log1p(c * (qi[0] - kj[0]).abs()) / (torch.log1p(c * torch.maximum(qi[0], L)) + eps)
            x = (u * cells).clamp(0, cells)
            k = x.to(torch.long).clamp(max=cells - 1)  # x >= 0: truncation is floor
            return A[h, k] + S[h, k] * x

        pair_or_none = pair if self.ctx.causal else None
        return DistanceBias(q_feat=p, k_feat=p, fn=fn, pair=pair_or_none, table=table)


def _grid_interpolate(A: Tensor, S: Tensor, u: Tensor) -> Tensor:
    """FIRE's interpolant (``FIRE.grid_tables``: A, S (H, G - 1)) at every element of u (B, 1, tq, Tk):
    x = u (G - 1) clamped to [0, G - 1] (u outside [0, 1] only on masked future keys), cell
    k = min(floor(x), G - 2), A_k + S_k x; (B, H, tq, Tk). Differentiable in A, S and u."""
    cells = A.shape[-1]
    B, _, tq, Tk = u.shape
    x = (u.reshape(-1) * cells).clamp(0, cells)
    k = x.detach().to(torch.long).clamp_(max=cells - 1).expand(A.shape[0], -1)  # x >= 0: floor
    # gather with an expanded index: the fastest of the CPU indexing kernels here (_mlp_piecewise)
    out = torch.addcmul(torch.gather(A, 1, k), torch.gather(S, 1, k), x)  # (H, N)
    return out.reshape(-1, B, tq, Tk).transpose(0, 1)


def _linears(mlp: nn.Sequential) -> tuple[nn.Linear, nn.Linear]:
    """The first and last layer of a 1 -> width -> H MLP (Linear, ReLU, Linear); indexing an
    nn.Sequential gives the type checker a Module only."""
    return cast(nn.Linear, mlp[0]), cast(nn.Linear, mlp[2])


def _mlp_by_unit(mlp: nn.Sequential, u: Tensor) -> Tensor:
    """The 1 -> width -> H ReLU MLP applied to every element of u (B, 1, tq, Tk) without autograd:
    the hidden layer in pieces of ``MLP_PIECE`` elements (each (piece, width), a few MB), both layers
    as matmuls, so memory stays a few (B, H, tq, Tk) blocks instead of (B, tq, Tk, width). Same
    function as ``mlp(u[..., None])``; out of place, because FlexAttention traces it under vmap."""
    first, last = _linears(mlp)
    B, _, tq, Tk = u.shape
    flat = u.reshape(-1, 1)
    pieces = [
        torch.addmm(
            last.bias,
            torch.relu(torch.addmm(first.bias, flat[s : s + MLP_PIECE], first.weight.t())),
            last.weight.t(),
        )
        for s in range(0, flat.shape[0], MLP_PIECE)
    ]
    out = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # (B tq Tk, H)
    return out.t().reshape(-1, B, tq, Tk).transpose(0, 1)


#: elements of u per piece of FIRE's hidden layer at inference (x width 32: 8 MB in fp32)
MLP_PIECE = 1 << 16
#: blocks of at least this many elements use the piecewise-linear form (small ones, e.g. FlexAttention's
#: traced single pairs, the plain matmuls)
PIECEWISE_MIN = 1 << 12


def _mlp_piecewise(mlp: nn.Sequential, u: Tensor) -> Tensor:
    """The 1 -> width -> H ReLU MLP on every element of u (B, 1, tq, Tk), as the piecewise-linear
    function it is: f(u) = b2 + sum_m W2[:, m] relu(w1_m u + b1_m) is affine between the sorted
    breakpoints t_m = -b1_m / w1_m, f(u) = A_k u + C_k on interval k (A_k, C_k: sums over the units
    active there). One bucketize and two gathers per element instead of a width-wide hidden layer;
    equal to the MLP up to rounding (continuous at the breakpoints, where relu(0) = 0 on both sides).
    Differentiable in u and the weights (through the slopes and intercepts of the active sets, which
    are piecewise constant: d f / d w1_m = W2[:, m] u and d f / d b1_m = W2[:, m] on the units active
    at u, as the MLP's); at a breakpoint itself (measure zero) the interval's active set may count a
    unit whose ReLU input is exactly 0, which the MLP's gradient does not."""
    first, last = _linears(mlp)
    w1, b1, w2, b2 = first.weight[:, 0], first.bias, last.weight, last.bias
    t = (-b1[w1 != 0] / w1[w1 != 0]).sort().values  # (K,) breakpoints
    if t.numel():
        reps = torch.cat([t[:1] - 1, (t[1:] + t[:-1]) / 2, t[-1:] + 1])  # one point inside each interval
    else:
        reps = w1.new_zeros(1)
    active = (reps[:, None] * w1 + b1 > 0).to(w1.dtype)  # (K + 1, width)
    slope = ((active * w1) @ w2.t()).t().contiguous()  # (H, K + 1)
    intercept = (b2 + (active * b1) @ w2.t()).t().contiguous()
    B, _, tq, Tk = u.shape
    flat = u.reshape(-1)
    idx = torch.bucketize(flat, t).expand(slope.shape[0], -1)  # interval k: t[k-1] < u <= t[k]
    # gather with an expanded index: the fastest of the CPU indexing kernels here
    out = torch.addcmul(torch.gather(intercept, 1, idx), torch.gather(slope, 1, idx), flat)  # (H, N)
    return out.reshape(-1, B, tq, Tk).transpose(0, 1)


# ---- T5 ---------------------------------------------------------------------------------------


def t5_bucket(
    relative_position: Tensor, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False
) -> Tensor:
    """T5 bucket of relative_position = j - i (Raffel et al. 2020, §2.1; T5's ``_relative_position_bucket``).

    Causal: n = max(i - j, 0); n < num_buckets / 2 gets its own bucket, larger n are log-spaced over
    the other half up to max_distance and clamped to the last bucket. Bidirectional (T5's encoder):
    half the buckets for keys before or at the query, half (offset by num_buckets / 2) for keys
    after it, each half bucketing n = |j - i| as above with num_buckets / 2 buckets.
    """
    if bidirectional:
        half = num_buckets // 2
        after = (relative_position > 0).to(torch.long) * half
        return after + t5_bucket(-relative_position.abs(), half, max_distance)
    n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    n_safe = n.clamp(min=1).to(torch.float32)  # log(0) is never selected, keep it finite
    large = max_exact + (
        torch.log(n_safe / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n.to(torch.long), large)


#: where ``remembered_rows`` keeps its table in a layer's cache state
DISTANCE_TABLE_KEY = "distance_table"


def remembered_rows(
    state: dict, by_distance: Callable[[Tensor, int], Tensor], stamp: tuple
) -> Callable[[Tensor, Tensor], Tensor]:
    """``fn`` of a causal bias that depends on the distance alone, for forwards with a KV cache and no
    autograd (decoding on the CPU): each query's row is a gather from ``by_distance``'s (H, n) table, kept
    in the layer's cache ``state`` and grown by doubling, instead of the bias evaluated afresh on every
    cached key at every step (T5's bucketing is ~15 eager ops per layer and token). The same table entries
    at the same distances, so the same numbers; keys after a query (negative distances) read distance 0
    and are masked by the caller, as ``fn``'s are. ``stamp`` (the parameter's version and the dtype)
    retires the table when the weights change. CPU only: the largest distance is read back to the host,
    which on CUDA would be a sync per layer and token."""

    def fn(qf: Tensor, kf: Tensor) -> Tensor:
        d = (qf - kf.transpose(-1, -2)).round_().clamp_(min=0).to(torch.long)  # i - j, (B, 1, tq, Tk)
        n = int(d.max()) + 1
        held = state.get(DISTANCE_TABLE_KEY)
        if held is None or held[0] != stamp or held[1].shape[-1] < n:
            size = max(n, 2 * held[1].shape[-1]) if held is not None and held[0] == stamp else n
            held = (stamp, by_distance(qf, size))
            state[DISTANCE_TABLE_KEY] = held
        return held[1][:, d[:, 0]].transpose(0, 1)  # (B, H, tq, Tk)

    return fn


class T5Bias(PositionalEncoding):
    """Learned scalar per (bucket of j - i, head), one table for all layers (Raffel et al. 2020, §2.1).

    Init: zeros by default, so an untrained model is exactly NoPE and every run starts the same;
    ``init_std > 0`` draws N(0, init_std^2) as T5 does (HF uses std d_model^-1/2). Bidirectional:
    T5's encoder buckets (``t5_bucket(bidirectional=True)``), direction-aware, so not symmetric.
    """

    family = "bias"
    paper = (
        "Raffel et al. 2020, Exploring the limits of transfer learning with a unified text-to-text "
        "transformer (T5)"
    )

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {
            "num_buckets": Bound(2, 4096),
            "max_distance": Bound(1, MAX_POSITION),
            "init_std": Bound(0, 10),
        }
        num_buckets: int = 32
        max_distance: int = 128
        init_std: float = 0.0

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        self.table = nn.Parameter(torch.zeros(self.options.num_buckets, ctx.n_heads))
        if self.options.init_std > 0:
            nn.init.normal_(self.table, std=self.options.init_std)

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> PairwiseBias:
        p = _position_features(positions, feature_dtype(x))  # integers are exact in fp32 below 2**24
        o, table, both = self.options, self.table.to(feature_dtype(x)), not self.ctx.causal

        def fn(qf: Tensor, kf: Tensor) -> Tensor:
            rel = (kf.transpose(-1, -2) - qf).round().to(torch.long)  # j - i, (B, 1, tq, Tk)
            b = t5_bucket(rel, o.num_buckets, o.max_distance, bidirectional=both)
            return table[b.squeeze(1)].permute(0, 3, 1, 2)  # (B, H, tq, Tk)

        def by_distance(qf: Tensor, n: int) -> Tensor:
            rel = -torch.arange(n, device=qf.device)  # j - i for d = i - j = 0 .. n - 1
            return table[t5_bucket(rel, o.num_buckets, o.max_distance)].transpose(0, 1)  # (H, n)

        def pair(qi: list[Tensor], kj: list[Tensor], h: Tensor) -> Tensor:
            rel = (kj[0] - qi[0]).round().to(torch.long)
            return table[t5_bucket(rel, o.num_buckets, o.max_distance, bidirectional=both), h]

        rows: Callable[[Tensor, Tensor], Tensor] = fn
        if state is not None and not both and not torch.is_grad_enabled() and p.device.type == "cpu":
            rows = remembered_rows(state, by_distance, (self.table._version, table.dtype))
        return DistanceBias(q_feat=p, k_feat=p, fn=rows, pair=pair, table=by_distance)


register(
    "alibi", ALiBi, "ALiBi: linear bias -m_h (i - j), fixed geometric slopes (folded into fused attention)"
)
register(
    "kerple-log",
    Kerple,
    "Kerple, log kernel: -r1 log(1 + r2 |i - j|), learned per head and layer",
    form="log",
)
register(
    "kerple-power", Kerple, "Kerple, power kernel: -r1 |i - j|^r2, learned per head and layer", form="power"
)
register("fire", FIRE, "FIRE: MLP of the log distance normalised by log(max(L, i)), learned per layer")
register(
    "t5", T5Bias, "T5 relative bias: learned scalar per (log-spaced distance bucket, head), shared by layers"
)
