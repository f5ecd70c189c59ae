"""The lm-evaluation-harness column defined in one place (``tasks/task.py``): the harness's tasks scored on a
run through the registered ``extrapos`` model (Gao et al. 2021, lm-evaluation-harness), once per row. Its
scoring is ``integrations/lm_eval.py``'s ``LmEvalEvaluator``; this file imports neither torch nor lm-eval."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from extrapos.errors import UserError
from extrapos.tasks.task import Command, Task, option


@dataclass
class LmEvalColumns:
    """A sweep's ``lm_eval = {...}``: the harness's tasks, scored once per row (at the run's L_t unless
    ``max_length``)."""

    tasks: list[str] = option(factory=list, help="lm-eval task names")
    num_fewshot: int | None = option(None, help="few-shot examples")
    limit: float | None = option(None, help="examples per task (or a fraction)")
    max_length: int | None = option(None, help="context length (default: the run's L_t)")
    batch_size: int = option(8, help="examples per batch")
    include_path: str | None = option(None, help="a directory of extra task YAMLs")
    include_defaults: bool = option(True, help="lm-eval's own tasks beside include_path's")
    metadata: dict[str, Any] | None = option(None, help='task metadata (e.g. {"max_seq_lengths": [4096]})')


class LmEvalTask(Task):
    name: ClassVar[str] = "lm-eval"
    evaluator: ClassVar[str] = "extrapos.integrations.lm_eval:LmEvalEvaluator"
    columns: ClassVar[type] = LmEvalColumns
    command: ClassVar[str | None] = "lm-eval"
    help: ClassVar[str] = "lm-evaluation-harness tasks on a run (hellaswag, arc_easy, ...)"
    description: ClassVar[str] = (
        "Run lm-evaluation-harness tasks through the registered `extrapos` model; results land in "
        "RUN/eval/lm-eval-*.json, with stderr as lm-eval computes it by default. Needs `pip install "
        "'extrapos[eval]'`. lm-eval's own command cannot find `--model extrapos` (its model list is fixed; a "
        "model is known only once the module registering it is imported): use `extrapos-lm-eval run --model "
        "extrapos --model_args run=RUN --tasks ...` (lm-eval's command with extrapos imported), or export "
        "the "
        "run (`extrapos export RUN --format remote-code --out DIR`) and run plain `lm_eval --model hf "
        "--model_args pretrained=DIR,trust_remote_code=True --tasks ...` (docs/tasks.md). lm-eval's own flag "
        "spellings (--num_fewshot, --batch_size, --include_path, --log_samples, --bootstrap_iters, "
        "--max_length) are accepted beside these."
    )
    common_flags: ClassVar[bool] = False
    per_length: ClassVar[bool] = False  # scored once per row, on an extension row's largest factor's run
    plots: ClassVar[bool] = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """lm-eval's settings, each flag also in lm-eval's own spelling (--num_fewshot, ...), so a command
        line written for lm_eval runs here unchanged."""
        m = parser
        m.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
        m.add_argument("--num-fewshot", "--num_fewshot", type=int, default=None)
        m.add_argument("--limit", type=float, default=None, help="examples per task (or a fraction)")
        m.add_argument(
            "--max-length",
            "--max_length",
            type=int,
            default=None,
            help="context length (default: the run's L_t)",
        )
        m.add_argument("--batch-size", "--batch_size", type=int, default=8)
        m.add_argument("--scale", type=float, default=None)
        m.add_argument("--rope-scaling", default=None, metavar="NAME")
        m.add_argument("--factor", type=float, default=None)
        m.add_argument(
            "--include-path", "--include_path", default=None, help="a directory of extra task YAMLs"
        )
        m.add_argument(
            "--metadata", default=None, help="JSON task metadata (e.g. '{\"max_seq_lengths\": [4096]}')"
        )
        m.add_argument(
            "--bootstrap-iters",
            "--bootstrap_iters",
            type=int,
            default=None,
            help="lm-eval's bootstrap resamples for the stderr of metrics without a closed form (default "
            "100000, lm-eval's; 0: no stderr)",
        )
        m.add_argument("--log-samples", "--log_samples", action="store_true")
        m.add_argument("--name", default=None, help="result name in RUN/eval/")
        m.add_argument("--overwrite", action="store_true", help="replace an existing different result")
        m.add_argument("--step", type=int, default=None)
        m.add_argument("--device", default="cpu")
        m.add_argument(
            "--no-progress",
            action="store_true",
            help="no progress bars (lm-eval's and datasets') and no note of a reused result",
        )

    def run_command(self, args: argparse.Namespace, cmd: Command) -> list[str]:
        from extrapos.integrations.lm_eval import LM_EVAL_BOOTSTRAP_ITERS, LmEvalOptions
        from extrapos.run.runtime import resolve_device

        if args.bootstrap_iters is not None and args.bootstrap_iters < 0:
            raise UserError(f"--bootstrap-iters must be 0 (no stderr) or more, got {args.bootstrap_iters}.")
        try:
            metadata = json.loads(args.metadata) if args.metadata else None
        except ValueError:
            raise UserError(f"--metadata must be JSON, got {args.metadata!r}.") from None
        device = resolve_device(args.device, "--device")
        request = LmEvalOptions(
            [t.strip() for t in args.tasks.split(",") if t.strip()],
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            max_length=args.max_length,
            batch_size=args.batch_size,
            scale=args.scale,
            rope_scaling=args.rope_scaling,
            factor=args.factor,
            include_path=args.include_path,
            metadata=metadata,
            bootstrap_iters=LM_EVAL_BOOTSTRAP_ITERS if args.bootstrap_iters is None else args.bootstrap_iters,
            log_samples=args.log_samples,
            step=args.step,
        )
        result = cmd.score(request, device, progress=not args.no_progress)
        return [
            f"{task}: {shown_metrics(metrics)}" for task, metrics in (result.get("results") or {}).items()
        ]

    def check_columns(self, spec: Any) -> None:
        from extrapos.tasks.common import check_lm_eval_request

        check_lm_eval_request(
            spec.limit, spec.batch_size, spec.num_fewshot, spec.metadata, spec.max_length, cli=False
        )

    def requires(self, spec: Any) -> str | None:
        if not spec.tasks:
            return 'lm-eval columns need lm_eval = { tasks = ["arc_easy", ...] }.'
        return None

    def refuse_row_options(self, spec: Any, options: dict[str, Any]) -> str | None:
        unsupported = set(options) - {"scale", "scaling", "factor"}
        if not unsupported:
            return None
        return (
            f"lm-eval columns take the eval options scale, scaling and factor only, not "
            f"{', '.join(sorted(unsupported))}; drop lm-eval or that row's option."
        )

    # ---- the report ----------------------------------------------------------------------------------

    def describe(self, rows: Sequence[Any]) -> str:
        first = next(row.tasks[self.name] for row in rows if self.name in row.tasks)
        return f"lm-evaluation-harness: {', '.join(first.get('tasks', []))}."

    def tables(self, rows: Sequence[Any], baseline: str | None) -> list[str]:
        return [lm_eval_table(rows), ""]

    def csv_rows(self, row_name: str, result: dict[str, Any]) -> list[list[Any]]:
        return [
            [row_name, f"lm-eval:{name}", "", result.get("max_length", ""), "", metric, f"{value:.6f}"]
            for name, (metric, value) in lm_eval_scores(result).items()
        ]

    def plot(self, rows: Sequence[Any], out_dir: Path, plt: Any) -> Path:
        raise NotImplementedError("lm-eval columns draw no plot (plots = False)")


def shown_metrics(metrics: dict[str, Any]) -> str:
    """``acc,none 0.5000 ± 0.0300, ...``: each metric with its stderr (lm-eval's ``NAME_stderr,FILTER``)."""
    shown = []
    for key, value in metrics.items():
        name, _, filt = key.partition(",")
        if not isinstance(value, float) or name.endswith("_stderr"):
            continue
        stderr = metrics.get(f"{name}_stderr,{filt}" if filt else f"{name}_stderr")
        shown.append(f"{key} {value:.4f}" + (f" ± {stderr:.4f}" if isinstance(stderr, float) else ""))
    return ", ".join(shown)


def lm_eval_scores(result: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """lm-eval task -> (metric, value): acc_norm where the task has it, else acc, else its first number."""
    out = {}
    for task, metrics in sorted(result.get("results", {}).items()):
        numbers = {
            k.split(",")[0]: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "stderr" not in k
        }
        for name in ("acc_norm", "acc", "exact_match"):
            if name in numbers:
                out[task] = (name, float(numbers[name]))
                break
        else:
            if numbers:
                name = sorted(numbers)[0]
                out[task] = (name, float(numbers[name]))
    return out


def lm_eval_table(rows: Sequence[Any]) -> str:
    """Rows x lm-eval tasks: each task's score (acc_norm where the task has it) at the row's max length."""
    scored = [row for row in rows if "lm-eval" in row.tasks]
    scores = {row.name: lm_eval_scores(row.tasks["lm-eval"]) for row in scored}
    cols = sorted({t for s in scores.values() for t in s})
    names = {t: next(s[t][0] for s in scores.values() if t in s) for t in cols}
    lines = [
        "| model | max length | " + " | ".join(f"{t} ({names[t]})" for t in cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for row in scored:
        cells = [f"{scores[row.name][t][1]:.3f}" if t in scores[row.name] else "–" for t in cols]
        lines.append(
            f"| {row.name} | {row.tasks['lm-eval'].get('max_length', '–')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)
