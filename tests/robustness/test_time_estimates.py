"""Work estimated past a day is refused before it starts, unless --force (issue 37, item 8).

``generate --prompt-file`` of a 5 MB one-line file (4.2M tokens, a run trained at 64) ran for hours. Each
long command estimates its FLOPs from the run's config (``run/timing.py``, the way ``run/memory.py``
estimates memory) and divides by the FLOP/s this machine's matrix multiply reaches: past a minute it
prints the estimate, past a day it refuses in one sentence naming the fix and --force.
"""

from __future__ import annotations

import shutil

import pytest
from harness import assert_user_error

from extrapos.errors import UserError
from extrapos.run import timing
from tests.conftest import tiny_overrides

# The child measures no machine: it reads a matrix multiply of 100 GFLOP/s, so whether an estimate passes a
# day does not depend on the CPU running the test (CI's measured 104 GFLOP/s put one case at 23.2 h,
# refused for want of a terminal rather than for a day).
FIXED_SPEED = {"EXTRAPOS_TEST_PEAK_FLOPS": "1e11"}


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


def test_generation_past_a_day_is_refused(run_copy, scratch, cache):
    prompt = scratch / "prompt.txt"
    prompt.write_text("the quick brown fox " * 500)
    args = [
        "generate",
        str(run_copy),
        "--prompt-file",
        str(prompt),
        "--no-cache",
        "--max-new-tokens",
        "60000",
    ]
    assert_user_error(
        args,
        cache=cache,
        watch=[run_copy],
        fragments=["would take at least", "days", "--force"],
        env=FIXED_SPEED,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "{run}", "--lengths", "1024", "--stride", "1", "--no-progress"],
        ["passkey", "{run}", "--lengths", "4096", "--trials", "100", "--no-progress"],
        ["attention", "{run}", "--lengths", "4096", "--max-tokens", "1000000000", "--no-progress"],
    ],
    ids=["eval", "passkey", "attention"],
)
def test_scoring_past_a_day_is_refused(command, run_copy, cache):
    args = [part.replace("{run}", str(run_copy)) for part in command]
    assert_user_error(
        args,
        cache=cache,
        watch=[run_copy],
        fragments=["would take at least", "days", "--force"],
        env=FIXED_SPEED,
    )
    assert not list(run_copy.glob("eval/*.json"))  # nothing scored, nothing saved


@pytest.fixture
def peak(monkeypatch):
    """A machine whose matrix multiply reaches 1 TFLOP/s (no timing in the test)."""
    from extrapos.run import perf

    monkeypatch.setattr(perf, "matmul_peak_flops", lambda device, precision: 1e12)


def test_estimates_are_printed_past_a_minute_and_refused_past_a_day(peak):
    said: list[str] = []
    assert timing.check_time(1e12 * 30, "cpu", "x", "y", False, said.append) == 30 and said == []
    assert timing.check_time(1e12 * 7200, "cpu", "scoring", "fewer", False, said.append) == 7200
    assert said == [
        "extrapos: scoring will take at least 2.0 h on cpu (whose matrix multiply reaches 1,000 GFLOP/s)."
    ]
    with pytest.raises(UserError, match=r"at least 2\.0 days .*; give fewer, or pass --force"):
        timing.check_time(1e12 * 2 * 86_400, "cpu", "scoring", "give fewer", False, said.append)
    assert (
        timing.check_time(1e12 * 2 * 86_400, "cpu", "scoring", "give fewer", True, said.append) == 2 * 86_400
    )


def test_small_work_does_not_measure_the_machine(monkeypatch):
    from extrapos.run import perf

    def measured(*_):
        raise AssertionError("measured the machine for a second's work")

    monkeypatch.setattr(perf, "matmul_peak_flops", measured)
    assert timing.check_time(1e11, "cpu", "x", "y", False) is None
