"""Layer schedules: an encoding on some layers, another one (NoPE by default) on the others.

Recent open models drop RoPE from a subset of their layers: Command R7B interleaves three
sliding-window RoPE layers with one full-attention layer without positional encoding (Yang et al.
2025, "Rope to Nope and back again: a new hybrid attention strategy"), and Llama 4 and SmolLM3 have
NoPE on every 4th layer. Only the encodings are scheduled here (every layer sees the whole context).
In ``model.positions``, two keys beside ``name`` describe such a model:

    [model.positions]
    name = "rope"
    layers = "all but every 4th"        # or "every 4th", "every 2nd from 0", "all", [0, 1, 2]
    others = { name = "nope" }          # the encoding of the remaining layers (the default)

``"every Nth"`` is the N-th, 2N-th, ... layer counted from 1, i.e. the 0-based layers N-1, 2N-1, ...
(SmolLM3's and Llama 4's ``no_rope_layers`` with ``no_rope_layer_interval = N`` are NoPE exactly
there); ``"every Nth from K"`` starts at the 0-based layer K instead; ``"all but ..."`` is the
complement; a list holds 0-based layer indices.

Each of the two encodings is one module built as if the model had only its own layers: a layer is
known to it by its rank among them, so per-layer parameters (Kerple, FIRE, CABLE, FoX, CoPE, DAPE)
exist for those layers only, and shared ones (T5's table, learned ExPE's S and theta) are shared by
those layers only. Selecting every layer therefore gives the plain encoding's parameters under
``pos.main.`` and the same function. ``set_options`` (inference-time changes) and ``options`` reach
the scheduled encoding, not ``others``.

An encoding that acts on the token embeddings (the ``embed`` hook, once before the first block:
sinusoidal, learned, ExPE ``once``) has no per-layer form and is refused on either side.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import Tensor, nn

from extrapos.bounds import CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import Bias, EncodingContext, PositionalEncoding
from extrapos.positions.registry import build_encoding, build_options, spec
from extrapos.schema import check

#: the keys of ``model.positions`` that describe a schedule (everything else is the encoding's options)
SCHEDULE_KEYS = ("layers", "others")
_EVERY = re.compile(r"(all but )?every (\d+)(?:st|nd|rd|th)?(?: from (\d+))?")
_FORMS = '"all", "every 4th", "every 4th from 0", "all but every 4th" or a list of 0-based layer indices'


def parse_layers(spec_: Any, n_layers: int) -> tuple[int, ...]:
    """The sorted 0-based layers a ``model.positions.layers`` value selects in a model of n_layers."""
    value = check(str | list[int], spec_, "model.positions.layers")
    if isinstance(value, str):
        text = " ".join(value.lower().split())
        m = _EVERY.fullmatch(text)
        if text == "all":
            chosen = list(range(n_layers))
        elif m is None:
            raise UserError(f"model.positions.layers = {value!r} is not a layer schedule; write {_FORMS}.")
        else:
            step = int(m.group(2))
            if step < 1:
                raise UserError(f"model.positions.layers = {value!r} needs a step of at least 1 (every 1st).")
            start = step - 1 if m.group(3) is None else int(m.group(3))
            if m.group(3) is not None and start >= n_layers:
                raise UserError(
                    f"model.positions.layers = {value!r} starts at layer {start}, but the model has "
                    f"{n_layers} layers (0-{n_layers - 1}); start below {n_layers}."
                )
            every = set(range(start, n_layers, step))
            chosen = sorted(set(range(n_layers)) - every) if m.group(1) else sorted(every)
    else:
        for i in value:
            if not 0 <= i < n_layers:
                raise UserError(
                    f"model.positions.layers names layer {i}, but the model has {n_layers} layers; use "
                    f"0-based indices from 0 to {n_layers - 1}."
                )
        if len(set(value)) != len(value):
            twice = next(i for i in value if value.count(i) > 1)
            raise UserError(f"model.positions.layers lists layer {twice} twice; list each layer once.")
        chosen = sorted(value)
    if not chosen:
        raise UserError(
            f"model.positions.layers = {value!r} selects none of the model's {n_layers} layers; select at "
            "least one (or name the other encoding alone, without layers)."
        )
    return tuple(chosen)


O = TypeVar("O", bound=CheckedOptions)


@dataclass(frozen=True)
class Plan:
    """A ``model.positions`` table resolved once: the encoding, its ``Options`` (registry defaults and the
    table's values, checked, frozen), and the schedule if any. The table itself stays the config's TOML
    form (``ModelConfig.positions``); everything that reads the encoding's options reads them here."""

    name: str
    options: CheckedOptions
    layers: tuple[int, ...] | None = None  # None: every layer, no schedule
    others_name: str = "nope"
    others_options: CheckedOptions | None = None  # built when there is a schedule

    @property
    def names(self) -> list[str]:
        """The registered encodings the model uses."""
        return [self.name] if self.layers is None else [self.name, self.others_name]

    def options_as(self, kind: type[O]) -> O:
        """The options typed as ``kind`` (e.g. ``RoPE.Options``), for a reader that has checked the
        encoding's name; a plan of another encoding is a programming error."""
        if not isinstance(self.options, kind):
            raise TypeError(
                f"the encoding {self.name!r} has {type(self.options).__qualname__}, not {kind.__qualname__}"
            )
        return self.options


def _split(table: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return table["name"], {k: v for k, v in table.items() if k != "name"}


def plan_positions(positions: dict[str, Any], n_layers: int) -> Plan:
    """Resolve and check a ``model.positions`` table: options of both encodings, the layer list, and
    no embedding-level encoding in a schedule."""
    name, table = _split(positions)
    schedule = {k: table.pop(k) for k in SCHEDULE_KEYS if k in table}
    options = build_options(name, table)  # an unknown or mistyped option is one sentence naming it
    if not schedule:
        return Plan(name, options)
    if "layers" not in schedule:
        raise UserError(
            "model.positions.others needs model.positions.layers, the layers the encoding "
            f'{name!r} runs on (e.g. layers = "all but every 4th").'
        )
    layers = parse_layers(schedule["layers"], n_layers)
    others = schedule.get("others", {"name": "nope"})
    if isinstance(others, str):
        others = {"name": others}
    if not isinstance(others, dict) or "name" not in others:
        raise UserError(
            'model.positions.others must be a table with a "name" (e.g. others = { name = "nope" }).'
        )
    others_name, others_table = _split(others)
    if set(SCHEDULE_KEYS) & set(others_table):
        raise UserError(
            "model.positions.others cannot have a schedule of its own; give layers and others once, "
            "in model.positions."
        )
    others_options = build_options(others_name, others_table, "model.positions.others")
    for n, o, where in ((name, options, "model.positions"), (others_name, others_options, "others")):
        if spec(n).cls.acts_on_embeddings(o):
            raise UserError(
                f"the encoding {n!r} ({where}) acts once on the token embeddings, before the first layer, "
                "so it cannot be confined to some layers; use it without model.positions.layers."
            )
    return Plan(name, options, layers, others_name, others_options)


class LayerSchedule(PositionalEncoding):
    """``main`` on ``layers``, ``others`` on the remaining layers (see the module doc)."""

    family = "schedule"
    paper = 'Yang et al. 2025, "Rope to Nope and back again: a new hybrid attention strategy"'

    def __init__(self, ctx: EncodingContext, plan: Plan):
        nn.Module.__init__(self)  # no Options of its own: options and set_options are main's
        assert plan.layers is not None
        self.ctx, self.layers = ctx, plan.layers
        rest = [i for i in range(ctx.n_layers) if i not in plan.layers]
        self.main = build_encoding(plan.name, _sub_context(ctx, len(plan.layers)), plan.options)
        # built only when it has layers: a schedule of every layer has exactly the plain model's parameters
        self.others = (
            build_encoding(plan.others_name, _sub_context(ctx, len(rest)), plan.others_options)
            if rest
            else None
        )
        # model layer -> (runs main, the index that encoding knows the layer by)
        self._route = {i: (True, k) for k, i in enumerate(plan.layers)}
        self._route.update({i: (False, k) for k, i in enumerate(rest)})

    @property
    def options(self) -> Any:  # type: ignore[override]  # read-only: the options are main's, not its own
        return self.main.options

    def set_options(self, **changes: Any) -> None:
        self.main.set_options(**changes)

    def at_layer(self, layer: int) -> tuple[PositionalEncoding, int]:
        runs_main, local = self._route[layer]
        if runs_main:
            return self.main, local
        assert self.others is not None  # a layer off the schedule exists, so others was built
        return self.others, local

    # ---- hooks: embed reaches both parts (they reset per-forward memos there); the rest go by layer ----
    def embed(self, h: Tensor, positions: Tensor) -> Tensor:
        for part in (self.main, self.others):
            if part is not None:
                h = part.embed(h, positions)
        return h

    def attn_input(self, x: Tensor, positions: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        enc, local = self.at_layer(layer)
        return enc.attn_input(x, positions, local)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        raise RuntimeError(
            "a layer schedule rotates per layer: call at_layer(layer) and rotate with its encoding"
        )

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> Bias | None:
        enc, local = self.at_layer(layer)
        return enc.bias(x, positions, local, state)

    def extra_repr(self) -> str:
        return f"layers={list(self.layers)}"


def _sub_context(ctx: EncodingContext, n_layers: int) -> EncodingContext:
    return dataclasses.replace(ctx, n_layers=n_layers)


def build_positions(plan: Plan, ctx: EncodingContext) -> PositionalEncoding:
    """The model's encoding from its planned ``model.positions`` table (``ModelConfig.positions_plan``):
    the registered encoding itself, or a ``LayerSchedule`` when the table has ``layers``."""
    if plan.layers is None:
        return build_encoding(plan.name, ctx, plan.options)
    return LayerSchedule(ctx, plan)
