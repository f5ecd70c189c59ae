"""A failed resume leaves a finished run as it was (issue 48, item 1).

``train --resume --set train.steps=N`` of a finished run on a full disk used to remove ``summary.json``
and rewrite ``config.toml`` and ``metrics.jsonl`` before its first checkpoint write failed: the run was
left looking unfinished. Now a finished run changes only once its continuation's first checkpoint is
written whole, so a failure anywhere before keeps every file's bytes, and the same command, once there
is room, continues it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
from harness import Fault, assert_user_error, run

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_data):
    """A finished 8-step run (its only checkpoint at step 8)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data)), run_dir, progress=False)
    return run_dir


@pytest.fixture
def run_copy(finished, scratch):
    out = scratch / "home" / "run"
    shutil.copytree(finished, out)
    return out


RESUME = ["--resume", "--set", "train.steps=12", "--no-progress"]

# where a full disk strikes: the first and the last tensor file the new checkpoint writes with save_file,
# and the metrics lines held back until that checkpoint is whole
FULL_DISK = {
    "optimizer": Fault("extrapos.run.checkpoint:save_file", error=errno.ENOSPC),
    "rng": Fault("extrapos.run.checkpoint:save_file", error=errno.ENOSPC, nth=2),
    "held metrics": Fault("extrapos.run.metrics:MetricsLog.release", error=errno.ENOSPC),
}


@pytest.mark.parametrize("where", list(FULL_DISK))
def test_full_disk_on_resume_keeps_the_finished_run(where, run_copy, tiny_data, cache):
    names = sorted(p.relative_to(run_copy) for p in run_copy.rglob("*") if p.name != ".lock")
    assert_user_error(
        ["train", "--out", str(run_copy), *RESUME],
        cache=cache,
        watch=[run_copy],
        fault=FULL_DISK[where],
        fragments=["No space left on device"],
    )
    assert sorted(p.relative_to(run_copy) for p in run_copy.rglob("*") if p.name != ".lock") == names
    # once there is room, the same command continues the run
    again = run(["train", "--out", str(run_copy), *RESUME], cache=cache)
    assert again.returncode == 0, again.stderr
    assert json.loads((run_copy / "summary.json").read_text())["steps"] == 12
    steps = [r["step"] for r in map(json.loads, (run_copy / "metrics.jsonl").read_text().splitlines())]
    assert steps == sorted(steps) and steps[-1] == 12 and len([s for s in steps if s == 9]) == 1


def test_held_lines_cut_short_are_cut_back(run_copy, monkeypatch):
    """A full disk in the middle of appending the held lines: the log is cut back to its old end, and
    neither config.toml nor summary.json changes."""
    from harness import assert_unchanged, snapshot

    from extrapos.run.config import load_run_config
    from extrapos.run.metrics import MetricsLog
    from extrapos.training.held import HeldChanges

    cfg = load_run_config(run_copy)
    metrics = MetricsLog(run_copy, cfg, enabled=True, hold=True)
    metrics.log({"step": 9, "loss": 1.0})
    held = HeldChanges(run_copy, cfg.to_toml() + "# changed\n", metrics)
    before = snapshot(run_copy)

    fsync, calls = os.fsync, []

    def full_at_the_log(fd):  # config.toml's temporary file is synced first, then the appended lines
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_the_log)
    with pytest.raises(OSError):
        held.publish()
    monkeypatch.undo()
    assert len(calls) == 2
    assert_unchanged(before)
    assert sorted(snapshot(run_copy)) == sorted(before)  # no temporary file left
    held.publish()
    assert not (run_copy / "summary.json").exists()
    assert (run_copy / "config.toml").read_text().endswith("# changed\n")
    assert json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 9
