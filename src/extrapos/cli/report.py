"""`extrapos report`: rebuild tables and plots from saved evaluation results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="rebuild tables and plots from saved evaluation results")
    p.add_argument("paths", nargs="+", help="a compare directory, run directories or eval JSON files")
    p.add_argument(
        "--out", default=None, help="output directory (default: the compare directory, else ./report)"
    )
    p.add_argument(
        "--title",
        default=None,
        help="report title (default: the sweep's, saved by `extrapos compare`, else 'Length extrapolation')",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="the row differences are taken to (default: the sweep's baseline, else the first row)",
    )
    p.set_defaults(func=run)


def check_result_files(paths: list[str]) -> None:
    """Every JSON file named on the command line read before any work: an object holding the ``results``
    an extrapos evaluation writes (eval, passkey, synthetic-eval, lm-eval), else one sentence naming it."""
    from extrapos.errors import UserError

    for text in paths:
        path = Path(text)
        if not path.is_file():
            continue  # directories and missing paths: collect_rows names what it expected
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            raise UserError(
                f"{path} is not a readable JSON file; pass eval JSON files, run directories or a compare "
                "directory."
            ) from None
        results = data.get("results") if isinstance(data, dict) else None
        rows_ok = isinstance(results, dict) or (
            isinstance(results, list) and all(isinstance(r, dict) for r in results)
        )
        if not rows_ok:
            raise UserError(
                f"{path} is not a result of an extrapos evaluation (it has no results table); pass the "
                "JSON files eval, passkey, synthetic-eval or lm-eval wrote under RUN/eval/."
            )


#: written into a report directory ``report --out`` made; a later report replaces files only where it is
REPORT_MARKER = ".extrapos-report"
COMPARE_MARKER = ".extrapos-compare"
#: what a report writes (a directory of an older extrapos, before the marker, holds only these)
REPORT_NAMES = {"report.md", "results.csv", "results.json", "tasks.csv", "plots"}


def check_report_out(out: Path) -> None:
    """``--out``: new, empty, a report or compare directory, never inside a run, never the user's own."""
    from extrapos.owned import check_marked_dir

    if (out / COMPARE_MARKER).is_file():
        return
    check_marked_dir(out, "--out", REPORT_MARKER, "extrapos report", _older_report)


def _older_report(entries: set[str]) -> bool:
    return "report.md" in entries and entries <= REPORT_NAMES


def run(args: argparse.Namespace) -> int:
    from extrapos.files import atomic_write, check_text

    for flag in ("out", "title", "baseline"):
        check_text(getattr(args, flag), f"--{flag}")
    from extrapos.report.render import collect_rows, loss_rows, markdown_table, write_report
    from extrapos.tasks.task import registry

    check_result_files(args.paths)
    rows, compare_dir = collect_rows(args.paths)
    out = Path(args.out) if args.out else (compare_dir or Path("report"))
    if compare_dir is None or out.resolve() != compare_dir.resolve():
        check_report_out(out)
    facts, settings = None, {}
    if compare_dir is not None and (compare_dir / "facts.json").is_file():
        facts = json.loads((compare_dir / "facts.json").read_text())
    if compare_dir is not None and (compare_dir / "report.json").is_file():
        # the sweep's own title, baseline and tables, so a re-rendered report is byte-identical
        settings = json.loads((compare_dir / "report.json").read_text())
    title = args.title or settings.get("title") or "Length extrapolation"
    if not (out / COMPARE_MARKER).exists() and (loss_rows(rows) or any(row.tasks for row in rows)):
        # the marker before the first file: a report stopped part-way (a full disk, a kill) leaves a folder
        # the same command fills again, not one it must refuse as someone else's
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / REPORT_MARKER, "made by extrapos report: a later report may replace its files\n")
    report = write_report(
        rows,
        out,
        title,
        facts,
        baseline=args.baseline or settings.get("baseline"),
        sequence_ppl=bool(settings.get("sequence_ppl", False)),
        tasks=list(registry().values()),  # each task column's own section
    )
    if loss_rows(rows):
        print(markdown_table(loss_rows(rows)))
    print(f"-> {report}")
    return 0
