"""Trainer: a real tiny run, exact resume after SIGKILL of a real process, clear failures."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from extrapos.cli import main
from extrapos.errors import UserError
from extrapos.run.config import load_config
from extrapos.run.runtime import step_plan
from extrapos.training import trainer as train_mod
from tests.conftest import tiny_overrides


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in train_mod.read_metrics(run_dir) if "loss" in m]


def final_weights(run_dir):
    last = sorted((run_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    return load_file(str(last / "model.safetensors"))


def test_tiny_run_learns_and_writes_a_complete_run_dir(tiny_data, tmp_path):
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 30, "train.eval_every": 10}))
    result = train_mod.train(cfg, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    for name in ("config.toml", "tokenizer.json", "metrics.jsonl", "summary.json", "data.json"):
        assert (run / name).is_file(), name
    logged = losses(run)
    assert logged[0][0] == 1 and logged[-1][0] == 30
    assert logged[-1][1] < logged[0][1] - 1.0  # it learns
    assert any("val_loss" in m for m in train_mod.read_metrics(run))
    assert result.val_loss is not None and result.tokens == 30 * 4 * 32
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-30"]


def test_learning_rate_schedule_warmup_then_decay_to_end():
    cfg = load_config("cpu/tiny", ["train.lr=1.0", "train.end_lr=0.1", "train.warmup=10", "train.steps=100"])
    lrs = [train_mod.learning_rate(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_weight_decay_applies_to_matrices_only(tiny_data):
    from extrapos.model import Decoder

    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data))
    opt = train_mod.build_optimizer(Decoder(cfg.model), cfg)
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == cfg.train.weight_decay
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_gradient_accumulation_plan(tiny_data):
    cfg = load_config(
        "cpu/tiny", tiny_overrides(tiny_data, **{"train.batch_tokens": 512, "train.tokens": 5120})
    )
    plan = step_plan(cfg, windows_per_epoch=1000, world=1)
    accum, total = plan.accumulation, plan.total_steps
    assert accum == 4 and total == 10  # 4 x (4 sequences x 32 tokens) = 512 tokens per step


def test_killed_run_resumes_exactly(tiny_data, tmp_path):
    """SIGKILL a real training process after a checkpoint, resume it: same losses, same weights."""
    sets = tiny_overrides(
        tiny_data,
        **{
            "train.steps": 12,
            "train.checkpoint_every": 3,
            "model.dropout": 0.1,
            "train.keep_checkpoints": 10,
        },
    )
    reference = tmp_path / "reference"
    train_mod.train(load_config("cpu/tiny", sets), reference, progress=False)

    killed = tmp_path / "killed"
    args = [
        sys.executable,
        "-m",
        "extrapos",
        "train",
        "--config",
        "cpu/tiny",
        "--out",
        str(killed),
        "--no-progress",
    ]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    for line in proc.stdout:  # blocks until the process reports its second checkpoint
        if "checkpoint saved" in line and "step-6" in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()  # it really died mid-run

    assert main(["train", "--out", str(killed), "--resume", "--no-progress"]) == 0
    assert losses(killed) == losses(reference)
    ref_w, got_w = final_weights(reference), final_weights(killed)
    assert ref_w.keys() == got_w.keys()
    for k in ref_w:
        assert torch.equal(ref_w[k], got_w[k]), k


def test_nonfinite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
    tiny_data, tmp_path, monkeypatch
):
    real = train_mod.model_loss_sum
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        loss = real(*args)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(train_mod, "model_loss_sum", poisoned)
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.checkpoint_every": 2}))
    with pytest.raises(train_mod.TrainingDiverged, match="at step 5; the last good checkpoint is .*step-4"):
        train_mod.train(cfg, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "checkpoints" / "step-4" / "model.safetensors").is_file()
    assert not (tmp_path / "run" / "summary.json").exists()


def test_cli_refuses_to_overwrite_a_run_and_resumes_a_finished_one(tiny_data, tmp_path, capsys):
    args = ["train", "--config", "cpu/tiny", "--out", str(tmp_path / "r"), "--no-progress"]
    for s in tiny_overrides(tiny_data, **{"train.steps": 2}):
        args += ["--set", s]
    assert main(args) == 0
    before = (tmp_path / "r" / "summary.json").read_text()
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "r"), "--resume", "--no-progress"]) == 0
    assert (tmp_path / "r" / "summary.json").read_text() == before


def test_vocabulary_mismatch_is_a_clear_error(tiny_data, tmp_path):
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"model.vocab_size": 100}))
    with pytest.raises(UserError, match="set model.vocab_size=512"):
        train_mod.train(cfg, tmp_path / "run", progress=False)


def test_checkpoints_never_unpickle(tiny_data, tmp_path):
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2}))
    train_mod.train(cfg, tmp_path / "run", progress=False)
    files = sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "step-2").iterdir())
    assert files == ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]
    json.loads((tmp_path / "run" / "checkpoints" / "step-2" / "state.json").read_text())
