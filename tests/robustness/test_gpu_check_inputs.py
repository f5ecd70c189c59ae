"""benchmarks/gpu_check.py checks its command line before any work (issue 37, item 9).

It overwrote an existing ``DIR/summary.md`` / ``summary.json`` and removed its sub-folders without asking;
``--steps 0`` silently ran the default 20 steps and reported ok; ``--steps 2`` failed by construction (the
first and last three losses it compares overlap). Each is one line on stderr, exit status 2, nothing of
``--out`` touched.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import assert_unchanged, snapshot

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _refused(out: Path, *args: str, fragment: str) -> None:
    before = snapshot(out)
    result = _run("--out", str(out), *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gpu_check.py: error: ") and fragment in line, line
    assert_unchanged(before)


@pytest.mark.parametrize(
    "flag,value,least",
    [("--steps", "0", 6), ("--steps", "2", 6), ("--resume-steps", "0", 4), ("--parallel-steps", "0", 1)],
)
def test_sizes_below_their_minimum_are_refused(flag, value, least, tmp_path):
    _refused(tmp_path / "out", flag, value, fragment=f"{flag} must be at least {least}, got {value}")
    assert not (tmp_path / "out").exists()


def test_a_folder_of_the_users_is_never_written(tmp_path):
    out = tmp_path / "mine"
    (out / "runs").mkdir(parents=True)
    (out / "summary.md").write_text("# my own summary\n")
    (out / "runs" / "notes.txt").write_text("keep me\n")
    _refused(out, fragment="holds files gpu-check did not write")
    (out / "summary.json").write_text(json.dumps({"mine": True}))
    _refused(out, fragment="holds files gpu-check did not write")


def test_a_folder_inside_a_run_is_refused(tmp_path):
    """--out RUN/gc wrote inside a run's tree (whose pruning, resumes and evaluations delete or replace what
    is there) and ended with exit 1 and no sentence (issue 48, item 5): refused before anything is written,
    as ``doctor --json`` refuses a path inside a run."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text("")
    (run / "summary.json").write_text("{}")
    _refused(run / "gc", "--steps", "6", fragment=f"is inside the run {run}")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.toml", "summary.json"]


def test_its_own_folder_is_accepted(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check_args", SCRIPT)
    assert spec and spec.loader
    gc = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gc  # its dataclass looks its module up
    spec.loader.exec_module(gc)
    sizes = dict(steps=None, resume_steps=None, parallel_steps=None, eval_tokens=None)
    out = tmp_path / "gpu-check"
    assert gc.check_args(argparse.Namespace(out=str(out), **sizes)) is None  # new
    (out / "runs").mkdir(parents=True)
    (out / gc.OUT_MARKER).write_text("")
    (out / "summary.md").write_text("an earlier check\n")
    assert gc.check_args(argparse.Namespace(out=str(out), **sizes)) is None  # its own
    (out / gc.OUT_MARKER).unlink()
    (out / "summary.json").write_text(json.dumps({"verdicts": {}}))
    assert gc.check_args(argparse.Namespace(out=str(out), **sizes)) is None  # an older one's
