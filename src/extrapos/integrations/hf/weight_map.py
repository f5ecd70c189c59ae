"""One table per architecture from Hugging Face tensor names to ours, read in both directions.

A ``Weight`` names one Hugging Face tensor (``{i}`` is the layer), the extrapos tensor it fills and
the ``Layout`` that rearranges it. Import matches each checkpoint name against the table and applies
``Layout.load``; export walks the same table and applies the inverse ``Layout.save``, so the two
directions cannot drift apart (torchtitan's ``state_dict_adapter.py`` keeps one map per model the same
way).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.model import ModelConfig


class Layout:
    """How a Hugging Face tensor sits inside ours: the identity here."""

    def load(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        """The Hugging Face tensor in our layout."""
        return t

    def rows(self, cfg: ModelConfig) -> slice | None:
        """The rows of our tensor it fills (None: all of it)."""
        return None

    def save(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        """Our tensor (or its rows) in the Hugging Face layout: the inverse of ``load``."""
        return t


class Transposed(Layout):
    """GPT-2's Conv1D stores (in, out), nn.Linear (out, in)."""

    def load(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        return t.t()

    def save(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        return t.t()


def per_head_to_blocks(t: Tensor, heads: int) -> Tensor:
    """Fused QKV rows laid out per head, [q_0; k_0; v_0; q_1; ...], to [Q; K; V] (GPT-NeoX, Bloom)."""
    rest = t.shape[1:]
    return t.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape)


def blocks_to_per_head(t: Tensor, heads: int) -> Tensor:
    """[Q; K; V] rows to the per-head layout [q_0; k_0; v_0; q_1; ...]."""
    rest = t.shape[1:]
    return t.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(t.shape)


class PerHeadQKV(Layout):
    """GPT-NeoX and Bloom fuse Q, K and V head by head; our fused projection is [Q; K; V]."""

    def load(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        return per_head_to_blocks(t, cfg.n_heads)

    def save(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        return blocks_to_per_head(t, cfg.n_heads)


@dataclass(frozen=True)
class QKVRows(Layout):
    """Llama keeps q_proj, k_proj and v_proj apart: each is a block of rows of our fused [Q; K; V]."""

    part: str  # "q", "k" or "v"

    def rows(self, cfg: ModelConfig) -> slice:
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        start = {"q": 0, "k": q_out, "v": q_out + kv_out}[self.part]
        return slice(start, start + (q_out if self.part == "q" else kv_out))

    def save(self, t: Tensor, cfg: ModelConfig) -> Tensor:
        return t[self.rows(cfg)]


COPY = Layout()
TRANSPOSED = Transposed()
PER_HEAD_QKV = PerHeadQKV()

Condition = Callable[["ModelConfig"], bool]


def always(cfg: ModelConfig) -> bool:
    return True


@dataclass(frozen=True)
class Weight:
    """One Hugging Face tensor (``{i}``: the layer index) and the extrapos tensor it fills."""

    hf: str  # name after the architecture's prefix (``h.{i}.ln_1.weight``)
    ours: str  # ``blocks.{i}.norm1.weight``
    layout: Layout = COPY
    # a bias the Hugging Face architecture holds when this is true of the run's config: written from
    # the run, or as zeros where the run has none; None for weights (always written, always present)
    bias_when: Condition | None = None
    head: bool = False  # the output head: skipped when tied, named without the prefix
    aliases: tuple[str, ...] = ()  # other names import accepts for it (the first name is exported)


def pair(hf: str, ours: str, layout: Layout = COPY, bias_when: Condition = always) -> list[Weight]:
    """A module's weight and its bias (``hf`` and ``ours`` without the .weight / .bias suffix)."""
    return [
        Weight(f"{hf}.weight", f"{ours}.weight", layout),
        Weight(f"{hf}.bias", f"{ours}.bias", layout, bias_when=bias_when),
    ]


def _pattern(name: str) -> str:
    return re.escape(name).replace(re.escape("{i}"), r"(\d+)")


@dataclass
class WeightMap:
    """Every tensor of one architecture: ``prefix`` + name (the head without prefix); ``ignored`` are
    regular expressions of buffers old checkpoints carry that are no weights (causal masks, inv_freq)."""

    prefix: str
    weights: list[Weight]
    ignored: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._compiled = [
            (re.compile("|".join(_pattern(n) for n in (w.hf, *w.aliases))), w) for w in self.weights
        ]

    # ---- import ----

    def match(self, key: str, arch: str) -> tuple[str, Weight] | None:
        """(our name, its entry) of a checkpoint tensor; None for an ignored buffer; UserError if unknown."""
        name = key[len(self.prefix) :] if key.startswith(self.prefix) else key
        for pattern, weight in self._compiled:
            m = pattern.fullmatch(name)
            if m:
                layer = next((g for g in m.groups() if g is not None), None)
                return weight.ours.format(i=layer), weight
        if any(re.fullmatch(p, name) for p in self.ignored):
            return None
        raise UserError(
            f"the checkpoint holds {key}, which is not a {arch} weight extrapos knows; "
            "is config.json's model_type right?"
        )

    # ---- export ----

    def export(self, state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
        """Our state dict under Hugging Face names: the inverse of the import, entry by entry."""
        out: dict[str, Tensor] = {}
        for weight in self.weights:
            if weight.head and cfg.tie_embeddings:
                continue
            if weight.bias_when is not None and not weight.bias_when(cfg):
                continue
            for i in range(cfg.n_layers) if "{i}" in weight.hf else [None]:
                ours = weight.ours.format(i=i)
                t = state.get(ours)
                if t is None:  # a bias the architecture has and the run lacks: zeros change nothing
                    w = state[ours.rpartition(".")[0] + ".weight"]
                    t = torch.zeros(w.shape[0], dtype=w.dtype)
                name = weight.hf.format(i=i)
                out[name if weight.head else self.prefix + name] = weight.layout.save(t, cfg)
        # safetensors wants every tensor to own its storage: copy transposes and row slices (q / k / v)
        return {
            k: v
            if v.is_contiguous() and v.untyped_storage().nbytes() == v.numel() * v.element_size()
            else v.contiguous().clone()
            for k, v in out.items()
        }
