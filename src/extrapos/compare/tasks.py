"""Task columns of a comparison sweep: any registered task (``tasks/task.py``: passkey retrieval, RULER tasks,
synthetic-task accuracy, lm-eval scores, attention diagnostics, or a plug-in's) scored per row.

Perplexity can stay flat past L_t while a model ignores the far context, so a sweep may score its rows
on tasks beside (or, with ``loss = false``, instead of) the loss columns::

    tasks = ["synthetic", "passkey", "ruler", "lm-eval", "attention"]
    synthetic = { examples = 64 }                               # extrapos.tasks.synthetic.score_synthetic
    passkey = { depths = [0, 0.5, 1], trials = 10, mode = "rank" }  # extrapos.tasks.passkey.passkey
    ruler = { trials = 20 }                                     # extrapos.tasks.ruler.ruler
    lm_eval = { tasks = ["arc_easy"], limit = 200 }             # extrapos.integrations.lm_eval.run_lm_eval
    attention = { statistics = ["mean_distance", "entropy"] }  # extrapos.evaluate.attention_stats.diagnose

Every row is scored at the sweep's ``lengths`` (multiples of L_t) with the row's ``eval`` options
(so a ``reuse`` row scores its run with an inference-time change); an extension row's factor-k run
is scored at ev = k only, in units of its parent's L_t, exactly like its loss column. The task
functions write into the run's own ``eval/`` directory (the diagnostics into its ``attention/``) through
the result slot every evaluator shares (``evaluate.slot``: an identical earlier request is reused); the
row's result, merged over extension runs and averaged over seeds, is copied to
``OUT/tasks/<task>/<row>.json``, which is what the report reads (``extrapos.report.task_tables``).

This file names no task: a column's options, their checks and its scoring are its task's
(``tasks/task.py``); a task in ``tasks`` is one the registry holds, its options the sweep's table under the
task's key.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from extrapos import schema
from extrapos.errors import UserError
from extrapos.files import atomic_write
from extrapos.tasks.task import BUILTIN

#: the built-in task columns (a sweep may name any registered task: ``task_keys``)
TASKS = tuple(BUILTIN)


class TaskSpecs:
    """The sweep's task columns: task name -> its options (the task's ``columns``, checked), in the
    registry's order; ``specs.passkey`` (the table key) reads one, None when the sweep does not list it."""

    def __init__(self, specs: dict[str, Any] | None = None):
        self.specs: dict[str, Any] = dict(specs or {})

    def __getattr__(self, key: str) -> Any:
        if key == "specs":  # before __init__ set it (copy, pickle)
            raise AttributeError(key)
        return next((spec for name, spec in self.specs.items() if name.replace("-", "_") == key), None)

    def enabled(self) -> list[str]:
        return list(self.specs)

    def spec(self, task: str) -> Any:
        """The options of a listed task column."""
        assert task in self.specs, "asked only for the task columns the sweep lists"
        return self.specs[task]


def task_keys() -> list[str]:
    """The option tables a sweep may hold, one per registered task (``lm_eval`` for ``lm-eval``)."""
    from extrapos.tasks.task import registry

    return [t.key for t in registry().values()]


def parse_task_specs(path: Path, tasks: list[str], options: Mapping[str, dict[str, Any] | None]) -> TaskSpecs:
    """The sweep's ``tasks`` list and option tables, each built into its task's options and checked by the
    task (``tasks/task.py``) before any row trains (a value refused only after training would cost every
    row's training first), named by its sweep key; an option table for an unlisted task is refused (it
    would silently do nothing)."""
    from extrapos.tasks.task import registry

    known = registry()
    unknown = [t for t in tasks if t not in known]
    if unknown or len(set(tasks)) != len(tasks):
        raise UserError(f"{path}: tasks must be distinct names from {', '.join(known)}, got {tasks}.")
    specs = {}
    for name, task in known.items():
        key = task.key
        raw = options.get(key)
        if raw is not None and name not in tasks:
            raise UserError(
                f"{path}: '{key}' options are given but tasks does not list \"{name}\"; add it to tasks."
            )
        if name not in tasks:
            continue
        keys = ", ".join(f.name for f in fields(task.columns))
        specs[name] = schema.build(
            task.columns,
            dict(raw or {}),
            where=f"{path}: {key}.{{key}}",
            unknown=f"{path}: {key} has no option '{{key}}'; its options are {keys}.",
        )
    for name, spec in specs.items():
        missing = known[name].requires(spec)
        if missing:
            raise UserError(f"{path}: {missing}")
    for name, spec in specs.items():
        try:
            known[name].check_columns(spec)
        except UserError as e:
            raise UserError(f"{path}: {known[name].key}.{str(e).rstrip('.').removeprefix('--')}.") from None
    return TaskSpecs(specs)


def score(
    task: str,
    specs: TaskSpecs,
    run_dir: Path,
    lengths: list[int],
    position_options: dict[str, Any],
    base_length: int | None,
    progress: bool,
    device: str = "cpu",
) -> dict[str, Any]:
    """One run's result for ``task`` at ``lengths`` (x ``base_length``, default the run's L_t), scored on
    ``device`` by the task's evaluator, which turns the column's options into its request. Under torchrun
    the passkey column deals its prompts out to the processes; the synthetic and lm-eval columns are scored
    whole by every process (the same numbers)."""
    from extrapos.evaluate.evaluator import ColumnAt, Scoring
    from extrapos.run.handle import Run
    from extrapos.tasks.task import task as task_named

    at = ColumnAt(list(lengths), position_options, base_length)
    evaluator = task_named(task).make_evaluator()
    return evaluator.column(Run(run_dir), specs.spec(task), at, Scoring(device=device, progress=progress))


def merge_lengths(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Results of one row scored one length each (extension runs) as one result with every length."""
    merged = {k: v for k, v in results[-1].items() if k not in ("results", "by_length")}
    merged["results"] = [c for r in results for c in r["results"]]
    if all("by_length" in r for r in results):
        merged["by_length"] = [c for r in results for c in r["by_length"]]
    merged["parts"] = [{"run": r["run"], "name": r["name"]} for r in results]
    merged["wall_time"] = sum(r.get("wall_time", 0.0) for r in results)
    return merged


def mean_over_seeds(results: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """One row from its per-seed results: every number in a cell the mean over seeds (cells matched by
    position: every seed scored the same lengths, depths and examples); the per-seed results under
    ``seeds``."""
    combined = {k: v for k, v in results[0].items() if k not in ("results", "by_length", "wall_time")}
    for key in ("results", "by_length"):
        if key in results[0]:
            combined[key] = _mean_cells([r[key] for r in results])
    combined["seed_values"] = list(seeds)
    combined["wall_time"] = sum(r.get("wall_time", 0.0) for r in results)
    combined["seeds"] = results
    return combined


def _mean_cells(per_seed: list[Any]) -> Any:
    first = per_seed[0]
    if isinstance(first, dict):
        return {k: _mean_cells([p[k] for p in per_seed]) for k in first}
    if isinstance(first, list):
        return [_mean_cells(list(v)) for v in zip(*per_seed)]
    if isinstance(first, (int, float)) and not isinstance(first, bool) and all(p == first for p in per_seed):
        return first  # lengths, depths, counts: the same for every seed
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.fmean(per_seed)
    return first


def write_row_result(out: Path, task: str, row_slug: str, result: dict[str, Any], write: bool = True) -> str:
    """Copy a row's task result into the comparison directory (unless ``write`` is false: a process other
    than rank 0); returns its path relative to ``out``."""
    path = out / "tasks" / task / f"{row_slug}.json"
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(result, indent=1, default=str))
    return str(path.relative_to(out))
