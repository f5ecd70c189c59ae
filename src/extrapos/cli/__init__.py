"""`extrapos <command>`: a thin shell over library functions.

One module per command group; each exposes ``register(subparsers)`` and imports only argparse at
module level, so `extrapos --help` and `extrapos <command> --help` never import torch. The parser a
module adds sets ``func`` (called with the parsed namespace; returns an exit code or None), which
imports the library function it calls.

``main`` is the boundary every command passes through: a ``UserError`` (or an ``OSError`` such as a
full disk) is the user's to fix and ends with one sentence and exit status 2; any other exception is
a defect of extrapos and ends with one line, ``internal error in <command>: <type>: <message>``, and
exit status ``INTERNAL_ERROR`` (70, sysexits.h's EX_SOFTWARE). ``--debug`` (before or after the
command) prints the traceback as well. It also installs the console (``extrapos.console``) for the
command's lifetime: what the library logs is printed, on stdout or stderr, as the command's output.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import NoReturn

from extrapos.console import console
from extrapos.errors import INTERNAL_ERROR, UserError

COMMAND_MODULES = [
    "extrapos.cli.data",
    "extrapos.cli.encodings",
    "extrapos.cli.check_encoding",
    "extrapos.cli.train",
    "extrapos.cli.extend",
    "extrapos.cli.eval",
    "extrapos.cli.attention",
    "extrapos.cli.compare",
    "extrapos.cli.report",
    "extrapos.cli.tasks",
    "extrapos.cli.hf",
    "extrapos.cli.generate",
    "extrapos.cli.bench",
    "extrapos.cli.doctor",
]


class Parser(argparse.ArgumentParser):
    """argparse with the house's error form: one sentence on one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"extrapos: error: {message.rstrip('.')}; see `{self.prog} --help`.\n")


def build_parser() -> argparse.ArgumentParser:
    from extrapos import __version__

    parser = Parser(
        prog="extrapos",
        description="Train short, test long: positional encodings for length extrapolation.",
    )
    parser.add_argument("--version", action="version", version=f"extrapos {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _add_debug(sub)
    return parser


def _add_debug(sub: argparse._SubParsersAction) -> None:
    """``--debug`` after the command too (``extrapos import ... --debug``), on every (sub)command.

    The default is suppressed so that a subcommand does not reset a ``--debug`` given before it.
    """
    for command in set(sub.choices.values()):
        if "--debug" not in command._option_string_actions:
            command.add_argument(
                "--debug",
                action="store_true",
                default=argparse.SUPPRESS,
                help="print the traceback of an internal error",
            )
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_debug(action)


def _command_name(args: argparse.Namespace) -> str:
    """``import``, or ``data prepare`` for a command group's subcommand."""
    words = [getattr(args, "command", None) or "extrapos"]
    words += [v for k, v in sorted(vars(args).items()) if k.endswith("_command") and isinstance(v, str)]
    return " ".join(words)


def internal_error_line(command: str, error: BaseException) -> str:
    """The one line an unexpected exception becomes (its message's first line, kept short)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
    if len(message) > 300:
        message = message[:297] + "..."
    return (
        f"extrapos: internal error in {command}: {type(error).__name__}: {message}; "
        "rerun with --debug for the traceback."
    )


#: the status of a process killed by SIGPIPE (128 + 13), what `yes | head -1` leaves for `yes`
BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        with console():  # what the library logs is the command's output (console.py)
            return _run(args)
    finally:  # a refused or failed evaluation leaves no result lock in the run
        if "extrapos.run.lock" in sys.modules:
            sys.modules["extrapos.run.lock"].release_result_locks()


def _run(args: argparse.Namespace) -> int:
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:  # the reader left (`extrapos encodings | head -1`): stop quietly like Unix tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return BROKEN_PIPE
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
    except Exception as e:  # a defect, not the user's mistake: one line, its own exit status
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(internal_error_line(_command_name(args), e), file=sys.stderr)
        return INTERNAL_ERROR
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
