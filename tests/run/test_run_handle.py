"""The Run handle (``run/handle.py``): one trained run directory read once, what every command and
evaluator takes (issue 38, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extrapos.errors import UserError
from extrapos.run.config import load_config
from extrapos.run.handle import Run
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides

# A child that counts every open of a file named config.toml (the audit hook sees open(), io.open,
# Path.read_text and os.open alike) while `extrapos eval` runs, and prints the count last.
COUNT_OPENS = """
import sys
opened = []

def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)) and str(args[0]).endswith("config.toml"):
        opened.append(args[0])

sys.addaudithook(hook)
from extrapos.cli import main
code = main(sys.argv[1:])
print("CONFIG_OPENS=" + str(len(opened)))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def run_dir(tiny_data, tmp_path_factory):
    """A tiny RoPE run (L_t = 16)."""
    out = tmp_path_factory.mktemp("handle") / "rope"
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 2}))
    train(cfg, out, progress=False)
    return out


def count_config_opens(*argv: str) -> tuple[int, subprocess.CompletedProcess]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-c", COUNT_OPENS, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("CONFIG_OPENS=")]
    assert lines, done.stdout + done.stderr
    return int(lines[-1].split("=")[1]), done


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--tokens", "64", "--rope-scaling", "linear"],  # the default factor reads L_t, the options checked
    ],
)
def test_one_eval_reads_config_toml_once(run_dir, extra):
    """`extrapos eval` opens the run once: its config.toml is read one time, whatever the flags ask."""
    argv = ["eval", str(run_dir), "--lengths", "1,2", "--max-tokens", "64", "--no-progress", "--overwrite"]
    opens, done = count_config_opens(*argv, *extra)
    assert done.returncode == 0, done.stderr
    assert opens == 1


def test_a_run_reads_each_file_on_first_use_and_keeps_it(run_dir, monkeypatch):
    import extrapos.run.handle as handle

    reads = []
    real = handle.load_run_config
    monkeypatch.setattr(handle, "load_run_config", lambda path: reads.append(path) or real(path))
    run = Run(run_dir)
    assert reads == [] and run.exists  # nothing read until asked
    assert run.cfg.model.train_length == 16 and run.cfg is run.cfg and len(reads) == 1
    assert Run.open(run) is run and len(reads) == 1
    assert run.tokenizer is run.tokenizer and run.data_dir is not None and not run.is_encoder
    ckpt, digest = run.checkpoint()
    assert run.checkpoint() == (ckpt, digest) and len(digest) == 64
    loaded = run.load("cpu")
    assert loaded.handle is run and loaded.cfg is run.cfg and loaded.tokenizer is run.tokenizer
    assert loaded.step == ckpt.step and loaded.weights_sha256 == digest and not loaded.model.training
    assert len(reads) == 1


def test_the_same_weights_as_a_directory_load(run_dir):
    import torch

    from extrapos.run.directory import load_run

    a, b = load_run(run_dir).model.state_dict(), Run.open(run_dir).load().model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_directory_without_a_run_is_refused_where_it_is_first_read(tmp_path):
    run = Run(tmp_path / "nothing")  # a command may hold it from its start: nothing is read yet
    assert not run.exists
    with pytest.raises(UserError, match="is not a run directory \\(no config.toml\\); pass the --out"):
        Run.open(run)
    with pytest.raises(UserError, match="is not a run directory"):
        Run.open(tmp_path)


def test_an_evaluator_takes_the_run_or_its_path_alike(run_dir):
    from extrapos.evaluate import EvalRequest, evaluate

    req = EvalRequest(lengths=[1, 2], max_tokens=64)
    by_path = evaluate(run_dir, req, name="by-path", progress=False)
    by_run = evaluate(Run(run_dir), req, name="by-run", progress=False)
    assert by_path["run"] == by_run["run"] == str(run_dir)
    assert [r["loss"] for r in by_path["results"]] == [r["loss"] for r in by_run["results"]]
    saved = json.loads((run_dir / "eval" / "by-run.json").read_text())
    assert saved["result_key"] == by_path["result_key"]
