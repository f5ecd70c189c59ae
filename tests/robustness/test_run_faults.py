"""Faults on the run side: kill -9 at named points of train, eval, extend and compare; damaged
checkpoints; a file-size limit; a read-only run; two processes on one run; a symlinked run file.

After each: a resumed run ends identical to an uninterrupted one (same metrics, same weights), or
the command fails with one sentence and every file that existed before keeps its bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time

import pytest
from harness import Fault, assert_one_sentence_error, assert_unchanged, run, snapshot, start

from tests.conftest import tiny_overrides


def train_cmd(data_dir, out, *extra_sets, resume=False, **settings):
    args = ["train", "--out", str(out), "--no-progress"]
    if resume:
        return args + ["--resume"]
    args += ["--config", "cpu/tiny"]
    for s in tiny_overrides(data_dir, **settings) + list(extra_sets):
        args += ["--set", s]
    return args


SETTINGS = {"train.steps": 6, "train.checkpoint_every": 2, "train.keep_checkpoints": 2}


def losses(run_dir):
    return [
        (m["step"], m.get("loss"), m.get("val_loss"))
        for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    ]


def final_weights(run_dir):
    return snapshot(run_dir / "checkpoints" / "step-6" / "model.safetensors").popitem()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_data):
    """The uninterrupted run every interrupted one must end identical to."""
    scratch = tmp_path_factory.mktemp("reference")
    result = run(train_cmd(tiny_data, scratch / "run", **SETTINGS), cache=scratch / "cache")
    assert result.returncode == 0, result.stderr
    return scratch / "run"


KILL_POINTS = {
    "mid checkpoint write": Fault("extrapos.run.checkpoint:save_file", nth=2),
    "between the final checkpoint and summary.json": Fault(
        "extrapos.run.checkpoint:prune_checkpoints", nth=3
    ),
    "mid train step": Fault("extrapos.training.trainer:masked_loss_sum", nth=4),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_training_resumes_identically(point, reference, tiny_data, scratch, cache):
    out = scratch / "run"
    killed = run(train_cmd(tiny_data, out, **SETTINGS), cache=cache, fault=KILL_POINTS[point])
    assert killed.returncode == -signal.SIGKILL
    resumed = run(train_cmd(tiny_data, out, resume=True), cache=cache)
    assert resumed.returncode == 0, resumed.stderr
    assert losses(out) == losses(reference)
    assert final_weights(out) == final_weights(reference)
    summary = json.loads((out / "summary.json").read_text())  # valid JSON: no NaN
    assert summary["final_loss"] == json.loads((reference / "summary.json").read_text())["final_loss"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-4", "step-6"]


def _copy(reference, scratch):
    out = scratch / "run"
    shutil.copytree(reference, out)
    return out


@pytest.mark.parametrize(
    "damage",
    [
        "truncated weights",
        "empty weights",
        "bad header",
        "truncated state",
        "empty state object",
        "truncated optimizer",
    ],
)
def test_damaged_latest_checkpoint_falls_back_to_the_older_one(damage, reference, scratch, cache):
    out = _copy(reference, scratch)
    latest = out / "checkpoints" / "step-6"
    target = {
        "truncated weights": "model.safetensors",
        "empty weights": "model.safetensors",
        "bad header": "model.safetensors",
        "truncated state": "state.json",
        "empty state object": "state.json",
        "truncated optimizer": "optimizer.safetensors",
    }[damage]
    data = (latest / target).read_bytes()
    new = {
        "truncated weights": data[: len(data) // 2],
        "empty weights": b"",
        "bad header": b"\xff" * 16 + data[16:],
        "truncated state": data[:20],
        "empty state object": b"{}",
        "truncated optimizer": data[:100],
    }[damage]
    (latest / target).write_bytes(new)
    result = run(["eval", str(out), "--lengths", "1", "--max-tokens", "256", "--no-progress"], cache=cache)
    assert result.returncode == 0, result.stderr
    assert "step-6 is damaged" in result.stdout and "trying step 4" in result.stdout
    saved = json.loads(next((out / "eval").glob("*.json")).read_text())
    assert saved["checkpoint_step"] == 4


def test_every_checkpoint_damaged_is_one_sentence(reference, scratch, cache):
    out = _copy(reference, scratch)
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "model.safetensors").write_bytes(b"")
    before = snapshot(out)
    result = run(["generate", str(out), "--prompt", "Fellow", "--max-new-tokens", "2"], cache=cache)
    assert_one_sentence_error(result, "every checkpoint", "damaged")
    assert_unchanged(before)


def test_eval_after_more_training_is_never_stale(tiny_data, scratch, cache):
    out = scratch / "run"
    assert run(train_cmd(tiny_data, out, **{"train.steps": 2}), cache=cache).returncode == 0
    ev = ["eval", str(out), "--lengths", "1", "--max-tokens", "256", "--no-progress"]
    assert run(ev, cache=cache).returncode == 0
    first = json.loads((out / "eval" / "test.json").read_text())
    more = run(
        ["train", "--out", str(out), "--resume", "--set", "train.steps=4", "--no-progress"], cache=cache
    )
    assert more.returncode == 0, more.stderr
    assert run(ev, cache=cache).returncode == 0
    second = json.loads((out / "eval" / "test.json").read_text())
    assert (first["checkpoint_step"], second["checkpoint_step"]) == (2, 4)
    assert first["weights_sha256"] != second["weights_sha256"]
    assert first["results"][0]["loss"] != second["results"][0]["loss"]


def test_file_size_limit_fails_cleanly_and_damages_nothing(reference, scratch, cache):
    out = _copy(reference, scratch)
    (out / "summary.json").unlink()  # resume will rewrite files: config, tokenizer, checkpoint, summary
    before = snapshot(out)
    result = run(
        ["train", "--out", str(out), "--resume", "--set", "train.steps=8", "--no-progress"],
        cache=cache,
        fsize_limit=20_000,
    )
    assert_one_sentence_error(result, "File too large")
    # the checkpoints, the tokenizer and data.json are never cut; config.toml records the asked budget
    # and metrics.jsonl the steps taken before the failure
    for path, digest in before.items():
        if path.name not in ("metrics.jsonl", "config.toml") and path.exists():
            assert snapshot(path)[path] == digest, f"{path} was changed"
    assert not list((out / "checkpoints").glob(".tmp-*"))
    assert not [p for p in out.rglob("*.tmp")]


def test_read_only_run_fails_before_scoring(reference, scratch, cache):
    out = _copy(reference, scratch)
    os.chmod(out, stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = snapshot(out)
        result = run(["eval", str(out), "--lengths", "1", "--no-progress"], cache=cache, unprivileged=True)
        assert_one_sentence_error(result, "cannot write")
        assert_unchanged(before)
    finally:
        os.chmod(out, stat.S_IRWXU)


def test_two_processes_on_one_run(reference, tiny_data, scratch, cache):
    out = _copy(reference, scratch)
    (out / "summary.json").unlink()
    (out / ".lock").unlink(missing_ok=True)
    first = start(
        ["train", "--out", str(out), "--resume", "--set", "train.steps=40", "--no-progress"], cache=cache
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (
            (out / ".lock").is_file() and "process" in (out / ".lock").read_text()
        ):
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # hold it while it holds the lock
        second = run(
            ["train", "--out", str(out), "--resume", "--set", "train.steps=40", "--no-progress"], cache=cache
        )
        assert_one_sentence_error(second, "is being trained by process")
    finally:
        first.send_signal(signal.SIGCONT)
        first.wait(timeout=120)
    assert first.returncode == 0
    steps = [s for s, loss, _ in losses(out) if loss is not None]
    assert len(steps) == len(set(steps))  # no duplicate steps in the log


def test_resume_never_writes_through_a_symlink(reference, scratch, cache):
    out = _copy(reference, scratch)
    victim = scratch / "users-file.json"
    victim.write_text("precious")
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").symlink_to(victim)
    (out / "summary.json").unlink()
    result = run(["train", "--out", str(out), "--resume", "--no-progress"], cache=cache)
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious"
    assert not (out / "tokenizer.json").is_symlink()


def test_killed_eval_leaves_no_result_and_reruns(reference, scratch, cache):
    out = _copy(reference, scratch)
    ev = ["eval", str(out), "--lengths", "1,2", "--max-tokens", "256", "--no-progress"]
    killed = run(ev, cache=cache, fault=Fault("extrapos.evaluate.documents:score_windows", nth=2))
    assert killed.returncode == -signal.SIGKILL
    assert not (out / "eval" / "test.json").exists() and not list((out / "eval").glob("*tmp*"))
    assert run(ev, cache=cache).returncode == 0


def test_killed_extension_resumes_identically(reference, scratch, cache):
    out = _copy(reference, scratch)
    ext = [
        "extend",
        str(out),
        "--method",
        "chunk",
        "--factor",
        "2",
        "--tokens",
        "1024",
        "--no-progress",
        "--set",
        "train.checkpoint_every=1",
    ]
    clean = run(ext + ["--out", str(scratch / "clean")], cache=cache)
    assert clean.returncode == 0, clean.stderr
    killed = run(
        ext + ["--out", str(scratch / "ext")],
        cache=cache,
        fault=Fault("extrapos.training.trainer:masked_loss_sum", nth=3),
    )
    assert killed.returncode == -signal.SIGKILL
    resumed = run(ext + ["--out", str(scratch / "ext"), "--resume"], cache=cache)
    assert resumed.returncode == 0, resumed.stderr
    assert losses(scratch / "ext") == losses(scratch / "clean")
