"""A comparison sweep: its TOML schema (rows, seeds, extensions, task columns), checked before any row
trains, and each row's run configuration."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from extrapos import schema
from extrapos.compare.tasks import (
    TaskSpecs,
    parse_task_specs,
    task_keys,
)
from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest
from extrapos.presets import find_sweep, read_toml
from extrapos.run.config import RunConfig, load_config, validate

EVAL_PRECISIONS = ("fp32", "bf16", "auto")


@dataclass
class ExtensionSpec:
    """An extension row: continue the trained row ``parent`` at L_e = factor x L_t with ``method``."""

    parent: str
    method: str
    alpha: float | None = None
    factor: int | list[int] = 2
    tokens: int | None = None
    rope_interpolation: bool = False
    rope_scaling: str | None = None  # train with this RoPE scaling at L_e / L_t (extend --rope-scaling)


@dataclass
class SweepRow:
    name: str
    positions: dict[str, Any] | None = None
    set: list[str] = field(default_factory=list)
    eval: dict[str, Any] = field(default_factory=dict)
    reuse: str | None = None
    extend: ExtensionSpec | None = None
    run: str | None = None  # an existing run directory (e.g. an `extrapos import` output) instead of training

    @property
    def factors(self) -> list[int]:
        f = self.extend.factor if self.extend is not None else 2
        return list(f) if isinstance(f, list) else [f]


@dataclass
class Sweep:
    title: str = ""
    train: str = "cpu/small"
    set: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    rows: list[SweepRow] = field(default_factory=list)
    max_eval_tokens: int = 65_536
    notes: str = ""
    eval_each_length: bool = False  # evaluate every length on its own (extension tables: one column per L_e)
    extend_tokens: int | None = None  # token budget of every extension run (None: compute-equivalent)
    baseline: str | None = None  # the row differences are taken to (None: the first row)
    seeds: list[int] | None = (
        None  # train each trained row once per seed (None: once, with the preset's seed)
    )
    loss: bool = True  # the loss columns (false: task columns only)
    tasks: list[str] = field(default_factory=list)  # task columns: registered task names (tasks/task.py)
    # each task column's option table, by the task's key (``passkey = {...}``, ``lm_eval = {...}``): a sweep
    # file writes them at its top level, one key per registered task (``compare.tasks.task_keys``)
    task_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    protocol: str = "documents"  # the evaluation protocol of the loss columns: documents or stream
    boundary: str | None = None  # stream: context crossing documents ("cross", the default) or "mask"
    # seconds of training for all the trained runs together, split into equal tokens per run by a measured
    # step of each row (extrapos.compare.budget); replaces the preset's train budget
    budget_seconds: float | None = None
    # the loss columns' precision: fp32, bf16 (autocast), or auto (bf16 on a CUDA device that has it, else
    # fp32); every result records the precision it was scored in
    eval_precision: str = "fp32"

    def eval_request(
        self, lengths: list[int], options: dict[str, Any], max_tokens: int, precision: str = "fp32"
    ) -> EvalRequest:
        """The loss evaluation of a row at ``lengths``, under the sweep's protocol, in ``precision`` (the
        sweep's ``eval_precision`` resolved for the device: ``eval_precision_on``)."""
        return EvalRequest(
            lengths=list(lengths),
            position_options=dict(options),
            max_tokens=max_tokens,
            protocol=self.protocol,
            boundary=self.boundary,
            precision=precision,
        )

    def eval_precision_on(self, device: str) -> str:
        """``eval_precision`` on ``device``: "auto" is bf16 on a CUDA device with bf16 support, else fp32
        (bf16 on a CPU is emulated on most and slower than fp32)."""
        if self.eval_precision != "auto":
            return self.eval_precision
        import torch

        cuda = str(device).startswith("cuda") and torch.cuda.is_available()
        return "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"


def load_sweep(spec: str) -> Sweep:
    """A sweep preset or file, checked by the same validator as run configs."""
    path = find_sweep(spec)
    raw = read_toml(path)
    named = [f.name for f in fields(Sweep) if f.name != "task_options"]
    keys = ", ".join(named[: named.index("tasks") + 1] + task_keys() + named[named.index("tasks") + 1 :])
    if "task_options" in raw:  # the tables are written at the top level, under each task's key
        raise UserError(f"{path}: unknown key 'task_options'; a sweep has {keys}.")
    task_options = {
        k: schema.check(dict[str, Any] | None, raw.pop(k), f"{path}: key '{k}'")
        for k in task_keys()
        if k in raw
    }
    raw_rows = raw.pop("rows", [])
    sweep = schema.build(
        Sweep,
        raw,
        where=f"{path}: key '{{key}}'",
        unknown=f"{path}: unknown key '{{key}}'; a sweep has {keys}.",
    )
    sweep.title = sweep.title or path.stem
    sweep.task_options = {k: v for k, v in task_options.items() if v is not None}
    row_keys = ", ".join(f.name for f in fields(SweepRow))
    for i, r in enumerate(raw_rows):
        r = dict(r)
        where = f"{path}: row '{r.get('name', i + 1)}'"
        extend = r.pop("extend", None)
        row = schema.build(
            SweepRow,
            r,
            where=where + " key '{key}'",
            unknown=where + f" has an unknown key '{{key}}'; a row may have {row_keys}.",
        )
        if extend is not None:
            row.extend = _extension_spec(path, row.name, extend)
        sweep.rows.append(row)
    _check_rows(path, sweep.rows)
    if sweep.baseline is not None and sweep.baseline not in {r.name for r in sweep.rows}:
        raise UserError(f"{path}: baseline '{sweep.baseline}' is not a row; name one of the rows.")
    if sweep.seeds is not None and (
        not sweep.seeds or len(set(sweep.seeds)) != len(sweep.seeds) or any(x < 0 for x in sweep.seeds)
    ):
        raise UserError(
            f"{path}: seeds must be a non-empty list of distinct non-negative integers, got {sweep.seeds}."
        )
    _check_values(path, sweep)
    task_specs(sweep, path)
    _check_protocol(path, sweep)
    if not sweep.loss and not sweep.tasks:
        raise UserError(
            f'{path}: loss = false leaves nothing to report; add tasks = ["synthetic", ...] '
            "or drop loss = false."
        )
    if sweep.seeds is not None and any(r.run for r in sweep.rows):
        raise UserError(
            f"{path}: rows naming an existing run (run = ...) have one run, not one per seed; "
            "drop seeds or those rows."
        )
    return sweep


def task_specs(sweep: Sweep, path: Path | str) -> TaskSpecs:
    """The sweep's task columns, checked (``extrapos.compare.tasks``)."""
    return parse_task_specs(
        Path(path),
        sweep.tasks,
        sweep.task_options,
    )


def _check_protocol(path: Path, sweep: Sweep) -> None:
    """The sweep's evaluation protocol, checked as `extrapos eval` checks its flags."""
    from extrapos.evaluate import BOUNDARIES, PROTOCOLS

    if sweep.protocol not in PROTOCOLS:
        raise UserError(
            f"{path}: protocol must be {' or '.join(map(repr, PROTOCOLS))}, got {sweep.protocol!r}."
        )
    if sweep.boundary is not None and (sweep.protocol != "stream" or sweep.boundary not in BOUNDARIES):
        raise UserError(
            f'{path}: boundary = "cross" or "mask" goes with protocol = "stream" only, got '
            f"boundary = {sweep.boundary!r} with protocol = {sweep.protocol!r}."
        )


def _extension_spec(path: Path, row: str, raw: Any) -> ExtensionSpec:
    from extrapos.training.extend import METHODS, TRAINABLE_SCALINGS

    usage = (
        f"{path}: row '{row}' needs extend = {{ from = <a trained row>, method = {' | '.join(METHODS)}, "
        "alpha?, factor = K or [K, ...], tokens?, rope_interpolation?, rope_scaling? }"
    )
    if not isinstance(raw, dict) or "from" not in raw or raw.get("method") not in METHODS:
        raise UserError(usage + ".")
    values = {("parent" if k == "from" else k): v for k, v in raw.items()}
    spec = schema.build(
        ExtensionSpec,
        values,
        where=f"{path}: row '{row}' extend.{{key}}",
        unknown=usage + " (unknown {key}).",
    )
    if spec.rope_scaling is not None and spec.rope_scaling not in TRAINABLE_SCALINGS:
        raise UserError(
            f"{path}: row '{row}' extend.rope_scaling must be one of {', '.join(TRAINABLE_SCALINGS)}, "
            f"got {spec.rope_scaling!r}."
        )
    return spec


def _check_values(path: Path, sweep: Sweep) -> None:
    """The sweep's numbers, checked when it is loaded (before the first row trains)."""
    if not sweep.lengths or any(isinstance(k, bool) or k < 1 for k in sweep.lengths):
        raise UserError(
            f"{path}: lengths must be a non-empty list of positive multiples of L_t (e.g. [1, 2, 4]), "
            f"got {sweep.lengths}."
        )
    if sweep.max_eval_tokens < 1:
        raise UserError(
            f"{path}: max_eval_tokens must be a positive number of tokens, got {sweep.max_eval_tokens}."
        )
    if sweep.budget_seconds is not None and (
        isinstance(sweep.budget_seconds, bool) or not sweep.budget_seconds > 0
    ):
        raise UserError(
            f"{path}: budget_seconds must be a positive number of seconds of training, got "
            f"{sweep.budget_seconds}."
        )
    if sweep.eval_precision not in EVAL_PRECISIONS:
        raise UserError(
            f"{path}: eval_precision must be {', '.join(EVAL_PRECISIONS)}, got {sweep.eval_precision!r}."
        )
    if sweep.extend_tokens is not None and sweep.extend_tokens < 1:
        raise UserError(
            f"{path}: extend_tokens must be a positive number of tokens, got {sweep.extend_tokens}."
        )


def _check_rows(path: Path, rows: list[SweepRow]) -> None:
    if not rows:
        raise UserError(f"{path} has no [[rows]].")
    by_name = {r.name: r for r in rows}
    if len(by_name) != len(rows):
        raise UserError(f"{path}: row names must be unique.")
    for r in rows:
        if r.run is not None and (r.positions is not None or r.set or r.reuse or r.extend is not None):
            raise UserError(
                f"{path}: row '{r.name}' names an existing run (run = {r.run!r}), so it takes no "
                "positions, set, reuse or extend; evaluate it with eval = {...}, extend it from "
                "another row."
            )
        if r.reuse and r.reuse not in by_name:
            raise UserError(f"{path}: row '{r.name}' reuses '{r.reuse}', which is not a row.")
        if r.reuse and (r.reuse == r.name or by_name[r.reuse].reuse or by_name[r.reuse].extend is not None):
            raise UserError(
                f"{path}: row '{r.name}' reuses '{r.reuse}', which is not a trained row or a run = row "
                "(a row reuses another row's own run, never itself, a reuse row or an extension row)."
            )
        if r.extend is None:
            continue
        parent = by_name.get(r.extend.parent)
        if parent is None or parent.reuse or parent.extend is not None:
            raise UserError(
                f"{path}: row '{r.name}' needs extend = {{ from = <a trained or run = row>, ... }}; "
                f"'{r.extend.parent}' is not a trained row."
            )
        if r.reuse or not r.factors or not all(isinstance(f, int) and f >= 1 for f in r.factors):
            raise UserError(
                f"{path}: row '{r.name}': extend.factor must be a positive integer or a list of them, "
                "and an extension row cannot also reuse another row."
            )
        if r.positions is None:
            r.positions = parent.positions  # an extension keeps its parent's encoding
    _check_slugs(path, rows)


def _check_slugs(path: Path, rows: list[SweepRow]) -> None:
    """Rows whose names differ only in case or punctuation ("RoPE" and "rope", "A-B" and "A_B") would share
    a run directory and a result file (``slug``): refused before anything is trained."""
    owner: dict[str, str] = {}
    for r in rows:
        names = [slug(r.name)] + ([slug(f"{r.name} x{k}") for k in r.factors] if r.extend is not None else [])
        for s in names:
            if s in owner and owner[s] != r.name:
                raise UserError(
                    f"{path}: rows '{owner[s]}' and '{r.name}' would both be stored as '{s}' (names are "
                    "compared without case and punctuation); rename one of them."
                )
            owner[s] = r.name


def slug(name: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in name).strip("-").replace("--", "-") or "row"


def run_slug(name: str, seed: int | None) -> str:
    """A run directory's name: the row's slug, and ``-seed<s>`` when the sweep trains several seeds."""
    return slug(name) if seed is None else f"{slug(name)}-seed{seed}"


def row_config(sweep: Sweep, row: SweepRow, extra: list[str]) -> RunConfig:
    """The training preset with the sweep's, the row's and the command line's overrides; a row's
    positions table replaces the preset's whole (options of another encoding would not fit)."""
    overrides = list(sweep.set) + list(row.set) + list(extra)
    if not row.positions:
        return load_config(sweep.train, overrides)
    cfg = load_config(sweep.train, [o for o in overrides if not o.startswith("model.positions")])
    cfg = replace(cfg, model=replace(cfg.model, positions=dict(row.positions)))
    validate(cfg)
    return cfg
