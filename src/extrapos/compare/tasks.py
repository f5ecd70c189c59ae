"""Task columns of a comparison sweep: passkey retrieval, RULER tasks, synthetic-task accuracy, lm-eval
scores and attention diagnostics per row.

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
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from extrapos import schema
from extrapos.data.ruler_tasks import SYNTHETIC_TASKS
from extrapos.errors import UserError
from extrapos.files import atomic_write

TASKS = ("synthetic", "passkey", "ruler", "lm-eval", "attention")


@dataclass
class SyntheticColumns:
    """Accuracy on the answer tokens of a synthetic task (Kazemnejad et al. 2023, §4)."""

    examples: int = 64
    task: str | None = None  # a synthetic:... spec; default: the task the run trained on
    seed: int | None = None  # the evaluation examples' seed; default: the task's


@dataclass
class PasskeyColumns:
    """Passkey retrieval (Mohtashami & Jaggi 2023, §4.2): accuracy per length, the mean over depths."""

    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 10
    mode: str = "rank"
    candidates: int = 10
    haystack: str = "filler"
    key_digits: int = 5
    seed: int = 0


@dataclass
class RulerColumns:
    """RULER's tasks (Hsieh et al. 2024, ``extrapos.tasks.ruler.RulerOptions``'s fields and defaults): the
    metric per length, the mean over the tasks (RULER's average); the per-task grid is in each row's JSON
    and the report's per-task table. A CPU preset sets smaller sizes and the short template
    (configs/compare/ruler.toml trains on the same shapes)."""

    tasks: list[str] = field(default_factory=lambda: list(SYNTHETIC_TASKS))
    trials: int = 20
    mode: str = "generate"
    candidates: int = 10
    essay: str = "auto"
    template: str = "ruler"
    digits: int = 7
    uuid_hex: int = 32
    needles: int = 4
    hops: int = 4
    vt_digits: int = 5
    var_letters: int = 5
    common: int = 10
    coded_letters: int = 6
    squad: str | None = None
    hotpotqa: str | None = None
    max_new_tokens: int | None = None
    seed: int = 0


@dataclass
class LmEvalColumns:
    """lm-evaluation-harness tasks, scored once per row (at the run's L_t unless ``max_length``)."""

    tasks: list[str] = field(default_factory=list)
    num_fewshot: int | None = None
    limit: float | None = None
    max_length: int | None = None
    batch_size: int = 8
    include_path: str | None = None
    include_defaults: bool = True
    metadata: dict[str, Any] | None = None


@dataclass
class AttentionColumns:
    """Attention diagnostics (``extrapos attention``, docs/attention-diagnostics.md) on the held-out windows
    of each length: ``statistics`` averaged over every query, layer and head, with intervals over the
    documents; the per-layer and per-head values are in each row's JSON."""

    statistics: list[str] = field(default_factory=lambda: ["mean_distance", "entropy"])
    max_tokens: int = 16_384  # tokens read per length, as `extrapos attention --max-tokens`
    split: str = "test"

    def keyed(self) -> dict[str, Any]:
        """What the result depends on (the statistics shown are read from it, so they change no name)."""
        return {"max_tokens": self.max_tokens, "split": self.split}


@dataclass
class TaskSpecs:
    synthetic: SyntheticColumns | None = None
    passkey: PasskeyColumns | None = None
    ruler: RulerColumns | None = None
    lm_eval: LmEvalColumns | None = None
    attention: AttentionColumns | None = None

    def enabled(self) -> list[str]:
        return [t for t in TASKS if getattr(self, t.replace("-", "_")) is not None]


def parse_task_specs(path: Path, tasks: list[str], options: dict[str, dict[str, Any] | None]) -> TaskSpecs:
    """The sweep's ``tasks`` list and option tables, checked; an option table for an unlisted task is refused
    (it would silently do nothing)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or len(set(tasks)) != len(tasks):
        raise UserError(f"{path}: tasks must be distinct names from {', '.join(TASKS)}, got {tasks}.")
    specs = TaskSpecs()
    for task, cls in (
        ("synthetic", SyntheticColumns),
        ("passkey", PasskeyColumns),
        ("ruler", RulerColumns),
        ("lm-eval", LmEvalColumns),
        ("attention", AttentionColumns),
    ):
        key = task.replace("-", "_")
        raw = options.get(key)
        if raw is not None and task not in tasks:
            raise UserError(
                f"{path}: '{key}' options are given but tasks does not list \"{task}\"; add it to tasks."
            )
        if task not in tasks:
            continue
        keys = ", ".join(f.name for f in fields(cls))
        spec = schema.build(
            cls,
            dict(raw or {}),
            where=f"{path}: {key}.{{key}}",
            unknown=f"{path}: {key} has no option '{{key}}'; its options are {keys}.",
        )
        setattr(specs, key, spec)
    if specs.passkey is not None and specs.passkey.mode not in ("rank", "generate", "both"):
        raise UserError(f"{path}: passkey.mode must be rank, generate or both, got {specs.passkey.mode!r}.")
    if specs.lm_eval is not None and not specs.lm_eval.tasks:
        raise UserError(f'{path}: lm-eval columns need lm_eval = {{ tasks = ["arc_easy", ...] }}.')
    _check_values(path, specs)
    return specs


def _check_values(path: Path, specs: TaskSpecs) -> None:  # noqa: C901 (one check per task option)
    """Every task option checked by the task's own validators before the sweep trains its first row (a
    value refused only after training would cost every row's training first), named by its sweep key."""
    from extrapos.tasks.common import MAX_KEY_DIGITS, check_lm_eval_request, check_seed

    def fail(table: str, rule: str) -> None:
        raise UserError(f"{path}: {table}.{rule.rstrip('.').removeprefix('--')}.")

    if specs.passkey is not None:
        from extrapos.tasks.passkey import check_candidates

        p = specs.passkey
        if p.trials < 1:
            fail("passkey", f"trials must be at least 1, got {p.trials}")
        if not p.depths or any(not 0 <= d <= 1 for d in p.depths):
            fail("passkey", f"depths must be a non-empty list of fractions in [0, 1], got {p.depths}")
        if not 1 <= p.key_digits <= MAX_KEY_DIGITS:
            fail("passkey", f"key_digits must be between 1 and {MAX_KEY_DIGITS}, got {p.key_digits}")
        try:
            check_candidates(p.mode, p.candidates, p.key_digits)
            check_seed(p.seed, "seed")
        except UserError as e:
            fail("passkey", str(e))
    if specs.ruler is not None:
        from extrapos.tasks.ruler import RulerOptions

        try:
            RulerOptions(**asdict(specs.ruler), lengths=[1]).checked()
        except UserError as e:
            fail("ruler", str(e))
    if specs.synthetic is not None:
        from extrapos.data.synthetic import SyntheticTask

        s = specs.synthetic
        if s.examples < 1:
            fail("synthetic", f"examples must be at least 1, got {s.examples}")
        try:
            check_seed(s.seed, "seed")
        except UserError as e:
            fail("synthetic", str(e))
        if s.task is not None:
            try:
                SyntheticTask.parse(s.task)
            except UserError as e:
                raise UserError(f"{path}: synthetic.task: {e}") from None
    if specs.lm_eval is not None:
        lm = specs.lm_eval
        try:
            check_lm_eval_request(
                lm.limit, lm.batch_size, lm.num_fewshot, lm.metadata, lm.max_length, cli=False
            )
        except UserError as err:
            fail("lm_eval", str(err))
    if specs.attention is not None:
        from extrapos.evaluate.attention_stats import STATISTICS

        a = specs.attention
        if (
            not a.statistics
            or len(set(a.statistics)) != len(a.statistics)
            or set(a.statistics) - set(STATISTICS)
        ):
            fail(
                "attention",
                f"statistics must list distinct names from {', '.join(STATISTICS)}, got {a.statistics}",
            )
        if a.max_tokens < 1:
            fail("attention", f"max_tokens must be a positive number of tokens, got {a.max_tokens}")
        if a.split not in ("train", "val", "test"):
            fail("attention", f"split must be train, val or test, got {a.split!r}")


Spec = TypeVar("Spec")


def _listed(spec: Spec | None) -> Spec:
    """A task column's options; ``score`` is only asked for the columns the sweep lists, which are set."""
    assert spec is not None, "score() is called only for the task columns the sweep lists"
    return spec


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
    ``device`` by the evaluator registered under the task's name (``evaluate.evaluator``), which turns the
    column's options into its request. Under torchrun the passkey column deals its prompts out to the
    processes; the synthetic and lm-eval columns are scored whole by every process (the same numbers)."""
    from extrapos.evaluate.evaluator import ColumnAt, Scoring, column_evaluator
    from extrapos.run.handle import Run

    spec = _listed(getattr(specs, task.replace("-", "_")))
    at = ColumnAt(list(lengths), position_options, base_length)
    return column_evaluator(task).column(Run(run_dir), spec, at, Scoring(device=device, progress=progress))


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
