"""A transformer with pluggable positional encodings and a KV cache: decoders and an encoder.

Three flavours share one code path:

* ``gpt2``: pre-LayerNorm blocks, GELU (tanh) MLP of 4d, dropout, biases, tied embeddings.
* ``llama``: pre-RMSNorm (eps 1e-5), SwiGLU MLP (hidden 8d/3 rounded up to a multiple of 256), no
  biases, tied or untied embeddings, optional grouped-query attention (``n_kv_heads``).
* ``encoder``: a BERT-style bidirectional encoder for masked language modelling (Devlin et al.
  2019, §3.1 and App. A): the gpt2 block with the exact (erf) GELU, attention without a causal
  mask (the encodings switch to their bidirectional forms, docs/encoder.md), and BERT's MLM head
  (dense d -> d, GELU, LayerNorm, then the tied embedding matrix plus an output bias). Pre-norm by
  default, as modern encoders (ModernBERT, Warner et al. 2024, §2.1); ``post_norm`` gives BERT's.

Options that pretrained checkpoints need (``integrations/hf/``), all off by default:

* ``activation``: the MLP non-linearity; ``None`` keeps the flavour's (GELU tanh approximation for gpt2,
  SiLU gate for llama); ``"gelu"`` is the exact erf GELU of GPT-NeoX / Pythia (Biderman et al. 2023).
* ``parallel_residual``: ``h + attn(norm1 h) + mlp(norm2 h)`` (GPT-J / GPT-NeoX, Black et al. 2022, §2).
* ``embed_norm``: a LayerNorm on the embeddings before the first block (Bloom, Le Scao et al. 2022, §3.2).
* ``qkv_bias``: biases on the Q/K/V projection only (Qwen2, Yang et al. 2024); ``None`` follows ``bias``.
* ``post_norm``: post-LN blocks ``h = norm1(h + attn(h)); h = norm2(h + mlp(h))`` and no final norm
  (Vaswani et al. 2017, §3.1; BERT), usually with ``embed_norm``.
* ``sliding_window`` W: each query attends to its last W tokens, itself included (Mistral, Jiang et
  al. 2023, §2; Qwen2), on the layers ``sliding_window_layers`` (default: every layer); attention/mask.py.

The positional encoding (``self.pos``, see positions/base.py) is called at its four hooks:

    h = pos.embed(tok_emb(tokens), positions)                       # once
    per block:  x = norm1(h)
                xq, xv = pos.attn_input(x, positions, layer)         # ExPE overrides the Q/K input
                q, k, v = Wq xq, Wk xq, Wv xv
                q, k = pos.rotate(q, k, positions)                   # RoPE
                bias = pos.bias(x, positions, layer, state)          # ALiBi, CABLE, ... (described)
                K, V, bias = cache.update(k, v, bias)                # new keys appended to the past
                h = h + Wo attention(q, K, V, bias, mask=mask.for_keys(K.shape[2], window))
                h = h + mlp(norm2(h))

With ``model.positions.layers`` the encoding is a layer schedule (positions/schedule.py): each block
first asks ``pos.at_layer(layer)`` for the encoding of its layer (the scheduled one or ``others``) and
calls that one's hooks, with the layer's index among that encoding's layers.

``positions`` (B, T) are explicit: the position of every *new* token. With a cache only the new
tokens and their positions are passed; keys are cached after rotation (RoPE rotates each key at its
own position once), and the bias hook's cumulative state lives in the cache (``state`` dict per layer).

``documents`` (B, T), optional, numbers the documents of a packed row (0, 0, 1, 1, 1, 2, ...): every
token then attends only to the earlier tokens of its own document (docs/packing.md). The cache keeps
the numbers of the tokens it holds; new tokens passed without numbers continue the last document.
A layer with a sliding window keeps only the keys its window can still reach (``LayerCache``).
Which keys each query sees (causal order, documents) is one ``AttentionMask`` per forward, built
in ``hidden_states`` and handed to every block; each layer takes its view of it (its keys, its window).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extrapos.attention import AttentionMask, attention
from extrapos.errors import UserError
from extrapos.losses import linear_cross_entropy_sum, masked_loss_sum
from extrapos.positions.base import Bias, EncodingContext, PositionalEncoding
from extrapos.positions.registry import spec
from extrapos.positions.schedule import Plan, build_positions, plan_positions

FLAVOURS = ("gpt2", "llama", "encoder")
ACTIVATIONS = ("gelu_tanh", "gelu", "silu", "relu")


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape and encoding. Frozen: a changed model is a new config
    (``dataclasses.replace``), so what is derived from it (the positions plan) is built once."""

    flavour: str = "gpt2"  # "gpt2" | "llama" | "encoder" (bidirectional, MLM head)
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None  # grouped-query attention (llama); None: n_heads
    vocab_size: int = 8192
    dropout: float = 0.0
    tie_embeddings: bool = True
    mlp_hidden: int | None = None  # None: gpt2 4d; llama 8d/3 rounded up to a multiple of 256
    bias: bool | None = None  # None: gpt2 yes, llama no
    train_length: int = 64  # L_t, passed to encodings via EncodingContext
    # the TOML table {"name": ..., **options} as written in config.toml (read-only: a copy is taken, and
    # the typed view of it is ``positions_plan()``)
    positions: dict[str, Any] = field(default_factory=lambda: {"name": "rope"})
    norm_eps: float = 1e-5
    init_std: float = 0.02
    activation: str | None = None  # None: gpt2 "gelu_tanh", llama "silu" (gated); see ACTIVATIONS
    parallel_residual: bool = False  # GPT-NeoX: h + attn(norm1 h) + mlp(norm2 h)
    embed_norm: bool = False  # Bloom: LayerNorm on the embeddings
    qkv_bias: bool | None = None  # None: as use_bias (Qwen2: True with bias False)
    post_norm: bool = False  # BERT / original Transformer: norm after each residual add, no final norm
    sliding_window: int | None = None  # W: key j visible from query i iff i - W < j <= i; None: full
    sliding_window_layers: list[int] | None = None  # the layers with the window; None: every layer

    def __post_init__(self) -> None:
        # the config's own copy of the table: a caller that changes its dict afterwards cannot make the
        # plan built from it stale
        if isinstance(self.positions, dict):
            object.__setattr__(self, "positions", copy.deepcopy(self.positions))

    # ---- derived ---------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def causal(self) -> bool:
        """Decoders attend to the past only; the encoder to every token."""
        return self.flavour != "encoder"

    @property
    def use_bias(self) -> bool:
        return self.flavour in ("gpt2", "encoder") if self.bias is None else self.bias

    @property
    def use_qkv_bias(self) -> bool:
        return self.use_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def act(self) -> str:
        if self.activation is not None:
            return self.activation
        return {"llama": "silu", "encoder": "gelu"}.get(self.flavour, "gelu_tanh")

    def window_at(self, layer: int) -> int | None:
        """The sliding window of block ``layer``, or None (full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.sliding_window_layers is not None and layer not in self.sliding_window_layers:
            return None
        return self.sliding_window

    @property
    def hidden(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.flavour != "llama":
            return 4 * self.d_model
        return 256 * math.ceil(int(8 * self.d_model / 3) / 256)  # Llama's multiple_of = 256

    def positions_plan(self) -> Plan:
        """``model.positions`` resolved (each encoding's ``Options`` built and checked, the layer schedule
        parsed): validation, the model, the exporters and the importer all read this typed plan rather
        than the raw table. A UserError names a refused option."""
        return self._positions_plan

    @functools.cached_property
    def _positions_plan(self) -> Plan:
        # built on first use (a bad table is refused by validate or by the model, as before) and once per
        # config: the config is frozen and holds its own copy of the table
        return plan_positions(self.positions, self.n_layers)

    def validate(self) -> ModelConfig:
        """Every rule of the model section, so ``model_config`` refuses what the CLI refuses (run/config.py
        keeps the rules between sections); an encoding's options check their own bounds (bounds.py)."""
        self._validate_sizes()
        if self.flavour not in FLAVOURS:
            raise UserError(f"unknown model flavour {self.flavour!r}; choose gpt2, llama or encoder.")
        for name in ("n_layers", "d_model", "n_heads", "vocab_size", "train_length"):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name} must be a positive integer, got {getattr(self, name)}.")
        if self.d_model % self.n_heads:
            raise UserError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; change one of them."
            )
        if self.n_heads % self.kv_heads:
            raise UserError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}.")
        if not 0 <= self.dropout < 1:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout}.")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise UserError(
                f"unknown activation {self.activation!r}; choose one of: {', '.join(ACTIVATIONS)}."
            )
        self._validate_window()
        if not isinstance(self.positions, dict) or "name" not in self.positions:
            raise UserError('model.positions must be a table with a "name" (e.g. {name = "rope"}).')
        plan = self.positions_plan()  # options and the layer schedule, if any
        for name in plan.names if not self.causal else ():
            reason = spec(name).cls.causal_only
            if reason:
                raise UserError(
                    f"the encoding {name!r} cannot be used by the encoder flavour "
                    f"(bidirectional attention): {reason}"
                )
        # accepted by the model, but the first step's loss would be NaN
        if not (math.isfinite(self.norm_eps) and 0 < self.norm_eps < 1):
            raise UserError(
                f"model.norm_eps must be a small positive number (e.g. 1e-5), got {self.norm_eps!r}."
            )
        return self

    def _validate_sizes(self) -> None:
        """The optional sizes and the initial scale, before the other checks divide by them."""
        for key in ("n_kv_heads", "mlp_hidden"):
            value = getattr(self, key)
            if not (value is None or value >= 1):
                raise UserError(f"model.{key} must be a positive integer (or left unset), got {value!r}.")
        # the weights are drawn from N(0, init_std^2): a negative deviation is refused by torch mid-build
        if not self.init_std >= 0:
            raise UserError(
                "model.init_std must be a non-negative standard deviation (e.g. 0.02), "
                f"got {self.init_std!r}."
            )

    def _validate_window(self) -> None:
        if self.sliding_window is None:
            if self.sliding_window_layers is not None:
                raise UserError(
                    "model.sliding_window_layers lists the layers of a sliding window, but "
                    "model.sliding_window is not set; set it or remove the list."
                )
            return
        if self.sliding_window < 1:
            raise UserError(f"model.sliding_window must be a positive integer, got {self.sliding_window}.")
        if not self.causal:
            raise UserError(
                "model.sliding_window is a causal window (each token sees its last W tokens); the encoder "
                "flavour attends both ways, so remove it."
            )
        layers = self.sliding_window_layers
        if layers is not None:
            bad = [i for i in layers if not 0 <= i < self.n_layers]
            if bad or len(set(layers)) != len(layers):
                raise UserError(
                    f"model.sliding_window_layers must list distinct layers in 0..{self.n_layers - 1}, "
                    f"got {layers}."
                )


# Size presets: ModelConfig field overrides. Parameter counts are in tests/model/test_model.py.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # CPU scale (the quick comparisons use cpu-small: 4 layers, d 128, L_t 64)
    "cpu-tiny": dict(flavour="gpt2", n_layers=2, d_model=64, n_heads=4, train_length=64),
    "cpu-small": dict(flavour="gpt2", n_layers=4, d_model=128, n_heads=4, train_length=64),
    "cpu-llama": dict(flavour="llama", n_layers=4, d_model=128, n_heads=4, train_length=64),
    # the CPU twin of bert-base; vocab: a bpe:8192 tokenizer plus the encoder's added special tokens
    "cpu-encoder": dict(
        flavour="encoder", n_layers=4, d_model=128, n_heads=4, vocab_size=8256, train_length=64
    ),
    # GPT-2 family (Radford et al. 2019; gpt2-tiny is a 6-layer d 512 model for quick GPU runs)
    "gpt2-tiny": dict(flavour="gpt2", n_layers=6, d_model=512, n_heads=8, train_length=256),
    "gpt2-small": dict(
        flavour="gpt2", n_layers=12, d_model=768, n_heads=12, vocab_size=50257, train_length=1024
    ),
    "gpt2-medium": dict(
        flavour="gpt2", n_layers=24, d_model=1024, n_heads=16, vocab_size=50257, train_length=1024
    ),
    # BERT-base (Devlin et al. 2019, §3: L 12, H 768, A 12; WordPiece vocab 30522; dropout 0.1), L_t 512 as
    # the CABLE paper's encoder experiment; pre-norm (set post_norm and embed_norm for BERT's blocks)
    "bert-base": dict(
        flavour="encoder",
        n_layers=12,
        d_model=768,
        n_heads=12,
        vocab_size=30522,
        dropout=0.1,
        train_length=512,
    ),
    # ExPE App. B, Table 6: 35M total / 23M non-embedding needs an untied head (vocab 32000, d 384)
    "expe-35m": dict(
        flavour="gpt2",
        n_layers=6,
        d_model=384,
        n_heads=12,
        vocab_size=32000,
        dropout=0.1,
        tie_embeddings=False,
        train_length=512,
    ),
    # ExPE App. C, Table 8 (Llama 3 architecture, Mistral tokenizer: vocab 32768). 135M needs the small
    # model's head untied; "the embedding weights of the medium models are shared" (§4.2): 342M.
    "llama-s": dict(
        flavour="llama",
        n_layers=12,
        d_model=768,
        n_heads=12,
        vocab_size=32768,
        tie_embeddings=False,
        train_length=512,
    ),
    "llama-m": dict(
        flavour="llama",
        n_layers=24,
        d_model=1024,
        n_heads=16,
        vocab_size=32768,
        tie_embeddings=True,
        train_length=512,
    ),
}


def model_config(preset: str | None = None, **overrides: Any) -> ModelConfig:
    """A ModelConfig from a size preset (or the defaults) plus field overrides."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise UserError(f"unknown model preset {preset!r}; choose one of: {', '.join(MODEL_PRESETS)}.")
        values.update(MODEL_PRESETS[preset])
    values.update(overrides)
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UserError(
            f"unknown model option {', '.join(unknown)}; model options are: {', '.join(sorted(names))}."
        )
    if "positions" in values:
        values["positions"] = dict(values["positions"])
    return ModelConfig(**values).validate()


# ---- KV cache ----------------------------------------------------------------------------------
class _Growing:
    """A tensor that grows along dim 2, with amortized O(1) appends (capacity doubles)."""

    def __init__(self) -> None:
        self.buf: Tensor | None = None
        self.n = 0

    def append(self, x: Tensor) -> Tensor:
        t = x.shape[2]
        if self.buf is None or self.buf.shape[:2] != x.shape[:2] or self.buf.shape[3:] != x.shape[3:]:
            if self.buf is not None and self.n:
                raise ValueError(f"cached shape {tuple(self.buf.shape)} does not match new {tuple(x.shape)}")
            self.buf, self.n = None, 0
        need = self.n + t
        if x.requires_grad:
            # decoding under autograd: in-place writes would invalidate tensors saved for backward
            self.buf = x if self.buf is None else torch.cat((self.buf[:, :, : self.n], x), dim=2)
            self.n = need
            return self.buf
        if self.buf is None or need > self.buf.shape[2]:
            cap = max(need, 2 * (self.buf.shape[2] if self.buf is not None else 0), 16)
            new = x.new_empty(*x.shape[:2], cap, *x.shape[3:])
            if self.buf is not None:
                new[:, :, : self.n] = self.buf[:, :, : self.n]
            self.buf = new
        self.buf[:, :, self.n : need] = x
        self.n = need
        return self.buf[:, :, :need]

    def keep_last(self, keep: int) -> None:
        """Forget all but the last ``keep`` entries, once at least max(keep, 16) of them are stale: the
        next append copies the kept ones into a buffer of twice their number, so the buffer stays
        within ~2 keep + 16 entries at amortized O(1) cost per append."""
        if self.buf is not None and self.n - keep >= max(keep, 16):
            self.buf, self.n = self.buf[:, :, self.n - keep : self.n], keep


class LayerCache:
    """One layer's past: rotated keys, values, the bias's key features and the bias hook's state. With
    a sliding ``window`` W only the last W - 1 keys before each update can still be seen (by the first
    new query), so the older ones are dropped (``_Growing.keep_last``): a windowed layer's cache holds
    O(W) keys however long the decoding."""

    def __init__(self, window: int | None = None) -> None:
        self.k, self.v, self.k_feat = _Growing(), _Growing(), _Growing()
        self.state: dict = {}
        self.window = window
        self.seen = 0  # tokens added so far (the cache may hold fewer)

    @property
    def length(self) -> int:
        return self.seen

    def update(self, k: Tensor, v: Tensor, bias: Bias | None) -> tuple[Tensor, Tensor, Bias | None]:
        """Append the new keys/values (and bias key features); return every key still visible (all of
        them without a window)."""
        if self.window is not None:
            for part in (self.k, self.v, self.k_feat):
                part.keep_last(self.window - 1)
        self.seen += k.shape[2]
        K, V = self.k.append(k), self.v.append(v)
        if bias is not None:
            # FoldedBias k_feat (B, H, Tk) and PairwiseBias k_feat (B, Hk, Tk, F): both grow along dim 2
            bias = dataclasses.replace(bias, k_feat=self.k_feat.append(bias.k_feat))
        return K, V, bias


class KVCache:
    """Per-layer caches for incremental decoding; pass the same object to every forward call."""

    def __init__(self, n_layers: int, windows: list[int | None] | None = None) -> None:
        self.layers = [LayerCache(windows[i] if windows else None) for i in range(n_layers)]
        self._documents = _Growing()  # (B, 1, Tk, 1): the document number of every cached token

    def documents(self, new: Tensor | None, batch: int, n_new: int) -> Tensor | None:
        """The document numbers of every key once ``n_new`` tokens are added (B, Tk), or None when no
        token ever had one. New tokens without numbers continue the last cached document."""
        held = self._documents.n
        if new is None:
            if not held:
                return None
            assert self._documents.buf is not None  # held > 0
            last = self._documents.buf[:, :, held - 1 : held]
            new = last.expand(batch, 1, n_new, 1)
        else:
            if self.length and not held:
                raise ValueError(
                    "the cache holds tokens without document numbers; pass documents from the first call"
                )
            new = new.view(batch, 1, n_new, 1)
        return self._documents.append(new)[:, 0, :, 0]

    @property
    def length(self) -> int:
        """Number of tokens already cached."""
        return self.layers[0].length

    def __len__(self) -> int:
        return self.length


# ---- blocks ------------------------------------------------------------------------------------
def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.flavour == "llama":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.use_bias)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None = None):
        super().__init__()
        self.causal = cfg.causal
        self.window = window  # a sliding window of this layer (cfg.window_at), None: full attention
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_out = cfg.n_heads * cfg.head_dim
        self.kv_out = cfg.kv_heads * cfg.head_dim
        # one fused projection [Wq; Wk; Wv]: a single matmul when Q/K and V read the same input
        self.qkv = nn.Linear(cfg.d_model, self.q_out + 2 * self.kv_out, bias=cfg.use_qkv_bias)
        self.proj = nn.Linear(self.q_out, cfg.d_model, bias=cfg.use_bias)
        self.dropout = cfg.dropout
        # an optional observer of what this layer attends with: called as capture(q, k, v, bias, documents)
        # just before attention, after the encoding's transforms and the cache (evaluate/attention_stats.py
        # reads the attention weights from them); it must not modify them, so the forward stays bit-identical
        self.capture: Callable[[Tensor, Tensor, Tensor, Any, Tensor | None], None] | None = None

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        layer: int,
        pos: PositionalEncoding,
        cache: LayerCache | None,
        mask: AttentionMask | None = None,
    ) -> Tensor:
        B, T, _ = x.shape
        pos, layer = pos.at_layer(layer)  # a layer schedule's encoding of this layer (positions/schedule.py)
        xq, xv = pos.attn_input(x, positions, layer)
        if xq is xv:
            q, k, v = self.qkv(xq).split((self.q_out, self.kv_out, self.kv_out), dim=-1)
        else:
            qk_rows = self.q_out + self.kv_out
            w, b = self.qkv.weight, self.qkv.bias
            q, k = F.linear(xq, w[:qk_rows], None if b is None else b[:qk_rows]).split(
                (self.q_out, self.kv_out), dim=-1
            )
            v = F.linear(xv, w[qk_rows:], None if b is None else b[qk_rows:])
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = pos.rotate(q, k, positions)
        bias = pos.bias(x, positions, layer, cache.state if cache is not None else None)
        if cache is not None:
            k, v, bias = cache.update(k, v, bias)
        if mask is None:  # a block called on its own, without the model's mask: every key of its input
            mask = AttentionMask(T, k.shape[2], causal=self.causal, window=self.window)
        else:  # this layer's view of the forward's mask (a windowed cache holds the last keys only)
            mask = mask.for_keys(k.shape[2], self.window)
        if self.capture is not None:
            self.capture(q, k, v, bias, mask.documents)
        dropout = self.dropout if self.training else 0.0
        y = attention(q, k, v, bias, dropout, mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, self.q_out))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.swiglu = cfg.flavour == "llama"
        if self.swiglu:
            self.gate = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.use_bias)
        self.up = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.use_bias)
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=cfg.use_bias)
        self.act = cfg.act

    def _act(self, x: Tensor) -> Tensor:
        if self.act == "gelu_tanh":
            return F.gelu(x, approximate="tanh")  # GPT-2's gelu_new
        if self.act == "gelu":
            return F.gelu(x)
        if self.act == "silu":
            return F.silu(x)
        return F.relu(x)

    def forward(self, x: Tensor) -> Tensor:
        if self.swiglu:
            return self.down(self._act(self.gate(x)) * self.up(x))
        return self.down(self._act(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.norm1, self.norm2 = _norm(cfg), _norm(cfg)
        self.attn = Attention(cfg, cfg.window_at(layer))
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.parallel = cfg.parallel_residual
        self.post_norm = cfg.post_norm

    def forward(
        self,
        h: Tensor,
        positions: Tensor,
        pos: PositionalEncoding,
        cache: LayerCache | None,
        mask: AttentionMask | None = None,
    ) -> Tensor:
        if self.post_norm:
            h = self.norm1(h + self.drop(self.attn(h, positions, self.layer, pos, cache, mask)))
            return self.norm2(h + self.drop(self.mlp(h)))
        if self.parallel:
            a = self.drop(self.attn(self.norm1(h), positions, self.layer, pos, cache, mask))
            return h + a + self.drop(self.mlp(self.norm2(h)))
        h = h + self.drop(self.attn(self.norm1(h), positions, self.layer, pos, cache, mask))
        return h + self.drop(self.mlp(self.norm2(h)))


class MLMHead(nn.Module):
    """BERT's prediction-head transform (Devlin et al. 2019, App. A.1; HF ``BertPredictionHeadTransform``):
    dense d -> d, GELU, LayerNorm, before the (tied) output embedding; plus the output bias it adds."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.use_bias)
        self.norm = _norm(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        return self.norm(F.gelu(self.dense(h)))


# ---- the model ---------------------------------------------------------------------------------
class Decoder(nn.Module):
    """The LM of every flavour (the name is historical: ``flavour = "encoder"`` makes it bidirectional
    with an MLM head). ``forward(tokens, positions, cache=None)`` -> logits (B, T, V)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg.validate()
        self.pos: PositionalEncoding = build_positions(cfg.positions_plan(), EncodingContext.of(cfg))
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.embed_norm:  # created only when asked: default models keep their parameters and RNG stream
            self.emb_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.use_bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        # post-norm blocks end normalised; modules are created only when used, so the decoders keep
        # their parameters and RNG stream
        self.norm = nn.Identity() if cfg.post_norm else _norm(cfg)
        if not cfg.causal:
            self.mlm_head = MLMHead(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 / Llama init: N(0, 0.02) weights, zero biases, unit norms; the residual output projections
        (attention out, MLP down) use 0.02 / sqrt(2 n_layers). The positional encoding keeps its own init."""
        std = self.cfg.init_std
        for name, module in self.named_modules():
            if name.startswith("pos"):
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                residual = name.endswith("attn.proj") or name.endswith("mlp.down")
                nn.init.normal_(
                    module.weight, 0.0, std / math.sqrt(2 * self.cfg.n_layers) if residual else std
                )
                if (bias := getattr(module, "bias", None)) is not None:
                    nn.init.zeros_(bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
                if (bias := getattr(module, "bias", None)) is not None:
                    nn.init.zeros_(bias)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers, [self.cfg.window_at(i) for i in range(self.cfg.n_layers)])

    def hidden_states(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache | None = None,
        documents: Tensor | None = None,
    ) -> Tensor:
        """Final-normed hidden states (B, T, d) of the new tokens; ``documents`` (B, T) keeps attention
        inside each document of a packed row (module docstring)."""
        if tokens.shape != positions.shape:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} differ in shape"
            )
        if documents is not None and documents.shape != tokens.shape:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and documents {tuple(documents.shape)} differ in shape"
            )
        if cache is not None and not self.cfg.causal:
            raise UserError(
                "an encoder attends to every token of its input, so it has no KV cache and no "
                "incremental decoding; call it on the whole sequence."
            )
        h = self.pos.embed(self.tok_emb(tokens), positions)
        if self.cfg.embed_norm:
            h = self.emb_norm(h)
        h = self.drop(h)
        n_keys = tokens.shape[1]
        if cache is not None:
            n_keys += cache.length
            documents = cache.documents(documents, *tokens.shape)
        # which keys each query sees, worked out once for every layer (documents checked here, once)
        mask = AttentionMask.for_forward(tokens.shape[1], n_keys, causal=self.cfg.causal, documents=documents)
        for i, block in enumerate(self.blocks):
            h = block(h, positions, self.pos, cache.layers[i] if cache is not None else None, mask)
        return self.norm(h)

    def logits(self, h: Tensor) -> Tensor:
        if self.cfg.causal:
            return self.lm_head(h)
        return self.lm_head(self.mlm_head(h)) + self.mlm_head.bias

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache | None = None,
        targets: Tensor | None = None,
        loss_mask: Tensor | None = None,
        fused: bool = True,
        documents: Tensor | None = None,
    ) -> Tensor:
        """The logits (B, T, V); with ``targets`` and ``loss_mask``, the masked loss sum instead;
        ``documents`` (B, T): a document mask (``hidden_states``).

        The loss is computed here, inside ``forward``, so that a DDP / FSDP2 / compiled wrapper runs it
        with its hooks and every setup gets the head fused with the loss (losses.py): a decoder's head
        is a bare linear layer, so outside autocast its logits are never all materialized.
        """
        h = self.hidden_states(tokens, positions, cache, documents)
        if targets is None:
            return self.logits(h)
        if loss_mask is None:
            raise ValueError("a loss needs loss_mask beside targets")
        head, device = self.lm_head, h.device.type
        if fused and self.cfg.causal and head.bias is None:
            if not torch.is_autocast_enabled(device):
                return linear_cross_entropy_sum(h, head.weight, targets, loss_mask)
            bf16 = torch.get_autocast_dtype(device) == torch.bfloat16
            if device == "cpu" and bf16 and h.dtype != torch.float64:
                # bf16 autocast on a CPU: the head's matmuls in bf16 as autocast would run them, without
                # the (B, T, V) fp32 logits, their log-softmax and its backward, which made the head + loss
                # as slow as fp32's on cpu-small (docs/results/cpu-profile.md)
                with torch.autocast(device, enabled=False):
                    return linear_cross_entropy_sum(
                        h.float(), head.weight, targets, loss_mask, matmul_dtype=torch.bfloat16
                    )
        return masked_loss_sum(self.logits(h), targets, loss_mask)


# ---- accounting --------------------------------------------------------------------------------
def count_parameters(model: Decoder) -> dict[str, int]:
    """Parameter counts (shared tensors counted once).

    total; embedding: the token table plus a learned absolute position table if any; non_embedding:
    total - embedding (an untied output head counts as non-embedding, as in ExPE App. B: 35M total,
    23M non-embedding); positional: the learnable parameters of the positional encoding.
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    positional = sum(p.numel() for p in model.pos.parameters())
    table = getattr(model.pos, "table", None)
    embedding = model.tok_emb.weight.numel() + (table.numel() if isinstance(table, nn.Parameter) else 0)
    return {
        "total": total,
        "embedding": embedding,
        "non_embedding": total - embedding,
        "positional": positional,
    }


def matmul_parameters(cfg: ModelConfig) -> int:
    """Weights that multiply every token: attention and MLP matrices plus the output head (tied or not)."""
    d, dh = cfg.d_model, cfg.head_dim
    attn = d * (cfg.n_heads + 2 * cfg.kv_heads) * dh + cfg.n_heads * dh * d
    mlp = (3 if cfg.flavour == "llama" else 2) * d * cfg.hidden
    head = 0 if cfg.causal else d * d  # the encoder's MLM head transform
    return cfg.n_layers * (attn + mlp) + d * cfg.vocab_size + head


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) at sequence length seq_len.

    6 N + 12 n_layers d_attn T (PaLM, Chowdhery et al. 2022, App. B): N = matmul_parameters(cfg), the
    weights each token is multiplied by (2 FLOPs per weight forward, 4 backward); the attention term
    is q k^T and (softmax) v, 2 T d_attn FLOPs each per token per layer forward, x3 for training,
    counted without the causal halving as is customary. Norms, biases, softmax and the positional
    encoding's own arithmetic (small: RoPE, ALiBi, ExPE, CABLE's d x h projections) are ignored.
    """
    d_attn = cfg.n_heads * cfg.head_dim
    return 6.0 * matmul_parameters(cfg) + 12.0 * cfg.n_layers * d_attn * seq_len
