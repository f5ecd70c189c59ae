"""Work estimated past an hour asks first, and shows its progress when it runs (issue 48, item 3).

``generate RUN --prompt-file p5mb.txt --max-new-tokens 5 --no-progress`` (990k tokens, a run trained at 64)
printed "at least 1.6 h" and ran, silent, until killed: only an estimate past a day was refused. Now a
command whose work is estimated past an hour asks on the terminal, refuses in one sentence naming --force
when there is no terminal to ask on (a script, a pipe, a batch job), and when it runs (confirmed or
forced) it shows its progress even under --no-progress. A library call or a sweep does not ask
(``ask``): their caller decided.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pytest
from harness import assert_one_sentence_error

from extrapos.errors import UserError
from extrapos.run import timing
from tests.conftest import tiny_overrides

HOURS = 2 * 3600.0


@pytest.fixture
def peak(monkeypatch):
    """A machine whose matrix multiply reaches 1 TFLOP/s (no timing in the test)."""
    from extrapos.run import perf

    monkeypatch.setattr(perf, "matmul_peak_flops", lambda device, precision: 1e12)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_past_an_hour_without_a_terminal_is_refused(peak, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    said: list[str] = []
    with pytest.raises(UserError) as e:
        timing.check_time(1e12 * HOURS, "cpu", "scoring", "give fewer", False, said.append, ask=True)
    sentence = str(e.value)
    assert "at least 2.0 h" in sentence and "no terminal" in sentence and "--force" in sentence
    assert sentence.count(". ") == 0 and said == []
    # --force runs it; a library call or a sweep (ask=False) is not asked
    assert timing.check_time(1e12 * HOURS, "cpu", "scoring", "give fewer", True, said.append, ask=True)
    assert timing.check_time(1e12 * HOURS, "cpu", "scoring", "give fewer", False, said.append) == HOURS
    # under an hour nothing is asked
    assert timing.check_time(1e12 * 1800, "cpu", "scoring", "give fewer", False, said.append, ask=True)


@pytest.mark.parametrize("answer,runs", [("y\n", True), ("yes\n", True), ("\n", False), ("n\n", False)])
def test_past_an_hour_on_a_terminal_asks(answer, runs, peak, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    check = lambda: timing.check_time(1e12 * HOURS, "cpu", "scoring", "fewer", False, print, ask=True)  # noqa: E731
    if runs:
        assert check() == HOURS
    else:
        with pytest.raises(UserError, match="not confirmed.*--force"):
            check()
    assert "[y/N]" in capsys.readouterr().err


def test_past_a_day_is_refused_even_on_a_terminal(peak, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    with pytest.raises(UserError, match="2.0 days"):
        timing.check_time(1e12 * 2 * 86_400, "cpu", "scoring", "fewer", False, print, ask=True)


# ---- the commands, as a user runs them: stdin not a terminal, every estimate made HOURS long ----------

# The child makes every estimate HOURS (the FLOP/s of "this machine" is whatever makes it so) and
# estimates even small work (no ceiling under which it skips measuring), then runs the CLI.
CHILD = r"""
import sys
from extrapos.run import perf, timing
HOURS = float(sys.argv.pop(1))
timing.CEILING_FLOPS = {"cpu": 0.0}
original = timing.check_time
def check_time(flops, *args, **kwargs):
    perf.matmul_peak_flops = lambda *_, **__: flops / HOURS
    return original(flops, *args, **kwargs)
timing.check_time = check_time
from extrapos.cli import main
sys.argv[0] = "extrapos"
raise SystemExit(main(sys.argv[1:]))
"""


def _run(args, scratch) -> subprocess.CompletedProcess:
    env = {**os.environ, "EXTRAPOS_CACHE": str(scratch / "cache"), "HOME": str(scratch)}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(HOURS), *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2})), run_dir, progress=False)
    return run_dir


@pytest.fixture
def run_copy(trained, scratch):
    out = scratch / "run"
    shutil.copytree(trained, out)
    return out


def _generate(run_copy, scratch):
    prompt = scratch / "prompt.txt"
    prompt.write_text("the quick brown fox jumps over the lazy dog " * 300)  # > 1 prefill chunk of 1024
    return ["generate", run_copy, "--prompt-file", prompt, "--max-new-tokens", "2", "--no-progress"]


COMMANDS = {
    "generate": (_generate, "prefill"),
    "eval": (
        lambda run, _: ["eval", run, "--lengths", "1", "--max-tokens", "256", "--no-progress"],
        "eval run",
    ),
    "passkey": (
        lambda run, _: ["passkey", run, "--lengths", "64", "--trials", "1", "--no-progress"],
        "passkey run",
    ),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_past_an_hour_asks_or_needs_force_and_shows_progress(command, run_copy, scratch):
    build, bar = COMMANDS[command]
    args = build(run_copy, scratch)
    refused = _run(args, scratch)
    assert_one_sentence_error(refused, "at least 2.0 h", "no terminal", "--force")
    assert not list(run_copy.glob("eval/*.json"))  # nothing scored
    forced = _run([*args, "--force"], scratch)
    assert forced.returncode == 0, forced.stderr
    assert bar in forced.stderr  # the progress bar, although --no-progress was given
