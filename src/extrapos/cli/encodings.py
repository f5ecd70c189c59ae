"""`extrapos encodings`: list the registered positional encodings."""

from __future__ import annotations

import argparse

DEFAULT_SIZE = "gpt2-tiny"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("encodings", help="list the positional encodings, their options and papers")
    p.add_argument(
        "--size",
        default=DEFAULT_SIZE,
        help=f"model size preset used to count parameters (default {DEFAULT_SIZE})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from extrapos.tools.catalog import encodings_text

    print(encodings_text(args.size, args.json))
    return 0
