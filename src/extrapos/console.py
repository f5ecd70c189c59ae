"""The command line's console: what the library says through ``logging``, written as the commands print it.

The library never prints: every module logs to ``logging.getLogger(__name__)`` (the ``extrapos.*``
hierarchy), and ``import extrapos`` gives that hierarchy a ``NullHandler``, so a program embedding
extrapos hears nothing until it configures logging (``logging.basicConfig(level=logging.INFO)``), as
the standard library's logging HOWTO asks of libraries. ``extrapos <command>`` installs ``console()``
for the command's lifetime: a handler on the ``extrapos`` logger that writes each message bare, at
INFO and above, to the stream the command always used: stdout, or stderr for a record logged with
``extra=STDERR`` (a progress note beside data on stdout). ``extra=ABOVE_BARS`` writes through tqdm, so
a line said during a progress bar does not tear it (the trainer's checkpoint lines).

``ask`` puts a question to the person at the terminal: not a log record, since no logging setup may
hide a question whose answer is being waited for.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: ``logger.info(..., extra=STDERR)``: the command writes this line on stderr (stdout otherwise)
STDERR = {"console_stream": "stderr"}
#: ``logger.info(..., extra=ABOVE_BARS)``: written through ``tqdm.write``, above any progress bar
ABOVE_BARS = {"console_above_bars": True}
#: both at once
STDERR_ABOVE_BARS = {**STDERR, **ABOVE_BARS}

ROOT = "extrapos"


class ConsoleHandler(logging.Handler):
    """Each record's bare message and a newline, on stdout or (``extra=STDERR``) stderr, flushed at once.

    The stream is looked up at each record, not when the handler is made: a test's captured streams and
    a command's redirected ones are the ones written to."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if getattr(record, "console_stream", "stdout") == "stderr" else sys.stdout
            text = self.format(record)
            if getattr(record, "console_above_bars", False):
                from tqdm.auto import tqdm

                tqdm.write(text, file=stream)
            else:
                stream.write(text + "\n")
            stream.flush()
        except RecursionError:  # the standard library's StreamHandler does the same
            raise
        except BrokenPipeError:  # the reader left: the command's boundary stops quietly (cli.main)
            raise
        except Exception:
            self.handleError(record)


@contextmanager
def console(level: int = logging.INFO) -> Iterator[ConsoleHandler]:
    """Write the ``extrapos`` logger's records at ``level`` and above to the console while inside.

    The logger does not pass them on to the root logger meanwhile, so a program (or a plug-in) that set up
    logging for itself does not print each line twice; the logger's level, handlers and propagation are
    put back on the way out, so a command run in-process leaves logging as it found it."""
    logger = logging.getLogger(ROOT)
    handler = ConsoleHandler(level)
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def ask(question: str) -> str:
    """Put ``question`` on stderr (no newline: the answer follows it) and return the line typed, stripped
    and lower-cased ("" when stdin is closed)."""
    print(question, end="", file=sys.stderr, flush=True)
    try:
        return sys.stdin.readline().strip().lower()
    except (OSError, ValueError):
        return ""
