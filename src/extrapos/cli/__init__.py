"""`extrapos <command>`: a thin shell over library functions.

One module per command group; each exposes ``register(subparsers)`` and imports only argparse at
module level, so `extrapos --help` and `extrapos <command> --help` never import torch. The parser a
module adds sets ``func`` (called with the parsed namespace; returns an exit code or None), which
imports the library function it calls.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from extrapos.errors import UserError

COMMAND_MODULES = [
    "extrapos.cli.data",
    "extrapos.cli.encodings",
    "extrapos.cli.train",
    "extrapos.cli.extend",
    "extrapos.cli.eval",
    "extrapos.cli.compare",
    "extrapos.cli.report",
    "extrapos.cli.tasks",
    "extrapos.cli.hf",
    "extrapos.cli.generate",
    "extrapos.cli.bench",
]


class Parser(argparse.ArgumentParser):
    """argparse with the house's error form: one sentence on one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"extrapos: error: {message.rstrip('.')}; see `{self.prog} --help`.\n")


def build_parser() -> argparse.ArgumentParser:
    from extrapos import __version__

    parser = Parser(
        prog="extrapos",
        description="Train short, test long: positional encodings for length extrapolation.",
    )
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
    except (
        OSError
    ) as e:  # a read-only directory, a full disk, a file-size limit: one sentence, not a traceback
        from extrapos.files import describe_os_error

        print(
            f"extrapos: error: cannot read or write a file ({describe_os_error(e)}); check the path, its "
            "permissions and the free space, then run the command again.",
            file=sys.stderr,
        )
        return 2
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
