"""Time estimates made before long work, as ``run/memory.py`` makes memory estimates (issue 37, item 8).

A command that can be asked for arbitrarily much work (``generate`` of a 5 MB prompt, ``eval`` or
``passkey`` at a length no model was trained for) estimates its floating-point operations from the run's
config before loading the model: a no-grad forward is a third of ``model.flops_per_token`` (6 N + 12 L d T
per trained token, PaLM's count, Chowdhery et al. 2022, App. B), over the number of tokens it scores and
the keys each attends to. Divided by the FLOP/s this machine's matrix multiply reaches (measured,
``perf.matmul_peak_flops``; the kernels of a real forward reach a fraction of it), this is a lower bound
on the wall time: the command prints it when it is past a minute and refuses work bound to take past a
day unless ``--force`` is given.

Between the two, a command asks (``ask``, issue 48 item 3: a 990k-token prompt estimated at 1.6 h ran,
silent, until it was killed): work estimated past an hour is confirmed on the terminal, and refused in one
sentence naming ``--force`` when there is no terminal to ask on (stdin a pipe or /dev/null, a batch job, a
torchrun group). When it runs it shows its progress (``shows_progress``) even under ``--no-progress``: an
hour of silence looks like a hang. A library call or a sweep does not ask; its caller decided.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from extrapos.console import ask as ask_terminal
from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.model import ModelConfig

logger = logging.getLogger(__name__)

#: work estimated past this is refused without --force
DAY_SECONDS = 86_400.0
#: work estimated past this is confirmed on a terminal (or refused without one) unless --force
HOUR_SECONDS = 3_600.0
#: estimates below this are not printed
SAY_ABOVE_SECONDS = 60.0
#: FLOP/s beyond any device of the kind (fp32: a many-core CPU reaches a few 1e11, an H100's dense bf16
#: peak is 1e15): work that takes under a second even at this speed is not worth measuring the machine for
CEILING_FLOPS = {"cpu": 1e12, "cuda": 1e16}


def forward_flops(model_cfg: ModelConfig, tokens: int, keys: float) -> float:
    """FLOPs of no-grad forwards over ``tokens`` tokens, each attending to ``keys`` keys on average (a
    causal window of T: T / 2)."""
    from extrapos.model import flops_per_token

    return tokens * flops_per_token(model_cfg, max(1, round(keys))) / 3


def duration(seconds: float) -> str:
    """3 s, 4.2 min, 3.1 h, 12 days."""
    for unit, size in (("days", 86_400.0), ("h", 3_600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def check_time(
    flops: float,
    device: str | torch.device,
    what: str,
    advice: str,
    force: bool,
    say: Callable[[str], None] | None = None,
    ask: bool = False,
) -> float | None:
    """Refuse ``what`` (its estimate past a day, unless ``force``) in one sentence naming ``advice``, or
    say its estimate when it is past a minute (``say``; by default this module's logger, at info) and, with
    ``ask`` (a command's own work), confirm it past an hour unless ``force`` (``confirm``); returns the
    estimate in seconds (None: too small to measure the machine for)."""
    from extrapos.run.perf import matmul_peak_flops

    dev = torch.device(device)
    if flops < CEILING_FLOPS.get(dev.type, 1e16):
        return None
    peak = matmul_peak_flops(str(dev), "fp32")
    seconds = flops / peak
    where = f"{dev.type} (whose matrix multiply reaches {peak / 1e9:,.0f} GFLOP/s)"
    if seconds > DAY_SECONDS and not force:
        raise UserError(
            f"{what} would take at least {duration(seconds)} on {where}; {advice}, or pass --force to run "
            "it anyway."
        )
    asked = ask and seconds > HOUR_SECONDS and not force
    if asked and not can_ask():  # refused before anything is said: the sentence holds the estimate
        raise UserError(
            f"{what} would take at least {duration(seconds)} on {where}, and there is no terminal to confirm "
            f"it on; {advice}, or pass --force to run it anyway."
        )
    if seconds > SAY_ABOVE_SECONDS:
        (say or logger.info)(f"extrapos: {what} will take at least {duration(seconds)} on {where}.")
    if asked:
        confirm(what, advice)
    return seconds


def can_ask() -> bool:
    """Whether a question can be put to a person: stdin is a terminal and this is one process (the
    processes of a torchrun group cannot each ask, and one answer would not reach the others)."""
    from extrapos.run.runtime import distributed_env

    try:
        return sys.stdin is not None and sys.stdin.isatty() and distributed_env()[1] == 1
    except (OSError, ValueError):  # a closed stdin
        return False


def confirm(what: str, advice: str) -> None:
    """Ask on the terminal whether to run ``what``; anything but yes refuses it in one sentence."""
    answer = ask_terminal("extrapos: run it? [y/N] ")
    if answer not in ("y", "yes"):
        raise UserError(f"{what} was not confirmed; {advice}, or pass --force to run it without asking.")


def shows_progress(progress: bool, seconds: float | None, ask: bool = True) -> bool:
    """Whether work estimated at ``seconds`` shows its progress: as asked (``progress``), and always when a
    command (``ask``) runs work estimated past an hour."""
    return progress or (ask and seconds is not None and seconds > HOUR_SECONDS)
