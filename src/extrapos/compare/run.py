"""`extrapos compare` itself: train (or reuse) every row, evaluate it, score its task columns, and write one
report."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extrapos.compare.budget import budget_fact, plan_budget
from extrapos.compare.facts import sweep_facts
from extrapos.compare.seeds import combine_seeds, merge_length_results
from extrapos.compare.sweep import (
    Sweep,
    SweepRow,
    load_sweep,
    row_config,
    run_slug,
    slug,
    task_specs,
)
from extrapos.compare.tasks import (
    TaskSpecs,
    mean_over_seeds,
    merge_lengths,
    write_row_result,
)
from extrapos.compare.tasks import score as score_task
from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, default_name
from extrapos.evaluate.evaluator import Unsupported, loss_evaluator
from extrapos.files import ABANDONED_SECONDS, atomic_write, sweep_temporaries
from extrapos.presets import find_sweep
from extrapos.report.render import Row, loss_rows, markdown_table, write_report
from extrapos.run.config import RunConfig, load_config
from extrapos.tasks.task import registry

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

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
    what an older extrapos compare wrote), outside every run's tree: the user's files are never replaced."""
    from extrapos.owned import refuse_inside_run

    refuse_inside_run(out, "--out")
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


# over the complexity budget (C901): the sweep's phases in order (validate, train, extend, evaluate, tasks,
# report), read top to bottom
def compare(  # noqa: C901
    spec: str,
    out: str | Path,
    extra: list[str] | None = None,
    progress: bool = True,
    max_eval_tokens: int | None = None,
    budget_seconds: float | None = None,
) -> Path:
    """Run (or resume) a sweep into ``out``; returns the report path.

    Under torchrun every row trains on all the processes (data parallel, as ``extrapos train``) and
    is scored by them together (``evaluate`` and the passkey column deal their work out); rank 0
    alone writes the comparison's files and prints (docs/distributed.md).
    """
    from extrapos.run.runtime import init_distributed, resolve_device
    from extrapos.training.trainer import run_is_complete, train

    sweep = load_sweep(spec)
    specs = task_specs(sweep, find_sweep(spec))
    if max_eval_tokens is not None and max_eval_tokens < 1:
        raise UserError(f"--max-eval-tokens must be a positive number of tokens, got {max_eval_tokens}.")
    if budget_seconds is not None:
        if not math.isfinite(budget_seconds) or budget_seconds <= 0:
            raise UserError(f"--budget-seconds must be a positive number of seconds, got {budget_seconds:g}.")
        sweep = replace(sweep, budget_seconds=budget_seconds)
    out = Path(out)
    check_out_dir(out)  # before anything is written: never into a directory extrapos did not make
    _check_row_options(sweep, find_sweep(spec), specs, list(extra or []))
    rank, world, device = init_distributed(resolve_device(sweep_device(sweep, list(extra or []))))
    main = rank == 0
    progress = progress and main

    def say(text: str) -> None:
        if main:
            logger.info(text)

    run_dirs: dict[tuple[str, int | None], Path] = {
        (r.name, None): existing_run(r) for r in sweep.rows if r.run
    }
    out.mkdir(parents=True, exist_ok=True)
    if main and not (out / OUT_MARKER).is_file():
        atomic_write(out / OUT_MARKER, json.dumps({"made_by": "extrapos compare"}) + "\n")
    if main:  # what a killed compare left before a rename (its rows' runs sweep their own)
        for folder in (out, out / "merged", *sorted(p for p in (out / "tasks").glob("*") if p.is_dir())):
            sweep_temporaries(folder, older_than=ABANDONED_SECONDS)
    t0 = time.perf_counter()
    trained = [r for r in sweep.rows if not r.reuse and r.extend is None and r.run is None]
    seeds: list[int | None] = list(sweep.seeds) if sweep.seeds else [None]
    jobs = [(row, seed) for row in trained for seed in seeds]
    configs: dict[tuple[str, int | None], RunConfig] = {}
    _check_heldout_fits(sweep, trained, list(extra or []), progress=main)
    budget: dict[str, Any] | None = None
    run_extra = list(extra or [])
    if sweep.budget_seconds is not None and trained:
        budget = plan_budget(sweep, trained, len(seeds), run_extra, out, device, rank, world, say)
        # after the sweep's and the row's own budget, before the command line's overrides
        run_extra = [f"train.tokens={budget['tokens_per_run']}", *run_extra]
    for i, (row, seed) in enumerate(jobs, 1):
        # the seed goes last: it is what distinguishes the runs of one row
        cfg = row_config(sweep, row, run_extra + ([f"train.seed={seed}"] if seed is not None else []))
        run_dir = out / "runs" / run_slug(row.name, seed)
        label = row.name if seed is None else f"{row.name} (seed {seed})"
        run_dirs[(row.name, seed)], configs[(row.name, seed)] = run_dir, cfg
        if run_is_complete(run_dir):
            _check_same_config(run_dir, cfg, device)
            say(f"[{i}/{len(jobs)}] {label}: finished run reused ({run_dir})")
            continue
        resume = (run_dir / "config.toml").is_file()
        if resume:
            _check_same_config(run_dir, cfg, device)
        say(f"[{i}/{len(jobs)}] {label}: {'resuming' if resume else 'training'} -> {run_dir}")
        train(cfg, run_dir, resume=resume, progress=progress)
    extension_dirs = _run_extensions(sweep, out, run_dirs, list(extra or []), progress, seeds, say)

    entries, rows = [], []
    max_tokens = sweep.max_eval_tokens if max_eval_tokens is None else max_eval_tokens
    precision = sweep.eval_precision_on(str(device))
    for row in sweep.rows:
        result: dict[str, Any] | None = None
        entry: dict[str, Any] = {"name": row.name}
        if sweep.loss:
            per_seed = [
                _evaluate_row(
                    sweep,
                    row,
                    seed,
                    out,
                    run_dirs,
                    extension_dirs,
                    max_tokens,
                    progress,
                    str(device),
                    main,
                    precision,
                )
                for seed in seeds
            ]
            if sweep.seeds:
                result = combine_seeds([r for r, _, _ in per_seed], list(sweep.seeds))
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
            if progress:  # as `extrapos eval` prints it: the row's loss evaluator formats its result
                from extrapos.run.handle import Run

                first = runs[0] if isinstance(runs, list) else runs
                say(f"{row.name}:\n{loss_evaluator(Run.open(out / first)).format(result)}")
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
    facts = sweep_facts(sweep, configs, run_dirs, rows, time.perf_counter() - t0, extension_dirs)
    if budget is not None:
        facts.insert(len(facts) - (1 if sweep.notes else 0), budget_fact(budget))
    atomic_write(out / "facts.json", json.dumps(facts, indent=1))
    settings = report_settings(sweep)
    atomic_write(out / "report.json", json.dumps(settings, indent=1))
    report = write_report(rows, out, facts=facts, **settings, tasks=list(registry().values()))
    if loss_rows(rows):
        logger.info(markdown_table(loss_rows(rows)))
    logger.info(f"-> {report}")
    return report


def _check_row_options(sweep: Sweep, path: Path, specs: TaskSpecs, extra: list[str]) -> None:
    """Every row's ``eval`` options checked against the encoding it evaluates before the first row trains
    (``tasks.common.check_encoding_options``: unknown options, wrong types, values that make the loss
    NaN), and against what the lm-eval column can apply; task columns refuse an encoder row, and lengths
    too short for their prompts with the row's tokenizer (``_check_task_tokens``)."""
    from extrapos.run.config import load_run_config
    from extrapos.tasks.common import check_encoding_options
    from extrapos.tasks.task import task

    by_name = {r.name: r for r in sweep.rows}
    for row in sweep.rows:
        if not row.eval and not specs.enabled() and sweep.protocol == "documents":
            continue
        source = by_name[row.reuse] if row.reuse else row
        if source.extend is not None:
            source = by_name[source.extend.parent]
        run_dir = existing_run(source) if source.run is not None else None
        cfg = load_run_config(run_dir) if run_dir is not None else row_config(sweep, source, extra)
        _check_task_memory(sweep, path, specs, row, cfg)
        if specs.enabled() and cfg.train.objective == "mlm":
            raise UserError(
                f"{path}: row '{row.name}' is an encoder (objective mlm) and the task columns "
                f"({', '.join(specs.enabled())}) score a decoder's next-token predictions; drop tasks or "
                "that row."
            )
        if cfg.train.objective == "mlm" and sweep.loss and sweep.protocol != "documents":
            raise UserError(  # refused by the evaluation only after the row trained (42 s of a tiny sweep)
                f"{path}: row '{row.name}' is an encoder (objective mlm), whose masked-LM evaluation uses "
                f"the documents protocol only; drop protocol = {sweep.protocol!r} or that row."
            )
        _check_task_tokens(sweep, path, specs, row, cfg, run_dir)
        check_encoding_options(cfg, dict(row.eval), f"{path}: row '{row.name}' eval options")
        for name in specs.enabled():
            refusal = task(name).refuse_row_options(specs.spec(name), dict(row.eval))
            if refusal:
                raise UserError(f"{path}: row '{row.name}': {refusal}")


def _check_task_memory(sweep: Sweep, path: Path, specs: TaskSpecs, row: SweepRow, cfg: RunConfig) -> None:
    """Each task column's estimates for ``row`` (its longest length, from the config it will train with;
    ``Task.check_row``), before any row trains: a trial count or a length that cannot fit is refused now,
    not after training every row. Checked against the host's memory (asking a GPU here would open a CUDA
    context before torchrun's processes pick their devices); each task checks its own device again when
    it scores."""
    from extrapos.tasks.task import task

    for name in specs.enabled():
        try:
            task(name).check_row(specs.spec(name), cfg.model, _task_lengths(sweep, row))
        except UserError as e:
            raise UserError(f"{path}: row '{row.name}': {e}") from None


def _check_task_tokens(
    sweep: Sweep, path: Path, specs: TaskSpecs, row: SweepRow, cfg: RunConfig, run_dir: Path | None
) -> None:
    """What each task column's prompts need of ``row``'s tokenizer (``Task.check_row_tokens``; ``run_dir``:
    the run a ``run = ...`` row scores), before any row trains: a passkey length too short for its needle
    was refused only by every row's scoring, after its training."""
    from extrapos.tasks.task import task

    for name in specs.enabled():
        try:
            task(name).check_row_tokens(specs.spec(name), cfg, run_dir, _task_lengths(sweep, row))
        except UserError as e:
            raise UserError(f"{path}: row '{row.name}': {e}") from None


def _task_lengths(sweep: Sweep, row: SweepRow) -> list[int]:
    """The lengths a row's task columns are scored at: an extension row's factors, else the sweep's."""
    return list(row.factors) if row.extend is not None else list(sweep.lengths)


def sweep_device(sweep: Sweep, extra: list[str]) -> str:
    """``train.device`` of the sweep's preset with the sweep's and the command line's overrides: where
    every row trains and is scored."""
    overrides = [o for o in [*sweep.set, *extra] if not o.startswith("model.positions")]
    return load_config(sweep.train, overrides).train.device


def existing_run(row: SweepRow) -> Path:
    """The run directory a ``run = ...`` row names (relative paths from the current directory), checked."""
    assert row.run is not None, "existing_run is asked only for a run = ... row"
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
    """task -> the row's result: an extension row's factor-k run scored at ev = k (in its parent's L_t; a
    task scored once per row, ``per_length`` false as lm-eval's: the largest factor's run), every other row at
    the sweep's lengths; the mean over seeds with ``seeds``."""
    from extrapos.tasks.task import task as task_named

    results = {}
    for task in specs.enabled():
        per_length = task_named(task).per_length
        per_seed = []
        for seed in seeds:
            if row.extend is not None:
                factors = row.factors if per_length else row.factors[-1:]
                parts = []
                for k in factors:
                    run_dir = extension_dirs[(row.name, k, seed)]
                    base = json.loads((run_dir / "parent.json").read_text())["train_length"]
                    parts.append(
                        score_task(task, specs, run_dir, [k], dict(row.eval), base, progress, device)
                    )
                per_seed.append(merge_lengths(parts) if per_length else parts[0])
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
    """A row's loss evaluation of one run, the one the run takes (``evaluate.evaluator.loss_evaluator``):
    the masked-LM loss on the same masked tokens at every length for an encoder trained with objective
    mlm, the next-token loss (sharded under torchrun) otherwise; its result names prefixed as the
    evaluator says, so a run's two kinds of loss never meet."""
    from extrapos.evaluate.driver import drive
    from extrapos.evaluate.evaluator import Scoring, loss_evaluator
    from extrapos.run.handle import Run

    run = Run.open(run_dir)
    loss = loss_evaluator(run)
    try:
        request = loss.loss_request(run, req, None)
    except Unsupported as e:
        raise UserError(_sweep_words(run_dir, e, req)) from None
    name = None if name is None else f"{loss.name_prefix}{name}"
    with _compare_advice(run_dir):
        return drive(loss, run, request, None, Scoring(name, device=device, progress=progress))


def _sweep_words(run_dir: Path, refusal: Unsupported, req: EvalRequest) -> str:
    """What the loss evaluation of ``run_dir`` cannot do, said in a sweep's words (it has no flags)."""
    if refusal.what == "protocol":
        return (
            f"{run_dir} is an encoder, whose masked-LM evaluation uses the documents protocol only; "
            f"drop protocol = {req.protocol!r} from the sweep."
        )
    if refusal.what == "torchrun":
        return (
            f"{run_dir} is an encoder, whose masked-LM evaluation runs in one process; compare "
            "encoder sweeps without torchrun."
        )
    return str(refusal)


@contextmanager
def _compare_advice(run_dir: Path) -> Iterator[None]:
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
    precision: str = "fp32",
) -> tuple[dict[str, Any], Any, str]:
    """(result, run path(s) relative to ``out``, result file relative to ``out``) of one row at one seed,
    scored in ``precision``; ``main``: this process writes the comparison's copies (rank 0 under
    torchrun)."""
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
            req = sweep.eval_request([k], row.eval, max_tokens, precision)
            name = f"{default_name(req)}-ev{k}"
            results.append(score_run(run_dir, req, name=name, progress=progress, device=device))
        result = merge_length_results(results)
        merged = out / "merged" / f"{run_slug(row.name, seed)}.json"
        if main:
            merged.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(merged, json.dumps(result, indent=1))
        return result, [_rel(p, out) for p, _ in parts], str(merged.relative_to(out))
    source = run_dirs[(row.reuse or row.name, seed)]
    req = sweep.eval_request(sweep.lengths, row.eval, max_tokens, precision)
    result = score_run(source, req, progress=progress, device=device)
    saved = source / "eval" / f"{result['name']}.json"
    if not saved.resolve().is_relative_to(out.resolve()):
        # an existing run outside the comparison: the report reads only files inside it, so keep a copy
        saved = out / "merged" / f"{run_slug(row.name, seed)}.json"
        if main:
            saved.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(saved, json.dumps(result, indent=1))
    return result, _rel(source, out), str(saved.relative_to(out))


def _check_heldout_fits(
    sweep: Sweep, trained: list[SweepRow], extra: list[str], progress: bool = True
) -> None:
    """Before any training: the test split must hold a document for the longest evaluated window (the
    documents protocol) or a stream long enough for it (the stream protocol)."""
    from extrapos.data import check_heldout, open_split
    from extrapos.data.synthetic import task_of
    from extrapos.evaluate.stream import TokenStream, select_blocks
    from extrapos.run.runtime import prepare_run_data

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
    say: Callable[[str], None] = logger.info,
) -> dict[tuple[str, int, int | None], Path]:
    """Train (or reuse / resume) every extension run: OUT/runs/<row>-x<k>[-seed<s>], from its parent row's
    run of the same seed (an extension keeps its parent's train.seed)."""
    from extrapos.run.config import BUDGET_KEYS, parse_override
    from extrapos.training.extend import extend
    from extrapos.training.trainer import run_is_complete

    extra = [o for o in extra if parse_override(o)[0] not in (["train", k] for k in BUDGET_KEYS)]
    jobs = [
        (row, k, seed) for row in sweep.rows if row.extend is not None for k in row.factors for seed in seeds
    ]
    dirs = {}
    for i, (row, k, seed) in enumerate(jobs, 1):
        e = row.extend
        assert e is not None  # jobs holds only the rows with an extension
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


def _check_same_config(run_dir: Path, cfg: RunConfig, device: torch.device) -> None:
    """A run the sweep reuses or resumes was trained with the row's config; ``train.precision = "auto"`` is
    compared as it resolves here, since a run's config.toml records what auto picked."""
    from extrapos.run.precision import with_resolved_precision

    saved = (run_dir / "config.toml").read_text()
    if saved != with_resolved_precision(cfg, device)[0].to_toml():
        raise UserError(
            f"{run_dir} was trained with a different config than this sweep asks for; "
            "delete that run directory or use another --out."
        )
