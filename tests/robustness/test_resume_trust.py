"""A resume never infers "not started" from a missing file (issue 37, item 1).

A run that has a summary or logged metrics past its first checkpoint, but no checkpoint a resume can
trust (the only one lost its state.json, was renamed, or ``checkpoints/`` is empty), used to be
trained again from step 0 by ``train --resume``: config.toml, metrics.jsonl and summary.json were
replaced. It is refused in one sentence naming what was found, every file kept.
"""

from __future__ import annotations

import json
import shutil

import pytest
from harness import assert_user_error, run

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_data):
    """A finished 8-step run with one checkpoint left (step 8; step 4's was pruned)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    overrides = tiny_overrides(tiny_data, **{"train.checkpoint_every": 4, "train.keep_checkpoints": 1})
    cfg = load_config("cpu/tiny", overrides)
    train(cfg, run_dir, progress=False)
    return run_dir


@pytest.fixture
def run_copy(finished, scratch):
    out = scratch / "home" / "run"
    shutil.copytree(finished, out)
    return out


def _no_state(run_dir):
    (run_dir / "checkpoints" / "step-8" / "state.json").unlink()


def _renamed(run_dir):
    (run_dir / "checkpoints" / "step-8").rename(run_dir / "checkpoints" / "step-abc")


def _emptied(run_dir):
    shutil.rmtree(run_dir / "checkpoints" / "step-8")


def _gone(run_dir):
    shutil.rmtree(run_dir / "checkpoints")


BREAKS = {"no-state-json": _no_state, "renamed": _renamed, "empty": _emptied, "no-folder": _gone}


@pytest.mark.parametrize("keep_summary", [True, False], ids=["finished", "unfinished"])
@pytest.mark.parametrize("damage", list(BREAKS))
def test_resume_without_a_trustworthy_checkpoint_is_refused(damage, keep_summary, run_copy, tiny_data, cache):
    BREAKS[damage](run_copy)
    if not keep_summary:
        (run_copy / "summary.json").unlink()  # metrics.jsonl alone shows that step 4's checkpoint was written
    names = sorted(p.relative_to(run_copy) for p in run_copy.rglob("*"))
    sentence = assert_user_error(
        ["train", "--out", str(run_copy), "--resume", "--set", "train.steps=10", "--no-progress"],
        cache=cache,
        watch=[run_copy, tiny_data],
        fragments=["no checkpoint a resume can trust", "--out"],
    )
    assert ("summary.json" in sentence) == keep_summary and "metrics.jsonl" in sentence
    assert sorted(p.relative_to(run_copy) for p in run_copy.rglob("*")) == names


def test_resume_before_the_first_checkpoint_was_due_starts_at_step_one(tiny_data, scratch, cache):
    """A run killed before its first checkpoint was due has nothing to lose: --resume trains it from the
    start, as before."""
    from harness import Fault

    out = scratch / "run"
    args = ["train", "--out", str(out), "--config", "cpu/tiny", "--no-progress"]
    for s in tiny_overrides(tiny_data, **{"train.steps": 3}):
        args += ["--set", s]
    first = run(args, cache=cache, fault=Fault("extrapos.training.trainer:Trainer.train_step", nth=3))
    assert first.returncode != 0 and (out / "metrics.jsonl").is_file()
    resumed = run(["train", "--out", str(out), "--resume", "--no-progress"], cache=cache)
    assert resumed.returncode == 0, resumed.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]  # logged once each, from step 1


def _damaged(run_dir):
    (run_dir / "checkpoints" / "step-8" / "model.safetensors").write_bytes(b"")


@pytest.mark.parametrize("damage", [*BREAKS, "damaged"])
def test_finished_run_without_a_usable_checkpoint_says_so(damage, run_copy, tiny_data, cache):
    """--resume of a finished run with its own budget has nothing to train; with no usable checkpoint left it
    printed "done: 8 steps" and exit 0 (issue 48, item 6), so a run nothing can be evaluated, exported or
    trained from looked whole. It is refused in one sentence naming the fix, every file kept."""
    {**BREAKS, "damaged": _damaged}[damage](run_copy)
    names = sorted(p.relative_to(run_copy) for p in run_copy.rglob("*"))
    assert_user_error(
        ["train", "--out", str(run_copy), "--resume", "--no-progress"],
        cache=cache,
        watch=[run_copy, tiny_data],
        fragments=["finished", "no usable checkpoint", "restore checkpoints/", "--out"],
    )
    assert sorted(p.relative_to(run_copy) for p in run_copy.rglob("*")) == names
