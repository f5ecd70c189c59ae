"""extrapos against its peer libraries on matched shapes: training step, evaluation and cached decoding.

Each *pair* puts an extrapos model next to a peer library's model of the same block (norms, MLP,
biases, tied embeddings) and the same positional encoding, so the parameter counts match and the
only difference left is the implementation:

======================  ===========================================  =======================================
encoding                peer                                         extrapos model
======================  ===========================================  =======================================
learned absolute        transformers ``GPT2LMHeadModel``             gpt2 flavour, ``learned`` table
RoPE                    transformers ``LlamaForCausalLM``            llama flavour, ``rope``
RoPE                    transformers ``GPTNeoXForCausalLM``          gpt2 flavour, parallel residual, erf GELU
ALiBi                   transformers ``BloomForCausalLM``            gpt2 flavour, embedding LayerNorm
RoPE                    litgpt ``GPT`` (LLaMA MLP, RMSNorm)          llama flavour, ``rope``
RoPE / ALiBi / T5 /     x-transformers ``TransformerWrapper``        llama flavour (RMSNorm, SwiGLU, no
learned absolute        (``attn_flash``, RMSNorm, SwiGLU)            biases), the same encoding
======================  ===========================================  =======================================

Hugging Face's T5 has no decoder-only model: ``T5Stack(is_decoder=True)`` carries a cross-attention
block in every layer, so there is no matched decoder-only T5 in transformers (``UNMATCHED``);
x-transformers' ``rel_pos_bias`` is T5's bias in a decoder.

Three measurements, every one of them interleaved (round r runs every model once, in an order that
rotates with r), so a noisy machine slows both sides of a pair alike:

- the training step: forward + backward + fused AdamW, fp32; each side with its usual loss (extrapos
  the trainer's head fused with the loss, a peer its logits and an fp32 cross-entropy);
- evaluation: a no-grad forward to the final-normed hidden states (no output head) at each multiple
  of L_t, its time, and its peak memory: the growth of the kernel's resident-set high-water mark
  (``VmHWM``, reset through ``/proc/self/clear_refs``) over the resident set before the forward, in a
  fresh child process per model (CPU torch has no allocator counter, and ``tracemalloc`` does not see
  torch's allocations);
- cached decoding: ms per generated token after a prompt, prefill and the first steps untimed.

A pair's ratio is extrapos' median over the peer's (below 1: extrapos is faster); since both sides run
in the same rounds, the per-round ratios show the noise, and a difference is beyond noise when every
per-round ratio falls on the same side of 1.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extrapos.errors import UserError
from extrapos.losses import model_loss_sum
from extrapos.model import Decoder, count_parameters, model_config

if TYPE_CHECKING:  # the peer libraries are imported when a pair is built (they are optional)
    from litgpt.model import GPT
    from transformers import PreTrainedModel

#: how to install each peer library (the line a skipped peer prints)
INSTALL = {
    "transformers": "pip install transformers (or extrapos' hf extra)",
    "x-transformers": "pip install x-transformers",
    "litgpt": "pip install litgpt",
}
#: the module each peer library is imported as
MODULES = {"transformers": "transformers", "x-transformers": "x_transformers", "litgpt": "litgpt"}

#: encodings a peer library has no matched decoder-only model for, and why
UNMATCHED = {
    ("transformers", "t5"): "transformers' T5 has no decoder-only model (T5Stack as a decoder carries a "
    "cross-attention block in every layer); x-transformers' rel_pos_bias is T5's bias in a decoder",
    ("litgpt", "alibi"): "litgpt has no ALiBi",
    ("litgpt", "t5"): "litgpt has no T5 relative bias",
    ("litgpt", "learned"): "litgpt has no learned absolute positions",
}


@dataclass(frozen=True)
class PeerShape:
    """The one shape every pair shares (issue 28's: d 256 x 4 layers, batch 8 x 256)."""

    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int = 768  # the llama-style blocks' SwiGLU width; gpt2-style blocks use 4 d (GPT-2, Bloom)
    vocab: int = 8192
    batch: int = 8
    train_length: int = 256  # L_t
    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)  # evaluation lengths, x L_t
    context: int = 1024  # the prompt before cached decoding
    new_tokens: int = 32  # timed decoding steps per round
    warm_tokens: int = 4  # decoding steps after the prefill, untimed

    @property
    def max_length(self) -> int:
        """The longest position any measurement reaches: learned tables and peers' limits cover it."""
        return max(max(self.multiples) * self.train_length, self.context + self.warm_tokens + self.new_tokens)

    def validate(self) -> PeerShape:
        for name in ("d_model", "n_layers", "n_heads", "mlp_hidden", "vocab", "batch", "train_length"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise UserError(
                f"d_model {self.d_model} must split into {self.n_heads} heads of an even size (RoPE); "
                "change --d-model or --heads."
            )
        if not self.multiples or min(self.multiples) < 1:
            raise UserError(f"--multiples must be positive integers, got {list(self.multiples)}.")
        if self.context < 1 or self.new_tokens < 1:
            raise UserError("--context and --new-tokens must be positive integers.")
        return self


# ---- one side of a pair: a model and the three things measured on it -----------------------------


class Side:
    """A model and how its library trains, evaluates and decodes it, as the library's users do."""

    library = ""

    def __init__(self, label: str, module: nn.Module):
        self.label, self.module = label, module

    def parameters(self) -> int:
        """Parameters, tied tensors counted once."""
        return sum(p.numel() for p in {id(p): p for p in self.module.parameters()}.values())

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = self.logits(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def logits(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def hidden(self, tokens: Tensor) -> Tensor:
        """Final-normed hidden states of a (1, T) batch, no output head."""
        raise NotImplementedError

    def prefill(self, tokens: Tensor, total: int) -> Any:
        """A cache holding ``tokens`` (1, T), ready for ``total`` tokens in all."""
        raise NotImplementedError

    def step(self, cache: Any, token: Tensor, position: int) -> Tensor:
        """The logits (1, 1, V) of one new token at ``position``, appended to ``cache``."""
        raise NotImplementedError

    def end_decoding(self) -> None:
        """Undo what decoding set on the model (litgpt keeps its cache and length limit on it)."""


class ExtraposSide(Side):
    library = "extrapos"
    module: Decoder

    def __init__(self, label: str, module: Decoder):
        super().__init__(label, module)

    def parameters(self) -> int:
        return count_parameters(self.module)["total"]

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        # the trainer's loss: the head fused with the cross-entropy, block by block (losses.py)
        pos = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        mask = torch.ones(y.shape)
        return model_loss_sum(self.module, x, pos, y, mask) / mask.numel()

    def logits(self, x: Tensor) -> Tensor:
        return self.module(x, torch.arange(x.shape[1]).expand(x.shape[0], -1))

    def hidden(self, tokens: Tensor) -> Tensor:
        return self.module.hidden_states(tokens, torch.arange(tokens.shape[1]).unsqueeze(0))

    def prefill(self, tokens: Tensor, total: int) -> Any:
        cache = self.module.new_cache()
        self.module.hidden_states(tokens, torch.arange(tokens.shape[1]).unsqueeze(0), cache)
        return cache

    def step(self, cache: Any, token: Tensor, position: int) -> Tensor:
        return self.module(token, torch.tensor([[position]]), cache)


class TransformersSide(Side):
    library = "transformers"
    module: PreTrainedModel

    def logits(self, x: Tensor) -> Tensor:
        return self.module(input_ids=x, use_cache=False).logits

    def hidden(self, tokens: Tensor) -> Tensor:
        return self.module.base_model(input_ids=tokens, use_cache=False).last_hidden_state

    def prefill(self, tokens: Tensor, total: int) -> Any:
        return getattr(self.module(input_ids=tokens, use_cache=True), hf_cache_name(self.module))

    def step(self, cache: Any, token: Tensor, position: int) -> Tensor:
        return self.module(input_ids=token, use_cache=True, **{hf_cache_name(self.module): cache}).logits


def hf_cache_name(module: Any) -> str:
    """The name of a transformers model's KV cache, as forward's argument and in its output: ``cache``
    from transformers 5.24, which deprecates the earlier ``past_key_values`` (removal announced)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class XTransformersSide(Side):
    library = "x-transformers"

    def logits(self, x: Tensor) -> Tensor:
        return self.module(x)

    def hidden(self, tokens: Tensor) -> Tensor:
        return self.module(tokens, return_embeddings=True)

    def prefill(self, tokens: Tensor, total: int) -> Any:
        return self.module(tokens, return_intermediates=True)[1]

    def step(self, cache: Any, token: Tensor, position: int) -> Tensor:
        # only the new token goes in (its position is the cache's length): what AutoregressiveWrapper does
        # with input_not_include_cache, minus re-embedding the whole sequence
        logits, new = self.module(token, cache=cache, return_intermediates=True, input_not_include_cache=True)
        cache.__dict__.update(new.__dict__)
        return logits


class LitGPTSide(Side):
    library = "litgpt"
    module: GPT  # litgpt ships no type information: Any to the type checker

    def logits(self, x: Tensor) -> Tensor:
        return self.module(x)

    def hidden(self, tokens: Tensor) -> Tensor:
        head, self.module.lm_head = self.module.lm_head, nn.Identity()
        try:
            return self.module(tokens)
        finally:
            self.module.lm_head = head

    def prefill(self, tokens: Tensor, total: int) -> Any:
        m = self.module
        m.max_seq_length = total
        m.set_kv_cache(batch_size=1, max_seq_length=total)
        m(tokens, input_pos=torch.arange(tokens.shape[1]))
        return m

    def step(self, cache: Any, token: Tensor, position: int) -> Tensor:
        return self.module(token, input_pos=torch.tensor([position]))

    def end_decoding(self) -> None:
        self.module.clear_kv_cache()
        self.module.max_seq_length = self.module.config.block_size


# ---- the models of each pair ------------------------------------------------------------------------


def _extrapos(shape: PeerShape, block: str, encoding: str) -> ExtraposSide:
    """extrapos with one of the peers' blocks: ``llama`` (RMSNorm, SwiGLU, no biases), ``gpt2``
    (LayerNorm, GELU tanh, biases), ``bloom`` (gpt2 + embedding LayerNorm), ``neox`` (gpt2 with a parallel
    residual, the erf GELU and an untied head)."""
    positions: dict[str, Any] = {"name": encoding}
    if encoding == "learned":
        positions["max_length"] = shape.max_length
    common: dict[str, Any] = dict(
        n_layers=shape.n_layers,
        d_model=shape.d_model,
        n_heads=shape.n_heads,
        vocab_size=shape.vocab,
        train_length=shape.train_length,
        positions=positions,
        tie_embeddings=True,
    )
    blocks: dict[str, dict[str, Any]] = {
        "llama": dict(flavour="llama", mlp_hidden=shape.mlp_hidden),
        "gpt2": dict(flavour="gpt2"),
        "bloom": dict(flavour="gpt2", embed_norm=True),
        "neox": dict(flavour="gpt2", parallel_residual=True, activation="gelu", tie_embeddings=False),
    }
    cfg = model_config(**(common | blocks[block]))
    return ExtraposSide(f"extrapos {block} + {encoding}", Decoder(cfg))


def _hf_llama(shape: PeerShape) -> Side:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.d_model,
        intermediate_size=shape.mlp_hidden,
        num_hidden_layers=shape.n_layers,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_heads,
        max_position_embeddings=shape.max_length,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
    )
    m = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return TransformersSide("transformers LlamaForCausalLM", m)


def _hf_gpt2(shape: PeerShape) -> Side:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=shape.vocab,
        n_positions=shape.max_length,
        n_embd=shape.d_model,
        n_layer=shape.n_layers,
        n_head=shape.n_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    m = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return TransformersSide("transformers GPT2LMHeadModel", m)


# transformers 4 names the rotated share of a GPT-NeoX head rotary_pct (default 0.25) and 5 reads that name
# into rope_parameters: passed from a table so the signature of either release takes it
_WHOLE_HEAD_ROTATED: dict[str, Any] = {"rotary_pct": 1.0}


def _hf_neox(shape: PeerShape) -> Side:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.d_model,
        num_hidden_layers=shape.n_layers,
        num_attention_heads=shape.n_heads,
        intermediate_size=4 * shape.d_model,
        max_position_embeddings=shape.max_length,
        use_parallel_residual=True,
        **_WHOLE_HEAD_ROTATED,
        hidden_act="gelu",
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tie_word_embeddings=False,
    )
    m = GPTNeoXForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return TransformersSide("transformers GPTNeoXForCausalLM", m)


def _hf_bloom(shape: PeerShape) -> Side:
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.d_model,
        n_layer=shape.n_layers,
        n_head=shape.n_heads,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tie_word_embeddings=True,
    )
    m = BloomForCausalLM._from_config(cfg, dtype=torch.float32)
    return TransformersSide("transformers BloomForCausalLM", m)


def _xt(shape: PeerShape, encoding: str) -> Side:
    from x_transformers import Decoder as XDecoder
    from x_transformers import TransformerWrapper

    head_dim = shape.d_model // shape.n_heads
    by_encoding: dict[str, dict[str, Any]] = {
        "rope": dict(rotary_pos_emb=True, rotary_emb_dim=head_dim),  # the whole head rotated, as extrapos
        "alibi": dict(alibi_pos_bias=True, alibi_num_heads=shape.n_heads),
        "t5": dict(rel_pos_bias=True),  # 32 buckets up to distance 128, one table shared by the layers
        "learned": {},
    }
    options = by_encoding[encoding]
    layers = XDecoder(
        dim=shape.d_model,
        depth=shape.n_layers,
        heads=shape.n_heads,
        attn_dim_head=head_dim,
        # its fastest path (torch's scaled_dot_product_attention), which T5's bias does not allow
        attn_flash=encoding != "t5",
        use_rmsnorm=True,
        ff_glu=True,
        ff_swish=True,
        ff_no_bias=True,
        ff_mult=shape.mlp_hidden / shape.d_model,
        **options,
    )
    m = TransformerWrapper(
        num_tokens=shape.vocab,
        max_seq_len=shape.max_length,
        attn_layers=layers,
        tie_embedding=True,
        use_abs_pos_emb=encoding == "learned",
    )
    return XTransformersSide(f"x-transformers TransformerWrapper ({encoding})", m)


def _litgpt(shape: PeerShape) -> Side:
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(
        block_size=shape.max_length,
        n_layer=shape.n_layers,
        n_embd=shape.d_model,
        n_head=shape.n_heads,
        n_query_groups=shape.n_heads,
        vocab_size=shape.vocab,
        padded_vocab_size=shape.vocab,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-5,
        mlp_class_name="LLaMAMLP",
        intermediate_size=shape.mlp_hidden,
        rotary_percentage=1.0,
        parallel_residual=False,
    )
    m = GPT(cfg)
    m.lm_head.weight = m.transformer.wte.weight  # litgpt unties; tied here to match extrapos (and Llama)
    return LitGPTSide("litgpt GPT (LLaMA blocks)", m)


def _xt_builder(encoding: str) -> Callable[[PeerShape], Side]:
    return lambda shape: _xt(shape, encoding)


@dataclass(frozen=True)
class Pair:
    """An extrapos model (``block`` + ``encoding``) against one peer library's model."""

    peer: str  # library
    encoding: str
    block: str
    build_peer: Callable[[PeerShape], Side]
    default: bool = True  # measured unless pairs are asked for by name (--all-pairs)

    @property
    def name(self) -> str:
        return f"{self.peer}/{self.block}/{self.encoding}"

    @property
    def extrapos_key(self) -> str:
        return f"extrapos/{self.block}/{self.encoding}"


PAIRS = [
    Pair("transformers", "rope", "llama", _hf_llama),
    # a second RoPE model of transformers (the parallel-residual block), off by default to keep a run short
    Pair("transformers", "rope", "neox", _hf_neox, default=False),
    Pair("transformers", "alibi", "bloom", _hf_bloom),
    Pair("transformers", "learned", "gpt2", _hf_gpt2),
    Pair("litgpt", "rope", "llama", _litgpt),
    *(Pair("x-transformers", enc, "llama", _xt_builder(enc)) for enc in ("rope", "alibi", "t5", "learned")),
]


def peer_available(library: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(MODULES[library]) is not None


def skip_line(library: str) -> str:
    """The one line a run prints for a peer library that is not installed."""
    return f"{library} is not installed, its pairs are skipped: {INSTALL[library]}"


def select_pairs(
    peers: list[str] | None = None,
    encodings: list[str] | None = None,
    every: bool = False,
    available: Callable[[str], bool] | None = None,
) -> tuple[list[Pair], list[str]]:
    """The pairs to measure (``every``: the ones off by default too) and a skip line per asked-for
    library that is not installed."""
    available = available or peer_available
    libraries = list(INSTALL)
    for p in peers or ():
        if p not in libraries:
            raise UserError(f"unknown peer {p!r}; choose from: {', '.join(libraries)}.")
    known = sorted({p.encoding for p in PAIRS})
    for e in encodings or ():
        if e not in known:
            raise UserError(f"no peer pair for the encoding {e!r}; choose from: {', '.join(known)}.")
    wanted = [
        p
        for p in PAIRS
        if (every or p.default)
        and (not peers or p.peer in peers)
        and (not encodings or p.encoding in encodings)
    ]
    missing = [lib for lib in libraries if any(p.peer == lib for p in wanted) and not available(lib)]
    return [p for p in wanted if p.peer not in missing], [skip_line(lib) for lib in missing]


def build_side(key: str, shape: PeerShape, seed: int = 0) -> Side:
    """The model a key names: ``extrapos/<block>/<encoding>`` or a pair's name, seeded."""
    torch.manual_seed(seed)
    if key.startswith("extrapos/"):
        _, block, encoding = key.split("/")
        side: Side = _extrapos(shape, block, encoding)
    else:
        side = next(p for p in PAIRS if p.name == key).build_peer(shape)
    return side


def side_keys(pairs: list[Pair]) -> list[str]:
    """Every model the pairs need, once (several peers share one extrapos model)."""
    keys: list[str] = []
    for p in pairs:
        for k in (p.extrapos_key, p.name):
            if k not in keys:
                keys.append(k)
    return keys


# ---- statistics ------------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method) and extremes of the rounds."""
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"median": med, "q1": q1, "q3": q3, "min": min(values), "max": max(values), "n": len(values)}


def pair_ratio(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """extrapos' median over the peer's, and the per-round ratios (the same rounds on both sides): beyond
    noise when all of them fall on the same side of 1 (below 1: extrapos is faster)."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError("a pair's two sides need the same number of rounds")
    rounds = [a / b for a, b in zip(ours, theirs)]
    ratio = statistics.median(ours) / statistics.median(theirs)
    return {
        "ratio": ratio,
        "round_min": min(rounds),
        "round_max": max(rounds),
        "beyond_noise": max(rounds) < 1 or min(rounds) > 1,
    }


def interleave(keys: list[str], rounds: int, fn: Callable[[str], float]) -> dict[str, list[float]]:
    """fn(key) -> seconds for every key, ``rounds`` rounds, the order rotating every round."""
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            times[k].append(fn(k))
    return times


# ---- the measurements ------------------------------------------------------------------------------


def measure_training(
    sides: dict[str, Side], shape: PeerShape, rounds: int, tick: Callable[[], object]
) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.train_length + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    opts = {k: torch.optim.AdamW(s.module.parameters(), lr=1e-4, fused=True) for k, s in sides.items()}
    for s in sides.values():
        s.module.train()

    def step(key: str) -> float:
        t0 = time.perf_counter()
        sides[key].loss(x, y).backward()
        opts[key].step()
        opts[key].zero_grad(set_to_none=True)
        tick()
        return time.perf_counter() - t0

    for k in sides:  # warm-up: AdamW state, first-call allocations
        step(k)
    return interleave(list(sides), rounds, step)


@torch.no_grad()
def measure_eval(
    sides: dict[str, Side], shape: PeerShape, rounds: int, tick: Callable[[], object]
) -> dict[int, dict[str, list[float]]]:
    for s in sides.values():
        s.module.eval()
    g = torch.Generator().manual_seed(1)
    out = {}
    for k in shape.multiples:
        tokens = torch.randint(0, shape.vocab, (1, k * shape.train_length), generator=g)

        def forward(key: str, tokens: Tensor = tokens) -> float:
            t0 = time.perf_counter()
            sides[key].hidden(tokens)
            tick()
            return time.perf_counter() - t0

        if k == shape.multiples[0]:  # warm-up: lazy inits and first-call allocations out of the timings
            for key in sides:
                forward(key)
        out[k] = interleave(list(sides), rounds, forward)
    return out


@torch.no_grad()
def decode_seconds(side: Side, prompt: Tensor, shape: PeerShape) -> float:
    """Seconds per cached decoding step after ``prompt`` (1, T): prefill and the first
    ``warm_tokens`` steps untimed (the cache's buffers grow and fault in there)."""
    n = prompt.shape[1]
    cache = side.prefill(prompt, n + shape.warm_tokens + shape.new_tokens)
    token = prompt[:, -1:]
    for i in range(shape.warm_tokens + shape.new_tokens):
        if i == shape.warm_tokens:
            t0 = time.perf_counter()
        token = side.step(cache, token, n + i)[:, -1:].argmax(-1)
    sec = (time.perf_counter() - t0) / shape.new_tokens
    side.end_decoding()
    return sec


def measure_decode(
    sides: dict[str, Side], shape: PeerShape, rounds: int, tick: Callable[[], object]
) -> dict[str, list[float]]:
    for s in sides.values():
        s.module.eval()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, shape.vocab, (1, shape.context), generator=g)

    def run(key: str) -> float:
        sec = decode_seconds(sides[key], prompt, shape)
        tick()
        return sec

    for key in sides:
        run(key)
    return interleave(list(sides), rounds, run)


# ---- peak memory, in a fresh process per model -------------------------------------------------------


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def hwm_available() -> bool:
    """Whether this kernel lets a process reset its resident-set high-water mark (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_kb("VmHWM")
        return True
    except OSError:
        return False


def peak_growth_mb(fn: Callable[[], Any]) -> float:
    """The resident-set high-water mark during ``fn()`` minus the resident set before it, in MiB: the
    kernel's own peak, so no allocation is missed between samples."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) / 1024


def memory_child(key: str, shape: PeerShape, threads: int) -> dict[str, float]:
    """Peak growth (MiB) of each evaluation length, shortest first, in this (fresh) process."""
    torch.set_num_threads(threads)
    side = build_side(key, shape)
    side.module.eval()
    g = torch.Generator().manual_seed(1)
    out = {}
    with torch.no_grad():
        side.hidden(torch.randint(0, shape.vocab, (1, 16), generator=g))  # lazy inits out of the peak
        for k in sorted(shape.multiples):
            tokens = torch.randint(0, shape.vocab, (1, k * shape.train_length), generator=g)
            out[str(k)] = peak_growth_mb(functools.partial(side.hidden, tokens))
    return out


def measure_memory(
    keys: list[str], shape: PeerShape, threads: int, tick: Callable[[], object]
) -> dict[str, dict[str, float]]:
    out = {}
    for key in keys:
        spec = json.dumps({"key": key, "shape": dataclasses.asdict(shape), "threads": threads})
        # glibc hands blocks above this size back to the kernel when freed, so a shorter length's freed
        # buffers never hide a longer length's growth (the same setting as extrapos bench)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        cmd = [sys.executable, "-m", "extrapos.bench.peers", "--memory-child", spec]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the memory measurement of {key} failed:\n{proc.stderr[-2000:]}")
        out[key] = json.loads(proc.stdout.strip().splitlines()[-1])
        tick()
    return out


# ---- the whole run ------------------------------------------------------------------------------------


def library_versions() -> dict[str, str]:
    import importlib.metadata

    out = {"torch": str(torch.__version__)}
    for lib in INSTALL:
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


PHASES = ("train_s", "decode_s", "eval_s", "eval_peak_mb")  # in the order they run: memory last


#: a pair row's ratio entry -> the model field it is computed from
RATIO_FIELDS = {"train": "train_s", "decode": "decode_s", "eval": "eval_s", "eval_peak_ratio": "eval_peak_mb"}


def pair_rows(result: dict[str, Any], pairs: list[Pair]) -> list[dict[str, Any]]:
    """Each pair's ratios for the measurements ``result`` holds so far, with the rounds they come from
    (``values``: both sides' measurements, from the same run)."""
    models = result["models"]
    rows = []
    for p in pairs:
        a, b = models[p.extrapos_key], models[p.name]
        row: dict[str, Any] = {
            "pair": p.name,
            "peer": p.peer,
            "encoding": p.encoding,
            "extrapos": p.extrapos_key,
            "values": {"extrapos": {}, "peer": {}},
        }
        for ratio, field_name in RATIO_FIELDS.items():
            if field_name not in a or field_name not in b:
                continue
            ours, theirs = a[field_name], b[field_name]
            if ratio == "eval":
                row[ratio] = {k: pair_ratio(ours[k], theirs[k]) for k in ours}
            elif ratio == "eval_peak_ratio":
                row[ratio] = {k: ours[k] / theirs[k] if theirs[k] > 0 else None for k in ours}
            else:
                row[ratio] = pair_ratio(ours, theirs)
            row["values"]["extrapos"][field_name], row["values"]["peer"][field_name] = ours, theirs
        rows.append(row)
    return rows


def run_peers(
    shape: PeerShape,
    pairs: list[Pair],
    rounds: int = 7,
    memory: bool = True,
    progress: Callable[[str], None] = lambda message: None,
    measurements: tuple[str, ...] = ("train", "decode", "eval", "memory"),
    after_phase: Callable[[dict[str, Any]], None] = lambda result: None,
) -> dict[str, Any]:
    """Every measurement of every pair; the JSON the script writes (``format_peers`` renders it).
    ``after_phase(result)`` gets the result so far after each measurement (``complete`` False until
    the last), so a run stopped early keeps what it measured."""
    shape.validate()
    if rounds < 2:
        raise UserError(f"--rounds must be at least 2 (7 or more for a result), got {rounds}.")
    if not pairs:
        raise UserError("no pair to measure: every asked-for peer library is missing or filtered out.")
    if memory and not hwm_available():
        raise UserError(
            "this system cannot reset the resident-set high-water mark (/proc/self/clear_refs), so peak "
            "memory cannot be measured honestly; pass --no-memory."
        )
    t0 = time.perf_counter()
    keys = side_keys(pairs)
    progress(f"building {len(keys)} models")
    sides = {k: build_side(k, shape) for k in keys}
    result: dict[str, Any] = {
        "shape": dataclasses.asdict(shape),
        "rounds": rounds,
        "machine": {
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
        },
        "versions": library_versions(),
        "memory_method": None,
        "models": {k: {"label": s.label, "parameters": s.parameters()} for k, s in sides.items()},
        "pairs": [],
        "complete": False,
    }

    def done(field_name: str, values: dict[str, Any]) -> None:
        for k in keys:
            result["models"][k][field_name] = values[k]
        result["pairs"] = pair_rows(result, pairs)
        result["wall_time_s"] = time.perf_counter() - t0
        after_phase(result)

    tick = lambda: None  # noqa: E731
    if "train" in measurements:
        progress("training steps")
        done("train_s", measure_training(sides, shape, rounds, tick))
    if "decode" in measurements:
        progress("cached decoding")
        done("decode_s", measure_decode(sides, shape, rounds, tick))
    if "eval" in measurements:
        progress("evaluation forwards")
        evaluation = measure_eval(sides, shape, rounds, tick)
        done("eval_s", {k: {str(m): evaluation[m][k] for m in shape.multiples} for k in keys})
    del sides
    if memory and "memory" in measurements:
        progress("peak memory, one fresh process per model")
        result["memory_method"] = (
            "VmHWM growth over VmRSS (reset via /proc/self/clear_refs), fresh process per model"
        )
        done("eval_peak_mb", measure_memory(keys, shape, torch.get_num_threads(), tick))
    result["complete"] = True
    after_phase(result)
    return result


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of the same shape measuring different things (``--measure``) as one result. A pair's ratio
    always comes from one run (both sides measured in the same rounds): each measurement, and each
    length of the evaluation, is taken from the last run that measured it for that pair."""
    if not results:
        raise UserError("--merge needs at least one results.json.")
    keep = ("d_model", "n_layers", "n_heads", "mlp_hidden", "vocab", "batch", "train_length", "context")
    base = json.loads(json.dumps(results[0]))
    for r in results[1:]:
        if any(r["shape"][k] != base["shape"][k] for k in keep):
            raise UserError("--merge takes runs of one shape only; these results.json files differ in shape.")
    base["models"] = {
        k: {"label": m["label"], "parameters": m["parameters"]}
        for r in results
        for k, m in r["models"].items()
    }
    merged: dict[str, dict[str, Any]] = {}
    for r in results:
        names = [p["pair"] for p in r["pairs"]]
        for row in pair_rows(r, [next(p for p in PAIRS if p.name == n) for n in names]):
            into = merged.setdefault(row["pair"], {**row, "values": {"extrapos": {}, "peer": {}}})
            for ratio, field_name in RATIO_FIELDS.items():
                if ratio not in row:
                    continue
                per_length = ratio in ("eval", "eval_peak_ratio")
                into[ratio] = {**into.get(ratio, {}), **row[ratio]} if per_length else row[ratio]
                for side in ("extrapos", "peer"):
                    new = row["values"][side][field_name]
                    old = into["values"][side].get(field_name, {})
                    into["values"][side][field_name] = {**old, **new} if per_length else new
    base["pairs"] = list(merged.values())
    base["memory_method"] = next((r["memory_method"] for r in results if r.get("memory_method")), None)
    base["rounds"] = min(r["rounds"] for r in results)
    base["wall_time_s"] = sum(r.get("wall_time_s", 0) for r in results)
    base["complete"] = all(r.get("complete", True) for r in results)
    base["merged_from"] = len(results)
    return base


# ---- rendering ------------------------------------------------------------------------------------------


def _t(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    """median [q1-q3] of seconds, scaled (1e3: ms)."""
    s = summary([v * scale for v in values])
    return f"{s['median']:.{digits}f} [{s['q1']:.{digits}f}-{s['q3']:.{digits}f}]"


def _r(r: dict[str, Any]) -> str:
    mark = "" if r["beyond_noise"] else " ~"
    return f"{r['ratio']:.2f} ({r['round_min']:.2f}-{r['round_max']:.2f}){mark}"


def format_summary(result: dict[str, Any]) -> str:
    """One row per pair, the ratios alone (extrapos / peer; `~`: within noise): training step, evaluation
    time and peak memory at the longest length measured, decoding per token. The README's cost section."""
    L = result["shape"]["train_length"]
    lines = [
        "| pair (peer / block / encoding) | training step | eval time, longest | eval peak memory, longest "
        "| decode ms/token |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in result["pairs"]:
        cells = ["–"] * 4
        if "train" in p:
            cells[0] = _r(p["train"])
        if "eval" in p:
            k = max(p["eval"], key=int)
            cells[1] = f"{_r(p['eval'][k])} at {int(k) * L}"
        memory = p.get("eval_peak_ratio")
        if memory:
            k = max(memory, key=int)
            cells[2] = f"{memory[k]:.2f} at {int(k) * L}" if memory[k] is not None else "–"
        if "decode" in p:
            cells[3] = _r(p["decode"])
        lines.append(f"| {p['pair']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_peers(result: dict[str, Any], skipped: Sequence[str] = ()) -> str:
    """The Markdown report: the settings line, one table per measurement, a row per pair."""
    s, m, models = result["shape"], result["machine"], result["models"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    lines = [
        f"CPU capability {m['cpu_capability']}, {m['threads']} torch thread(s) ({m['cpu_count']} CPUs), "
        f"{versions}; fp32. Shape: d {s['d_model']} x {s['n_layers']} layers, {s['n_heads']} heads, "
        f"vocab {s['vocab']}, tied embeddings (GPT-NeoX untied), L_t {s['train_length']}. "
        f"{result['rounds']} interleaved rounds; times are medians [interquartile range]; a ratio is "
        "extrapos' median / the peer's (below 1: extrapos faster or smaller), with the range of the "
        "per-round ratios in brackets; `~` marks a ratio within noise (the per-round ratios straddle 1).",
        "",
    ]
    lines += [f"Skipped: {line}" for line in skipped]
    lines += ["", "### Ratios, extrapos / peer", "", format_summary(result)]
    lines += ["", "### Parameters", "", "| pair | extrapos | peer |", "|---|---:|---:|"]
    for p in result["pairs"]:
        lines.append(
            f"| {p['pair']} | {models[p['extrapos']]['parameters']:,} | {models[p['pair']]['parameters']:,} |"
        )
    if not result.get("complete", True):
        lines += ["", "**Partial run**: only the measurements below were completed."]

    def per_length(mults: list[str]) -> str:
        return " | ".join(f"{k}x extrapos | {k}x peer | {k}x ratio" for k in mults)

    if any("train" in p for p in result["pairs"]):
        lines += [
            "",
            "### Training step (forward + backward + fused AdamW, batch "
            f"{s['batch']} x {s['train_length']}), s",
            "",
            "| pair | extrapos | peer | ratio |",
            "|---|---:|---:|---:|",
        ]
        for p in (p for p in result["pairs"] if "train" in p):
            a, b = p["values"]["extrapos"]["train_s"], p["values"]["peer"]["train_s"]
            lines.append(f"| {p['pair']} | {_t(a, 1, 3)} | {_t(b, 1, 3)} | {_r(p['train'])} |")
    eval_rows = [p for p in result["pairs"] if "eval" in p]
    if eval_rows:
        mults = list(eval_rows[0]["eval"])
        lines += [
            "",
            "### Evaluation forward (no grad, batch 1, to the final-normed hidden states), ms",
            "",
            f"| pair | {per_length(mults)} |",
            "|---|" + "---:|" * (3 * len(mults)),
        ]
        for p in eval_rows:
            a, b = p["values"]["extrapos"]["eval_s"], p["values"]["peer"]["eval_s"]
            cells = [c for k in mults for c in (_t(a[k], 1e3), _t(b[k], 1e3), _r(p["eval"][k]))]
            lines.append(f"| {p['pair']} | " + " | ".join(cells) + " |")
    memory_rows = [p for p in result["pairs"] if "eval_peak_ratio" in p]
    if memory_rows:
        mults = list(memory_rows[0]["eval_peak_ratio"])
        lines += [
            "",
            f"### Evaluation peak memory, MiB ({result['memory_method']})",
            "",
            f"| pair | {per_length(mults)} |",
            "|---|" + "---:|" * (3 * len(mults)),
        ]
        for p in memory_rows:
            a, b = p["values"]["extrapos"]["eval_peak_mb"], p["values"]["peer"]["eval_peak_mb"]
            ratios = p["eval_peak_ratio"]
            cells = [
                c
                for k in mults
                for c in (f"{a[k]:.1f}", f"{b[k]:.1f}", f"{ratios[k]:.2f}" if ratios[k] is not None else "–")
            ]
            lines.append(f"| {p['pair']} | " + " | ".join(cells) + " |")
    if any("decode" in p for p in result["pairs"]):
        lines += [
            "",
            f"### Cached decoding after a {s['context']}-token prompt, ms per token "
            f"({s['new_tokens']} timed steps)",
            "",
            "| pair | extrapos | peer | ratio |",
            "|---|---:|---:|---:|",
        ]
        for p in (p for p in result["pairs"] if "decode" in p):
            a, b = p["values"]["extrapos"]["decode_s"], p["values"]["peer"]["decode_s"]
            lines.append(f"| {p['pair']} | {_t(a, 1e3, 2)} | {_t(b, 1e3, 2)} | {_r(p['decode'])} |")
    lines += ["", "Not measured: " + "; ".join(UNMATCHED.values()) + "."]
    runs = result.get("merged_from")
    total = f"Wall time {result['wall_time_s']:.0f} s"
    lines += ["", f"{total}, summed over the {runs} runs (some ran side by side)." if runs else f"{total}."]
    return "\n".join(lines)


if __name__ == "__main__":  # the memory child: python -m extrapos.bench.peers --memory-child JSON
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--memory-child", required=True)
    spec = json.loads(ap.parse_args().memory_child)
    raw = spec["shape"]
    raw["multiples"] = tuple(raw["multiples"])
    # the answer to the parent, on stdout: data, not a message to a person
    sys.stdout.write(json.dumps(memory_child(spec["key"], PeerShape(**raw), spec["threads"])) + "\n")
