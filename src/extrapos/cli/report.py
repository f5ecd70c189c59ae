"""`extrapos report`: rebuild tables and plots from saved evaluation results."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
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


def run(args) -> int:
    from extrapos.report import collect_rows, loss_rows, markdown_table, write_report

    rows, compare_dir = collect_rows(args.paths)
    out = Path(args.out) if args.out else (compare_dir or Path("report"))
    facts, settings = None, {}
    if compare_dir is not None and (compare_dir / "facts.json").is_file():
        facts = json.loads((compare_dir / "facts.json").read_text())
    if compare_dir is not None and (compare_dir / "report.json").is_file():
        # the sweep's own title, baseline and tables, so a re-rendered report is byte-identical
        settings = json.loads((compare_dir / "report.json").read_text())
    title = args.title or settings.get("title") or "Length extrapolation"
    report = write_report(
        rows,
        out,
        title,
        facts,
        baseline=args.baseline or settings.get("baseline"),
        sequence_ppl=bool(settings.get("sequence_ppl", False)),
    )
    if loss_rows(rows):
        print(markdown_table(loss_rows(rows)))
    print(f"-> {report}")
    return 0
