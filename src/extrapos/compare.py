"""`extrapos compare`: train several encodings on identical data, size, budget and seed; evaluate all
at the same lengths; write one report.

A sweep preset (``configs/compare/<name>.toml``) names a training preset, overrides shared by every
row, the evaluation lengths, and the rows::

    title = "Quick comparison"
    train = "cpu/small"
    set = ["train.tokens=800000"]
    lengths = [1, 2, 4, 8, 16]

    [[rows]]
    name = "ExPE"
    positions = { name = "expe" }

    [[rows]]
    name = "ExPE x0.5"
    reuse = "ExPE"              # no training: the ExPE run, evaluated with an inference-time change
    eval = { scale = 0.5 }

Context-extension rows (segmented sequences, ``configs/compare/extension.toml``) continue a trained
row at L_e = factor x L_t with `extrapos extend`; one row per method, one run per factor::

    eval_each_length = true     # each length alone: windows of k x L_t, "max" options -> k x L_t
    extend_tokens = 196_608     # extension budget (default: compute-equivalent), equal across methods

    [[rows]]
    name = "RoPE chunk-0.25"
    extend = { from = "RoPE OOTB", method = "chunk", alpha = 0.25, factor = [2, 4] }

The factor-k run is scored on windows of k x L_t only, so the row reads like the paper's Table 3:
one column per L_e. Extension runs get the row's ``set`` and the command line's overrides (but not
the sweep's ``set`` nor a command-line budget: those are the base models').

Each trained row is a run directory under ``OUT/runs/``; a finished run is reused and a partial one
resumed, so an interrupted sweep picks up where it stopped. Results are the runs' own
``eval/*.json`` files; the report is rebuilt from them (`extrapos report OUT` does the same, with
the title, baseline and tables the sweep chose, saved in ``OUT/report.json``).

Error bars (``extrapos.stats``)::

    baseline = "RoPE"           # the differences' reference row (default: the first row)
    seeds = [0, 1, 2]           # train every trained row once per seed (train.seed = seed)

With ``seeds`` every trained row (and every extension run) has one run per seed,
``OUT/runs/<row>-seed<s>``; within a seed every row sees the same data order, across seeds the
initialisation and the data order change, and the evaluation targets never do (they are the
held-out split's documents, which no seed touches). A row's result is then the mean over its
seeds (``OUT/merged/<row>.json``, the per-seed results inside it under ``seeds``), and its
intervals combine documents and seeds.

Task columns (``extrapos.compare_tasks``): ``tasks = ["synthetic" | "passkey" | "ruler" | "lm-eval", ...]``
with option tables ``synthetic = {...}``, ``passkey = {...}``, ``ruler = {...}``,
``lm_eval = { tasks = [...] }`` score every row beside the loss columns; ``loss = false`` drops the
loss columns (a synthetic corpus's test split holds single L_t examples, which a k x L_t window would
only concatenate)::

    tasks = ["synthetic"]
    loss = false

Encoder rows: a row whose run was trained with ``train.objective = "mlm"`` (the ``encoder`` flavour,
``configs/compare/mlm.toml``) is scored with ``evaluate_mlm`` (masked-LM loss on the same masked tokens
at every length) instead of the next-token protocol, with the same ``eval`` options, seeds and report
(intervals over documents included).

Evaluation protocol (``extrapos.evaluate``, docs/evaluation.md): every row of a sweep is scored the same
way, by default on spans inside held-out documents long enough for the longest window; a corpus of short
documents (web text) joins them into a stream instead::

    protocol = "stream"         # documents joined with end-of-text, fixed target blocks (default "documents")
    boundary = "mask"           # each target sees only its own document (default "cross": context crosses)

Imported and other existing runs: a row ``run = "runs/hf-gpt2"`` names a run directory (an
``extrapos import`` output or any trained run) instead of training one. A relative path is taken from
the current directory, like every path on the command line; the run is never written to except for its
own ``eval/`` results. Such a row is evaluated, reused and extended like a trained row; it cannot be
combined with ``seeds`` (there is one run, not one per seed).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from extrapos import schema
from extrapos.compare_tasks import (
    TaskSpecs,
    mean_over_seeds,
    merge_lengths,
    parse_task_specs,
    write_row_result,
)
from extrapos.compare_tasks import score as score_task
from extrapos.config import RunConfig, load_config, validate
from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, default_name, evaluate, format_result
from extrapos.evaluate_mlm import evaluate_mlm, format_mlm_result
from extrapos.files import atomic_write
from extrapos.presets import find_sweep, read_toml, sweep_names
from extrapos.report import Row, loss_rows, markdown_table, write_report
from extrapos.stats import protocol_name

__all__ = ["ExtensionSpec", "Sweep", "SweepRow", "compare", "load_sweep", "row_config", "slug", "sweep_names"]


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
    tasks: list[str] = field(default_factory=list)  # task columns: synthetic, passkey, lm-eval
    synthetic: dict[str, Any] | None = None  # options of each task column (extrapos.compare_tasks)
    passkey: dict[str, Any] | None = None
    ruler: dict[str, Any] | None = None  # RULER column options (extrapos.compare_tasks.RulerColumns)
    lm_eval: dict[str, Any] | None = None
    attention: dict[str, Any] | None = None  # attention diagnostics columns (compare_tasks.AttentionColumns)
    protocol: str = "documents"  # the evaluation protocol of the loss columns: documents or stream
    boundary: str | None = None  # stream: context crossing documents ("cross", the default) or "mask"

    def eval_request(self, lengths: list[int], options: dict[str, Any], max_tokens: int) -> EvalRequest:
        """The loss evaluation of a row at ``lengths``, under the sweep's protocol."""
        return EvalRequest(
            lengths=list(lengths),
            position_options=dict(options),
            max_tokens=max_tokens,
            protocol=self.protocol,
            boundary=self.boundary,
        )


def load_sweep(spec: str) -> Sweep:
    """A sweep preset or file, checked by the same validator as run configs."""
    path = find_sweep(spec)
    raw = read_toml(path)
    keys = ", ".join(f.name for f in fields(Sweep))
    raw_rows = raw.pop("rows", [])
    sweep = schema.build(
        Sweep,
        raw,
        where=f"{path}: key '{{key}}'",
        unknown=f"{path}: unknown key '{{key}}'; a sweep has {keys}.",
    )
    sweep.title = sweep.title or path.stem
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
    """The sweep's task columns, checked (``extrapos.compare_tasks``)."""
    return parse_task_specs(
        Path(path),
        sweep.tasks,
        {
            "synthetic": sweep.synthetic,
            "passkey": sweep.passkey,
            "ruler": sweep.ruler,
            "lm_eval": sweep.lm_eval,
            "attention": sweep.attention,
        },
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
    from extrapos.extend import METHODS, TRAINABLE_SCALINGS

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


# written into every comparison directory: a later compare writes only into a directory that holds it
OUT_MARKER = ".extrapos-compare"
# what a comparison writes at its top level (a directory of an older extrapos, before the marker, holds
# only these, with rows.json or a trained run under runs/)
_OUT_NAMES = {
    "runs",
    "merged",
    "tasks",
    "plots",
    "rows.json",
    "facts.json",
    "report.json",
    "report.md",
    "results.csv",
    "results.json",
    "tasks.csv",
}


def check_out_dir(out: Path) -> None:
    """Refuse ``out`` unless it is new, empty, or a comparison directory (it holds ``OUT_MARKER``, or only
    what an older extrapos compare wrote): the user's own files are never replaced."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; choose a new or empty --out directory.")
    entries = {p.name for p in out.iterdir()}
    if not entries or OUT_MARKER in entries:
        return
    older = entries <= _OUT_NAMES and (
        (out / "rows.json").is_file() or any((out / "runs").glob("*/config.toml"))
    )
    if not older:
        raise UserError(
            f"--out {out} is not empty and was not made by extrapos compare (it has no {OUT_MARKER}); "
            "choose a new or empty --out directory so that none of its files is replaced."
        )


# noqa below: the sweep's phases in order (validate, train, extend, evaluate, tasks, report), read top to bottom
def compare(  # noqa: C901
    spec: str,
    out: str | Path,
    extra: list[str] | None = None,
    progress: bool = True,
    max_eval_tokens: int | None = None,
) -> Path:
    """Run (or resume) a sweep into ``out``; returns the report path.

    Under torchrun every row trains on all the processes (data parallel, as ``extrapos train``) and
    is scored by them together (``evaluate`` and the passkey column deal their work out); rank 0
    alone writes the comparison's files and prints (docs/distributed.md).
    """
    from extrapos.runtime import init_distributed, resolve_device
    from extrapos.train import run_is_complete, train

    sweep = load_sweep(spec)
    specs = task_specs(sweep, find_sweep(spec))
    if max_eval_tokens is not None and max_eval_tokens < 1:
        raise UserError(f"--max-eval-tokens must be a positive number of tokens, got {max_eval_tokens}.")
    out = Path(out)
    check_out_dir(out)  # before anything is written: never into a directory extrapos did not make
    _check_row_options(sweep, find_sweep(spec), specs, list(extra or []))
    rank, _, device = init_distributed(resolve_device(sweep_device(sweep, list(extra or []))))
    main = rank == 0
    progress = progress and main

    def say(text: str) -> None:
        if main:
            print(text, flush=True)

    run_dirs: dict[tuple[str, int | None], Path] = {
        (r.name, None): existing_run(r) for r in sweep.rows if r.run
    }
    out.mkdir(parents=True, exist_ok=True)
    if main and not (out / OUT_MARKER).is_file():
        atomic_write(out / OUT_MARKER, json.dumps({"made_by": "extrapos compare"}) + "\n")
    t0 = time.perf_counter()
    trained = [r for r in sweep.rows if not r.reuse and r.extend is None and r.run is None]
    seeds: list[int | None] = list(sweep.seeds) if sweep.seeds else [None]
    jobs = [(row, seed) for row in trained for seed in seeds]
    configs: dict[tuple[str, int | None], RunConfig] = {}
    _check_heldout_fits(sweep, trained, list(extra or []), progress=main)
    for i, (row, seed) in enumerate(jobs, 1):
        # the seed goes last: it is what distinguishes the runs of one row
        cfg = row_config(sweep, row, list(extra or []) + ([f"train.seed={seed}"] if seed is not None else []))
        run_dir = out / "runs" / run_slug(row.name, seed)
        label = row.name if seed is None else f"{row.name} (seed {seed})"
        run_dirs[(row.name, seed)], configs[(row.name, seed)] = run_dir, cfg
        if run_is_complete(run_dir):
            _check_same_config(run_dir, cfg)
            say(f"[{i}/{len(jobs)}] {label}: finished run reused ({run_dir})")
            continue
        resume = (run_dir / "config.toml").is_file()
        if resume:
            _check_same_config(run_dir, cfg)
        say(f"[{i}/{len(jobs)}] {label}: {'resuming' if resume else 'training'} -> {run_dir}")
        train(cfg, run_dir, resume=resume, progress=progress)
    extension_dirs = _run_extensions(sweep, out, run_dirs, list(extra or []), progress, seeds, say)

    entries, rows = [], []
    max_tokens = sweep.max_eval_tokens if max_eval_tokens is None else max_eval_tokens
    for row in sweep.rows:
        result, entry = None, {"name": row.name}
        if sweep.loss:
            per_seed = [
                _evaluate_row(
                    sweep, row, seed, out, run_dirs, extension_dirs, max_tokens, progress, str(device), main
                )
                for seed in seeds
            ]
            if sweep.seeds:
                result = _combine_seeds([r for r, _, _ in per_seed], list(sweep.seeds))
                merged = out / "merged" / f"{slug(row.name)}.json"
                if main:
                    merged.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(merged, json.dumps(result, indent=1))
                runs = [run for _, r, _ in per_seed for run in (r if isinstance(r, list) else [r])]
                entry.update({"run": runs, "eval": str(merged.relative_to(out))})
            else:
                _, runs, eval_path = per_seed[0]
                result = per_seed[0][0]
                entry.update({"run": runs, "eval": eval_path})
            if progress:
                shown = (
                    format_mlm_result(result) if result.get("objective") == "mlm" else format_result(result)
                )
                say(f"{row.name}:\n{shown}")
        else:
            entry.update({"run": _row_runs(sweep, row, seeds, out, run_dirs, extension_dirs), "eval": None})
        task_results = _score_row_tasks(
            sweep, specs, row, seeds, run_dirs, extension_dirs, progress, str(device)
        )
        if task_results:
            entry["tasks"] = {
                t: write_row_result(out, t, slug(row.name), r, write=main) for t, r in task_results.items()
            }
        entries.append(entry)
        rows.append(Row(row.name, result, task_results))
    if not main:
        return out / "report.md"
    atomic_write(out / "rows.json", json.dumps(entries, indent=1))
    facts = _facts(sweep, configs, run_dirs, rows, time.perf_counter() - t0, extension_dirs)
    atomic_write(out / "facts.json", json.dumps(facts, indent=1))
    settings = report_settings(sweep)
    atomic_write(out / "report.json", json.dumps(settings, indent=1))
    report = write_report(rows, out, facts=facts, **settings)
    if loss_rows(rows):
        print(markdown_table(loss_rows(rows)))
    print(f"-> {report}")
    return report


def _check_row_options(sweep: Sweep, path: Path, specs: TaskSpecs, extra: list[str]) -> None:
    """Every row's ``eval`` options checked against the encoding it evaluates before the first row trains
    (``tasks.common.check_encoding_options``: unknown options, wrong types, values that make the loss
    NaN), and against what the lm-eval column can apply; task columns refuse an encoder row."""
    from extrapos.config import load_run_config
    from extrapos.tasks.common import check_encoding_options

    by_name = {r.name: r for r in sweep.rows}
    for row in sweep.rows:
        if not row.eval and not specs.enabled():
            continue
        source = by_name[row.reuse] if row.reuse else row
        if source.extend is not None:
            source = by_name[source.extend.parent]
        if source.run is not None:
            cfg = load_run_config(existing_run(source))
        else:
            cfg = row_config(sweep, source, extra)
        _check_task_memory(sweep, path, specs, row, cfg)
        if specs.enabled() and cfg.train.objective == "mlm":
            raise UserError(
                f"{path}: row '{row.name}' is an encoder (objective mlm) and the task columns "
                f"({', '.join(specs.enabled())}) score a decoder's next-token predictions; drop tasks or "
                "that row."
            )
        check_encoding_options(cfg, dict(row.eval), f"{path}: row '{row.name}' eval options")
        unsupported = set(row.eval) - {"scale", "scaling", "factor"}
        if specs.lm_eval is not None and unsupported:
            raise UserError(
                f"{path}: row '{row.name}': lm-eval columns take the eval options scale, scaling and factor "
                f"only, not {', '.join(sorted(unsupported))}; drop lm-eval or that row's option."
            )


def _check_task_memory(sweep: Sweep, path: Path, specs: TaskSpecs, row: SweepRow, cfg: RunConfig) -> None:
    """The passkey and synthetic columns' memory estimates for ``row`` (its longest length, from the config
    it will train with), before any row trains: a trial count or a length that cannot fit is refused now,
    not after training every row. Checked against the host's memory (asking a GPU here would open a CUDA
    context before torchrun's processes pick their devices); each task checks its own device again when
    it scores."""
    from extrapos.tasks.passkey import check_passkey_memory
    from extrapos.tasks.synthetic import check_synthetic_memory

    if specs.passkey is None and specs.synthetic is None:
        return
    lengths = list(row.factors) if row.extend is not None else list(sweep.lengths)
    device = "cpu"
    where = f"{path}: row '{row.name}':"
    if specs.passkey is not None:
        p = specs.passkey
        try:
            check_passkey_memory(
                cfg.model,
                lengths,
                p.trials,
                p.mode,
                p.candidates,
                None,
                device,
                advice="lower the sweep's lengths or passkey.trials",
            )
        except UserError as e:
            raise UserError(f"{where} {e}") from None
    if specs.synthetic is not None:
        try:
            check_synthetic_memory(
                cfg.model,
                lengths,
                specs.synthetic.examples,
                None,
                device,
                advice="lower the sweep's lengths or synthetic.examples",
            )
        except UserError as e:
            raise UserError(f"{where} {e}") from None


def sweep_device(sweep: Sweep, extra: list[str]) -> str:
    """``train.device`` of the sweep's preset with the sweep's and the command line's overrides: where
    every row trains and is scored."""
    overrides = [o for o in [*sweep.set, *extra] if not o.startswith("model.positions")]
    return load_config(sweep.train, overrides).train.device


def existing_run(row: SweepRow) -> Path:
    """The run directory a ``run = ...`` row names (relative paths from the current directory), checked."""
    path = Path(row.run).expanduser()
    if not (path / "config.toml").is_file():
        raise UserError(
            f"row '{row.name}' names the run {row.run!r}, but {path.resolve()} holds no run "
            "(config.toml); create it first, e.g. `extrapos import SOURCE --out "
            f"{row.run}` (relative paths are taken from the current directory)."
        )
    return path


def _rel(path: Path, out: Path) -> str:
    """A run's path as rows.json records it: relative to the comparison, absolute when it lies outside."""
    try:
        return str(path.relative_to(out))
    except ValueError:
        return str(path.resolve())


def _row_runs(
    sweep: Sweep,
    row: SweepRow,
    seeds: list[int | None],
    out: Path,
    run_dirs: dict[tuple[str, int | None], Path],
    extension_dirs: dict[tuple[str, int, int | None], Path],
) -> list[str] | str:
    """The run(s) a row scores, for rows.json when it has no loss evaluation to record them."""
    if row.extend is not None:
        runs = [_rel(extension_dirs[(row.name, k, seed)], out) for seed in seeds for k in row.factors]
    else:
        runs = [_rel(run_dirs[(row.reuse or row.name, seed)], out) for seed in seeds]
    return runs[0] if len(runs) == 1 else runs


def _score_row_tasks(
    sweep: Sweep,
    specs: TaskSpecs,
    row: SweepRow,
    seeds: list[int | None],
    run_dirs: dict[tuple[str, int | None], Path],
    extension_dirs: dict[tuple[str, int, int | None], Path],
    progress: bool,
    device: str = "cpu",
) -> dict[str, Any]:
    """task -> the row's result: an extension row's factor-k run scored at ev = k (in its parent's L_t;
    lm-eval:
    the largest factor's run), every other row at the sweep's lengths; the mean over seeds with ``seeds``."""
    results = {}
    for task in specs.enabled():
        per_seed = []
        for seed in seeds:
            if row.extend is not None:
                factors = row.factors[-1:] if task == "lm-eval" else row.factors
                parts = []
                for k in factors:
                    run_dir = extension_dirs[(row.name, k, seed)]
                    base = json.loads((run_dir / "parent.json").read_text())["train_length"]
                    parts.append(
                        score_task(task, specs, run_dir, [k], dict(row.eval), base, progress, device)
                    )
                per_seed.append(parts[0] if task == "lm-eval" else merge_lengths(parts))
            else:
                source = run_dirs[(row.reuse or row.name, seed)]  # run = rows exist only without seeds
                per_seed.append(
                    score_task(
                        task, specs, source, list(sweep.lengths), dict(row.eval), None, progress, device
                    )
                )
        results[task] = mean_over_seeds(per_seed, list(sweep.seeds)) if sweep.seeds else per_seed[0]
    return results


def report_settings(sweep: Sweep) -> dict[str, Any]:
    """What `extrapos report OUT` needs to render the sweep's report again, byte for byte."""
    return {
        "title": sweep.title,
        "baseline": sweep.baseline or sweep.rows[0].name,
        "sequence_ppl": sweep.eval_each_length,
    }


def score_run(
    run_dir: Path, req: EvalRequest, name: str | None = None, progress: bool = True, device: str = "cpu"
) -> dict[str, Any]:
    """A row's loss evaluation of one run: ``evaluate_mlm`` (masked-LM loss on the same masked tokens at
    every length) for an encoder trained with objective mlm, ``evaluate`` (next-token loss, sharded under
    torchrun) otherwise."""
    import torch.distributed as dist

    from extrapos.config import load_run_config

    if load_run_config(run_dir).train.objective == "mlm":
        if req.protocol != "documents":
            raise UserError(
                f"{run_dir} is an encoder, whose masked-LM evaluation uses the documents protocol only; "
                f"drop protocol = {req.protocol!r} from the sweep."
            )
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise UserError(
                f"{run_dir} is an encoder, whose masked-LM evaluation runs in one process; compare "
                "encoder sweeps without torchrun."
            )
        name = None if name is None else f"mlm-{name}"
        with _compare_advice(run_dir):
            return evaluate_mlm(run_dir, req, name=name, device=device, progress=progress)
    with _compare_advice(run_dir):
        return evaluate(run_dir, req, name=name, device=device, progress=progress)


@contextmanager
def _compare_advice(run_dir: Path):
    """The evaluation's "holds a different evaluation; pass --name ... or --overwrite" in words compare can
    follow: it has neither flag, and its result names follow from the sweep."""
    try:
        yield
    except UserError as e:
        text = str(e)
        if "holds a different evaluation" not in text:
            raise
        held = text.split(" holds a different evaluation")[0]
        raise UserError(
            f"{held} holds an evaluation of {run_dir} with other settings than this sweep's "
            "(max_eval_tokens, protocol or a row's eval options), which compare never replaces; move that "
            "file away to score the run again, or compare with the settings it was scored with."
        ) from None


def _evaluate_row(
    sweep: Sweep,
    row: SweepRow,
    seed: int | None,
    out: Path,
    run_dirs: dict[tuple[str, int | None], Path],
    extension_dirs: dict[tuple[str, int, int | None], Path],
    max_tokens: int,
    progress: bool,
    device: str = "cpu",
    main: bool = True,
) -> tuple[dict[str, Any], Any, str]:
    """(result, run path(s) relative to ``out``, result file relative to ``out``) of one row at one seed;
    ``main``: this process writes the comparison's copies (rank 0 under torchrun)."""
    if row.extend is not None or sweep.eval_each_length:
        # one evaluation per length (an extension's factor-k run at k only), merged into one row
        parts = [
            (
                extension_dirs[(row.name, k, seed)]
                if row.extend is not None
                else run_dirs[(row.reuse or row.name, seed)],
                k,
            )
            for k in (row.factors if row.extend is not None else sweep.lengths)
        ]
        results = []
        for run_dir, k in parts:
            req = sweep.eval_request([k], row.eval, max_tokens)
            name = f"{default_name(req)}-ev{k}"
            results.append(score_run(run_dir, req, name=name, progress=progress, device=device))
        result = _merge_results(results)
        merged = out / "merged" / f"{run_slug(row.name, seed)}.json"
        if main:
            merged.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(merged, json.dumps(result, indent=1))
        return result, [_rel(p, out) for p, _ in parts], str(merged.relative_to(out))
    source = run_dirs[(row.reuse or row.name, seed)]
    req = sweep.eval_request(sweep.lengths, row.eval, max_tokens)
    result = score_run(source, req, progress=progress, device=device)
    saved = source / "eval" / f"{result['name']}.json"
    if not saved.resolve().is_relative_to(out.resolve()):
        # an existing run outside the comparison: the report reads only files inside it, so keep a copy
        saved = out / "merged" / f"{run_slug(row.name, seed)}.json"
        if main:
            saved.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(saved, json.dumps(result, indent=1))
    return result, _rel(source, out), str(saved.relative_to(out))


def _combine_seeds(results: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """One row from its per-seed results: every number the mean over seeds (perplexity = exp of the mean
    loss); the per-seed results are kept whole under ``seeds`` for the intervals (the per-document fields
    live there only). Works for next-token and MLM results alike (their rows' numbers differ)."""
    combined = {k: v for k, v in results[0].items() if k not in ("results", "per_position", "wall_time")}
    combined["run"] = [r["run"] for r in results]
    combined["seed_values"] = list(seeds)
    counted = ("ev", "window", "windows", "tokens", "masked_tokens", "targets")  # equal across seeds
    rows = []
    for i, first in enumerate(results[0]["results"]):
        same = [r["results"][i] for r in results]
        assert all(x["ev"] == first["ev"] for x in same)  # every seed evaluated the same lengths
        row: dict[str, Any] = {}
        for key, value in first.items():
            if key.startswith("doc_"):
                continue
            values = [x.get(key) for x in same]
            if key in counted:
                row[key] = value
            elif key == "ppl":
                row[key] = math.exp(statistics.fmean(x["loss"] for x in same))
            else:
                row[key] = statistics.fmean(values) if None not in values else None
        rows.append(row)
    combined["results"] = rows
    curves = [r["per_position"] for r in results]
    if all(curves):
        combined["per_position"] = {
            **curves[0],
            "loss": [None if None in v else statistics.fmean(v) for v in zip(*(c["loss"] for c in curves))],
        }
    else:
        combined["per_position"] = None
    combined["wall_time"] = sum(r["wall_time"] for r in results)
    combined["seeds"] = results
    return combined


def _check_heldout_fits(
    sweep: Sweep, trained: list[SweepRow], extra: list[str], progress: bool = True
) -> None:
    """Before any training: the test split must hold a document for the longest evaluated window (the
    documents protocol) or a stream long enough for it (the stream protocol)."""
    from extrapos.data import check_heldout, open_split
    from extrapos.data.synthetic import task_of
    from extrapos.evaluate.stream import TokenStream, select_blocks
    from extrapos.runtime import prepare_run_data

    if not trained or not sweep.loss:  # task columns generate their own examples
        return
    cfg = row_config(sweep, trained[0], extra)
    data_dir = prepare_run_data(cfg, progress=progress)
    if task_of(data_dir) is not None:
        return
    factors = [k for r in sweep.rows if r.extend is not None for k in r.factors]
    longest = max([*sweep.lengths, *factors]) * cfg.model.train_length
    if sweep.protocol == "stream":
        length = TokenStream(open_split(data_dir, "test")).length
        select_blocks(length, cfg.model.train_length, longest, sweep.max_eval_tokens)
        return
    check_heldout(data_dir, "test", longest + 1)


def _run_extensions(
    sweep: Sweep,
    out: Path,
    run_dirs: dict[tuple[str, int | None], Path],
    extra: list[str],
    progress: bool,
    seeds: list[int | None],
    say=print,
) -> dict[tuple[str, int, int | None], Path]:
    """Train (or reuse / resume) every extension run: OUT/runs/<row>-x<k>[-seed<s>], from its parent row's
    run of the same seed (an extension keeps its parent's train.seed)."""
    from extrapos.config import BUDGET_KEYS, parse_override
    from extrapos.extend import extend
    from extrapos.train import run_is_complete

    extra = [o for o in extra if parse_override(o)[0] not in (["train", k] for k in BUDGET_KEYS)]
    jobs = [
        (row, k, seed) for row in sweep.rows if row.extend is not None for k in row.factors for seed in seeds
    ]
    dirs = {}
    for i, (row, k, seed) in enumerate(jobs, 1):
        e = row.extend
        run_dir = out / "runs" / run_slug(f"{row.name} x{k}", seed)
        dirs[(row.name, k, seed)] = run_dir
        started = (run_dir / "config.toml").is_file()
        state = "finished run reused" if run_is_complete(run_dir) else "resuming" if started else "extending"
        label = f"{row.name} x{k}" + ("" if seed is None else f" (seed {seed})")
        say(f"[ext {i}/{len(jobs)}] {label}: {state} -> {run_dir}")
        extend(
            run_dirs[(e.parent, seed)],
            e.method,
            k,
            e.alpha,
            run_dir,
            tokens=e.tokens if e.tokens is not None else sweep.extend_tokens,
            rope_interpolation=e.rope_interpolation,
            overrides=list(row.set) + extra,
            resume=started,
            progress=progress,
            rope_scaling=e.rope_scaling,
        )
    return dirs


def _merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Evaluations of one length each, as one result with a column per length (the last's per-position
    curve)."""
    merged = dict(results[-1])
    merged["results"] = [r for res in results for r in res["results"]]
    merged["parts"] = [
        {
            "run": res["run"],
            "name": res["name"],
            "ev": [r["ev"] for r in res["results"]],
            "target_tokens": res["target_tokens"],
            "documents_used": res["documents_used"],
        }
        for res in results
    ]
    merged["wall_time"] = sum(res["wall_time"] for res in results)
    return merged


def _check_same_config(run_dir: Path, cfg: RunConfig) -> None:
    saved = (run_dir / "config.toml").read_text()
    if saved != cfg.to_toml():
        raise UserError(
            f"{run_dir} was trained with a different config than this sweep asks for; "
            "delete that run directory or use another --out."
        )


def _existing_run_facts(
    sweep: Sweep, run_dirs: dict[tuple[str, int | None], Path], scored: list[Row]
) -> list[str]:
    """One line per ``run = ...`` row: where it came from (an import's source.json, else its config), L_t;
    they have no summary.json (nothing was trained here)."""
    from extrapos.config import load_run_config

    facts = []
    for row in (r for r in sweep.rows if r.run):
        path = run_dirs[(row.name, None)]
        cfg = load_run_config(path)
        m = cfg.model
        line = (
            f"{row.name}: existing run {row.run} ({m.flavour}, {m.n_layers} layers, d={m.d_model}, "
            f"{m.n_heads} heads, encoding {m.positions_plan().name}, L_t={cfg.seq_len}"
        )
        source = path / "source.json"
        if source.is_file():
            record = json.loads(source.read_text())
            line += (
                f"; imported from {record.get('source')} ({record.get('architecture')}, context "
                f"{record.get('context_length')}), not trained by this sweep"
            )
        facts.append(
            line + f"; data: corpus {cfg.data.corpus}, tokenizer {Path(str(cfg.data.tokenizer)).name})"
        )
    if scored:
        facts.append(_evaluation_fact(scored[0].result))
    return facts


def _evaluation_fact(result: dict[str, Any]) -> str:
    """What a loss column scored: next-token targets, or (an encoder) the masked tokens of the BERT mask."""
    if result.get("objective") == "mlm":
        return (
            f"evaluation on the held-out test split, protocol {protocol_name(result)}: masked-LM loss on "
            f"{result['target_tokens']:,} masked "
            f"tokens per length (BERT's 15% / 80-10-10 mask, drawn once per span with seed "
            f"{result.get('mask_seed', 0)}, the same tokens at every length) from {result['documents_used']} "
            "documents"
            + (
                f"; a context-free model (the training split's unigram frequencies) scores "
                f"{result['unigram_loss']:.3f} nats on them: a row near that line has not learned to use "
                "context"
                if result.get("unigram_loss") is not None
                else ""
            )
        )
    if result.get("protocol") == "stream":
        return (
            f"evaluation on the held-out test split, protocol {protocol_name(result)}: its "
            f"{result['documents_in_split']:,} documents joined with end-of-text in a stream of "
            f"{result['stream_tokens']:,} tokens, {result['target_tokens']:,} target tokens in "
            f"{result['blocks']} blocks of {result['block']} spread over it, the same at every length, each "
            "block scored by the window of k x L_t tokens that ends with it; the targets belong to "
            f"{result['documents_used']} documents"
        )
    return (
        f"evaluation on the held-out test split, protocol {protocol_name(result)}: "
        f"{result['target_tokens']:,} target tokens per length from {result['documents_used']} documents"
    )


def _facts(
    sweep: Sweep,
    configs: dict[tuple[str, int | None], RunConfig],
    run_dirs: dict[tuple[str, int | None], Path],
    rows: list[Row],
    wall: float,
    extension_dirs: dict[tuple[str, int, int | None], Path] | None = None,
) -> list[str]:
    """What a reader needs to judge the table: model size, tokens, corpus, tokenizer, seed, time."""
    summaries = {
        n: json.loads((p / "summary.json").read_text())
        for n, p in run_dirs.items()
        if (p / "summary.json").is_file() and n in configs
    }
    params = sorted({s["parameters"]["total"] for s in summaries.values()})
    tokens = sorted({s["tokens"] for s in summaries.values()})
    scored = loss_rows(rows)
    facts = []
    if configs:
        first = next(iter(configs.values()))
        m, d, t = first.model, first.data, first.train
        facts += [
            f"model: {m.flavour}, {m.n_layers} layers, d={m.d_model}, {m.n_heads} heads, "
            f"{', '.join(f'{p / 1e6:.2f}M' for p in params)} parameters",
            f"training: L_t={first.seq_len}, {', '.join(f'{x:,}' for x in tokens)} tokens per model, "
            f"batch {t.batch_size}, lr {t.lr:g} -> {t.end_lr:g}, {t.precision}, "
            + (f"seeds {', '.join(map(str, sweep.seeds))}" if sweep.seeds else f"seed {t.seed}"),
            f"data: corpus {d.corpus}, tokenizer {d.tokenizer}; "
            + (
                _evaluation_fact(scored[0].result)
                if scored
                else "no loss columns (loss = false): the task columns below are the evaluation"
            ),
            (
                "each row trained once per seed: within a seed every row has the same data order, across "
                "seeds the "
                "initialisation and the data order differ and the evaluation targets do not; numbers are "
                "means over "
                "seeds; same budget, no per-method tuning"
            )
            if sweep.seeds
            else "every row trained with the same data order, budget and seed; no per-method tuning",
        ]
    facts += _existing_run_facts(sweep, run_dirs, scored if not configs else [])
    train_wall = sum(s.get("wall_time") or 0.0 for s in summaries.values())
    facts.append(
        f"sweep wall time {wall / 60:.1f} min (this invocation; reused runs cost nothing)"
        + (
            f"; the {len(summaries)} trained runs took {train_wall / 60:.1f} min of training in all, "
            "as their summaries record"
            if summaries
            else ""
        )
    )
    if extension_dirs:
        parents = [
            json.loads((p / "parent.json").read_text())
            for p in extension_dirs.values()
            if (p / "parent.json").is_file()
        ]
        ext_tokens = sorted({p["tokens"] for p in parents})
        facts.append(
            f"extension: {len(extension_dirs)} runs from the trained rows' final checkpoints, "
            f"L_e = {', '.join(str(x) for x in sorted({p['extended_length'] for p in parents}))}, "
            f"{', '.join(f'{x:,}' for x in ext_tokens)} tokens per run (the same for every method), "
            "fresh AdamW, lr continuing from the parent's final one (max(end_lr, 0.1 x lr) -> end_lr); each "
            "L_e column scores the same held-out windows "
            "of L_e tokens for every row, but each column scores its own spans (cut in L_e-token pieces from "
            "the documents long enough for that L_e), so compare rows within a column, not columns with "
            "each other"
        )
    if sweep.notes:
        facts.append(sweep.notes.strip())
    return facts
