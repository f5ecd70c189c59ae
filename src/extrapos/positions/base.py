"""The positional-encoding protocol: four hooks, each a no-op by default.

A positional encoding is an ``nn.Module`` that may act at four places of the decoder:

| hook          | where                                                    | who                    |
|---------------|----------------------------------------------------------|------------------------|
| ``embed``     | once, on the token embeddings                            | sinusoidal, learned    |
| ``attn_input``| every block, on the normed input of the Q/K/V projections| ExPE, ExQPE            |
| ``rotate``    | every block, on q and k after the projections            | RoPE family            |
| ``bias``      | every block, an additive attention-logit bias, described | ALiBi, Kerple, FIRE,   |
|               | (never a T x T tensor), applied by the attention/ package| T5, CABLE family, FoX, |
|               |                                                          | CoPE, DAPE             |

Positions are explicit everywhere: ``positions`` is an int64 tensor (batch, time) holding the
position of each *new* token (during cached decoding only the new tokens are passed). No hook may
assume ``positions == arange(T)``.

Options: every encoding declares a frozen dataclass ``Options`` that checks its own values
(``bounds.py``); the registry builds it from the config dict, so an unknown option, a wrong type or a
value out of its range is a clear error, from the library as from the CLI. Inference-time changes
(ExPE's scale, RoPE scalings, learned-table interpolation) are options too, changed without retraining
through ``set_options`` (which replaces the frozen Options, checked again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from extrapos.bounds import CheckedOptions
from extrapos.errors import UserError


@dataclass(frozen=True)
class EncodingContext:
    """What an encoding may know about the model it sits in."""

    d_model: int
    n_heads: int
    head_dim: int
    n_layers: int
    train_length: int  # L_t: the training sequence length (ExPE's theta and FIRE's L derive from it)
    # False in the encoder flavour: every query sees every key, and relative biases read |i - j|
    # (their bidirectional forms: docs/encoder.md); True (decoders) keeps the causal definitions
    causal: bool = True

    @classmethod
    def of(cls, model: Any) -> EncodingContext:
        """The context of a model config: anything with ``d_model``, ``n_heads``, ``head_dim``,
        ``n_layers``, ``train_length`` and ``causal`` (``model.ModelConfig``; positions/ sits below the
        model, so it reads the fields rather than importing the class). The one way to build a
        context, so no copy can forget a field (``causal`` once was)."""
        return cls(
            d_model=model.d_model,
            n_heads=model.n_heads,
            head_dim=model.head_dim,
            n_layers=model.n_layers,
            train_length=model.train_length,
            causal=model.causal,
        )


@dataclass
class FoldedBias:
    """An additive bias of rank one up to row constants: ``bias[b,h,i,j] = q_feat[b,h,i] * k_feat[b,h,j]``.

    Anything constant along j (the key axis) may be dropped, because softmax ignores row constants;
    e.g. ALiBi's ``-m (i - j)`` is ``m * j`` plus a row constant and CABLE's ``-g_i (S_i - S_j)`` is
    ``g_i * S_j`` plus one. ``attention/fold.py`` folds it into one extra q/k dimension
    (q' = [q, q_feat * sqrt(d_h)], k' = [k, k_feat], v' = [v, 0]) and runs fused attention.

    q_feat: (B, H, Tq) for the new queries; k_feat: (B, H, Tk) for the new keys only (the KV cache
    keeps and concatenates past k_feat).
    """

    q_feat: Tensor
    k_feat: Tensor


@dataclass
class PairwiseBias:
    """A general additive bias ``bias[b,h,i,j] = fn(q_feat[b,:,i,:], k_feat[b,:,j,:])``.

    ``fn(qf, kf)`` takes qf (B, Hq, tq, F) for a block of queries and kf (B, Hk, Tk, F) for all keys
    (Hq, Hk in {1, H}) and returns the bias block (B, H or 1, tq, Tk). ``attention/chunked.py`` calls it one
    block of queries at a time for long sequences, so no T x T tensor is ever needed.
    Distance biases (Kerple, FIRE, T5) use the float positions as features (F = 1); K-CABLE uses
    (g_i, S_i) for queries and S_j for keys. k_feat covers the new keys only (the cache concatenates).

    ``pair(qi, kj, h)`` is the same bias for one (query, key) pair, the form FlexAttention's
    ``score_mod`` needs: qi[f] = q_feat[b, hq, i, f] and kj[f] = k_feat[b, hk, j, f] (lists of 0-d
    tensors), h the head (a 0-d index tensor) -> a 0-d tensor. It uses tensor operations only (no
    Python branch on a value, no custom autograd) and reads every other tensor that needs a gradient
    by scalar indexing (``r[h]``, ``w[h, m]``; a 0-d one as ``t.reshape(1)[0]``), the one access flex
    differentiates, and at most once per tensor (``flex_reads_once``); ``attention/flex.py`` trains
    with it on CUDA (docs/attention.md). None: no such form (flex then evaluates ``fn`` on the pair,
    without gradients).
    """

    q_feat: Tensor
    k_feat: Tensor
    fn: Callable[[Tensor, Tensor], Tensor]
    pair: Callable[[list[Tensor], list[Tensor], Tensor], Tensor] | None = dataclasses.field(
        default=None, kw_only=True
    )


def flex_may_differentiate(t: Tensor) -> bool:
    """Whether compiled FlexAttention (CUDA only, attention/flex.py) may differentiate a captured ``t``."""
    return t.is_cuda and t.requires_grad and torch.is_grad_enabled()


def flex_reads_once(tables: list[Tensor]) -> list[list[Tensor]]:
    """The rows of each table, each row a tensor of its own (a copy) where compiled flex may
    differentiate it, else views. Flex's compiled backward accepts one indexing read per captured tensor
    that requires grad (inductor refuses a second when it lowers the backward; seen on an H200 for FIRE,
    whose unrolled hidden layer read each weight tensor once per unit), so a per-pair form that reads a
    table row by row reads its rows from this. Copies cost one small kernel per row, CUDA training only."""
    return [
        [row.clone() for row in t.unbind(0)] if flex_may_differentiate(t) else list(t.unbind(0))
        for t in tables
    ]


@dataclass
class LogitBias:
    """A bias that reads the attention logits of its own row: CoPE's gates, DAPE's MLP.

    ``fn(scores, q, qf, kf, visible)`` gets, for one block of queries, the logits
    ``scores = q.k / sqrt(d_h)`` (B, H, tq, Tk) in the softmax dtype (fp32, fp64 for fp64 inputs),
    NOT yet causally masked (entries of future keys hold finite, meaningless values), the block's
    queries q (B, H, tq, d_h) after ``rotate``, the features qf (B, Hq, tq, F) / kf (B, Hk, Tk, F)
    as in ``PairwiseBias`` (F may be 0), and ``visible`` (tq, Tk), True where key j is causally
    visible; it returns the bias block (B, H, tq, Tk) that ``attention/chunked.py`` adds before masking.

    Neither of the other kinds can express it: the bias of (i, j) depends on q_i . k_l for other
    keys l of the row (CoPE) or is a non-linear function of the logit itself (DAPE). It runs on the
    query-chunked path only, so memory stays O(chunk x T); with a KV cache, the cached keys give
    every new query its whole row, so cached decoding needs no state. k_feat covers the new keys
    only (the cache concatenates).
    """

    q_feat: Tensor
    k_feat: Tensor
    fn: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


Bias = FoldedBias | PairwiseBias | LogitBias


class PositionalEncoding(nn.Module):
    """Base class: identity hooks. Subclasses override only what they need."""

    #: registry metadata, set by subclasses
    family: ClassVar[str] = "none"
    paper: ClassVar[str] = ""
    #: None when the encoding has a bidirectional form; else the one-sentence reason it has none
    causal_only: ClassVar[str | None] = None
    #: the name it is registered under, set by ``registry.build_encoding``
    registry_name: str

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        pass

    #: the encoding's options, checked on construction and frozen (``set_options`` replaces them); a
    #: subclass narrows the annotation to its own ``Options`` so its fields are typed
    options: CheckedOptions

    def __init__(self, ctx: EncodingContext, options: CheckedOptions | None = None):
        super().__init__()
        if not ctx.causal and self.causal_only:
            raise UserError(f"encoding '{type(self).__name__}' cannot be bidirectional: {self.causal_only}")
        self.ctx = ctx
        self.options = options if options is not None else self.Options()

    @classmethod
    def acts_on_embeddings(cls, options: CheckedOptions) -> bool:
        """True if, with these options, the encoding changes the token embeddings (the ``embed`` hook,
        once before the first block): a layer schedule cannot confine it to some layers (schedule.py)."""
        return False

    def at_layer(self, layer: int) -> tuple[PositionalEncoding, int]:
        """The encoding that runs on model layer ``layer`` and the index it knows that layer by: this
        encoding and the layer itself, except in a layer schedule (schedule.py)."""
        return self, layer

    # ---- hooks -----------------------------------------------------------------------------
    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        """Called once on the token embeddings h (B, T, d). Default: unchanged."""
        return h

    def attn_input(self, x: Tensor, positions: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """Inputs of the (Q, K) and V projections from the normed block input x (B, T, d)."""
        return x, x

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Transform q (B, H, T, d_h) and k (B, H_kv, T, d_h) of the new tokens. Default: unchanged."""
        return q, k

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> Bias | None:
        """Describe the additive attention-logit bias for the new tokens, or None.

        x is the normed block input (B, T, d). ``state`` is a per-layer dict owned by the KV cache
        (None without a cache) for running quantities such as CABLE's cumulative sum.
        """
        return None

    # ---- options ---------------------------------------------------------------------------
    def set_options(self, **changes: Any) -> None:
        """Change options in place (inference-time scaling etc.); unknown names are a UserError."""
        names = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise UserError(
                f"encoding '{type(self).__name__}' has no option {', '.join(unknown)}; "
                f"its options are: {', '.join(sorted(names)) or '(none)'}."
            )
        previous = self.options
        self.options = dataclasses.replace(self.options, **changes)
        try:
            self.options_changed()
        except Exception:
            self.options = previous  # a rejected value never stays in place
            self.options_changed()
            raise

    def options_changed(self) -> None:
        """Hook for subclasses that cache derived tensors (e.g. RoPE inverse frequencies)."""

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self.options).items())


def float_positions(positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Positions as floats (exact up to 2**24 in fp32)."""
    return positions.to(dtype)
