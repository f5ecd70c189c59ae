"""`extrapos <command>`: a thin shell over library functions.

Each command lives in its own module that exposes ``register(subparsers)``; the parser it adds
sets ``func`` (called with the parsed namespace, returns an exit code or None). Modules are
imported lazily by name so `extrapos --help` stays fast and one broken optional extra cannot
break the other commands.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from extrapos.errors import UserError

# module path -> commands it registers (listed here so --help works without importing torch)
COMMAND_MODULES = [
    "extrapos.data.commands",
    "extrapos.positions.commands",
    "extrapos.train",
    "extrapos.extend",
    "extrapos.evaluate",
    "extrapos.compare",
    "extrapos.report",
    "extrapos.generate",
    "extrapos.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extrapos",
        description="Train short, test long: positional encodings for length extrapolation.",
    )
    from extrapos import __version__

    parser.add_argument("--version", action="version", version=f"extrapos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        code = args.func(args)
    except UserError as e:
        print(f"extrapos: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("extrapos: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
