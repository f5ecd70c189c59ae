"""lm-evaluation-harness without its chatter on stderr: ``quiet_harness(progress)`` around the harness.

Left alone, lm-eval writes on stderr beside the command's own lines, a fault or none: its task warnings
("[Task: X] metric acc is defined, but aggregation is not"; its loggers have no handler, so logging's
last-resort handler prints them), datasets' warnings (datasets installs its own stderr handler), the progress
bars of datasets and of lm-eval's request building and tokenizing (even under ``--no-progress``), and git's
"fatal: not a git repository" (lm-eval asks git for the commit of the working folder, git's stderr inherited).
A write that fails after the scoring then ends in one sentence below lines of noise (issue 48).

Inside ``quiet_harness``:

* lm-eval's records go to this module's logger at DEBUG (the console prints INFO and above); a program that
  configured logging still receives them through its own handlers, as before, since they still propagate;
* datasets' logger, at its default level (WARNING: nobody asked for more), is raised to ERROR;
* git is asked for the commit with its stderr discarded (the same answer lm-eval gets);
* without ``progress``: datasets' progress bars are disabled (unless ``HF_DATASETS_DISABLE_PROGRESS_BARS=0``
  asks for them) and lm-eval's own tqdm bars too.

Everything is put back on the way out, so a library call leaves logging, datasets and lm-eval as it found
them. Known remainder: a metric whose stderr lm-eval bootstraps (f1, bleu, ...; accuracy has a closed form)
still prints lm-eval's "bootstrapping for stddev" line on stdout and its bar.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

logger = logging.getLogger(__name__)

#: the lm-eval modules holding a module-level ``tqdm`` (request building, tokenizing), as of lm-eval 0.4.13
BAR_MODULES = ("lm_eval.api.task", "lm_eval.api.model")


@contextmanager
def quiet_harness(progress: bool) -> Iterator[None]:
    """lm-eval, datasets and git kept off stderr while inside (the module's docstring); their bars too
    unless ``progress``."""
    with ExitStack() as stack:
        stack.enter_context(_lm_eval_records_at_debug())
        stack.enter_context(_datasets_warnings_off())
        stack.enter_context(_git_asked_quietly())
        if not progress:
            stack.enter_context(_no_bars())
        yield


class _AtDebug(logging.Handler):
    """A record of lm-eval's loggers logged again on this module's logger at DEBUG."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logger.debug("lm-eval %s: %s", record.levelname.lower(), record.getMessage())
        except RecursionError:  # the standard library's StreamHandler does the same
            raise
        except Exception:
            self.handleError(record)


@contextmanager
def _lm_eval_records_at_debug() -> Iterator[None]:
    # a handler anywhere on a record's way up keeps logging's last-resort handler (which writes WARNING and
    # above on stderr) from running; propagation is untouched, so handlers set up by a program still see them
    harness = logging.getLogger("lm_eval")
    handler = _AtDebug()
    harness.addHandler(handler)
    try:
        yield
    finally:
        harness.removeHandler(handler)


@contextmanager
def _datasets_warnings_off() -> Iterator[None]:
    # datasets writes its WARNINGs through a stderr handler of its own (datasets.utils.logging); a level
    # other than its default was asked for (DATASETS_VERBOSITY, set_verbosity_*) and is left as it is
    datasets_logger = logging.getLogger("datasets")
    saved = datasets_logger.level
    if datasets_logger.getEffectiveLevel() == logging.WARNING:
        datasets_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        datasets_logger.setLevel(saved)


def git_commit_hash() -> str | None:
    """lm-eval's ``loggers.utils.get_git_commit_hash`` with git's stderr discarded: the commit of the working
    folder (``git describe --always``), else the one its ``.git`` names, else None.

    lm-eval records it in its results (extrapos keeps none of it); its own call lets git write "fatal: not a
    git repository" on the command's stderr whenever the command runs outside a repository."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        out = subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL)
    except (subprocess.CalledProcessError, FileNotFoundError):  # not a repository; git not installed
        return get_commit_from_path(os.getcwd())
    return out.strip().decode()


@contextmanager
def _git_asked_quietly() -> Iterator[None]:
    import lm_eval.evaluator as harness_evaluator

    with _replaced(harness_evaluator, "get_git_commit_hash", git_commit_hash):
        yield


def _silent_tqdm(*args: Any, **kwargs: Any) -> Any:
    """tqdm disabled, whatever ``disable`` the caller passes (lm-eval passes ``disable=False``)."""
    from tqdm import tqdm

    kwargs["disable"] = True
    return tqdm(*args, **kwargs)


@contextmanager
def _no_bars() -> Iterator[None]:
    from datasets import config, disable_progress_bars, enable_progress_bars
    from datasets.utils.tqdm import are_progress_bars_disabled

    # HF_DATASETS_DISABLE_PROGRESS_BARS=0 asks for datasets' bars whatever the code says (datasets warns
    # and keeps them); bars someone else disabled stay disabled
    turn_off = config.HF_DATASETS_DISABLE_PROGRESS_BARS is not False and not are_progress_bars_disabled()
    if turn_off:
        disable_progress_bars()
    try:
        with ExitStack() as stack:
            for name in BAR_MODULES:
                module = sys.modules.get(name)
                if module is not None and hasattr(module, "tqdm"):
                    stack.enter_context(_replaced(module, "tqdm", _silent_tqdm))
            yield
    finally:
        if turn_off:
            enable_progress_bars()


@contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` while inside (left alone when ``owner`` has no ``name``: another
    lm-eval version), and what it was afterwards."""
    if not hasattr(owner, name):
        yield
        return
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)
