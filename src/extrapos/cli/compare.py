"""`extrapos compare`: train and evaluate a set of encodings, then write one report."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="train and evaluate a set of encodings; write a report",
        description="Run a comparison preset (default: quick) end to end; resumable.",
    )
    p.add_argument("preset", nargs="?", default="quick", help="a comparison preset or a sweep .toml")
    p.add_argument("--out", default=None, help="output directory (default: runs/compare-<preset>)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a training key for every row (e.g. train.tokens=200000)",
    )
    p.add_argument("--max-eval-tokens", type=int, default=None, help="target tokens scored per length")
    p.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="seconds of training for all rows together, split into equal tokens per run by a measured "
        "step of each row (replaces the sweep's budget_seconds and its rows' train budget)",
    )
    p.add_argument(
        "--against",
        default=None,
        metavar="FILE",
        help="a published results.json to set this table beside, each cell judged by run-to-run noise (the "
        "seeds run beside it, X-seeds/results.json for X/results.json, measures it; default: the preset's "
        "own table, docs/results/PRESET/results.json, where the repository publishes one)",
    )
    p.add_argument("--list", action="store_true", help="list the comparison presets")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from extrapos.compare import compare, load_sweep, slug
    from extrapos.compare.published import check_against, closing_words
    from extrapos.files import check_text
    from extrapos.presets import sweep_names

    check_text(args.out, "--out")
    check_text(args.preset, "PRESET")
    if args.list:
        for name in sweep_names():
            print(f"{name:28s} {load_sweep(name).title}")
        return 0
    if args.against is not None:
        check_text(args.against, "--against")
        check_against(args.against)
    out = Path(args.out) if args.out else Path("runs") / f"compare-{slug(Path(args.preset).stem)}"
    compare(
        args.preset,
        out,
        args.overrides,
        progress=not args.no_progress,
        max_eval_tokens=args.max_eval_tokens,
        budget_seconds=args.budget_seconds,
    )
    words = closing_words(args.preset, out, args.against, _changed(args)) if _is_main() else None
    if words:
        print(f"\n{words}")
    return 0


def _changed(args: argparse.Namespace) -> str | None:
    """The options by which this run departs from its preset, in the user's words (None: none)."""
    given = [f"--set {o}" for o in args.overrides]
    if args.max_eval_tokens is not None:
        given.append(f"--max-eval-tokens {args.max_eval_tokens}")
    if args.budget_seconds is not None:
        given.append(f"--budget-seconds {args.budget_seconds:g}")
    return ", ".join(given) or None


def _is_main() -> bool:
    """Rank 0 of a torchrun group, or the one process: only it prints the comparison's last words."""
    from extrapos.run.runtime import process_group

    return process_group()[0] == 0
