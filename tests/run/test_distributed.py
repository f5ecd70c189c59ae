"""Data parallel training under torchrun (2 CPU processes, gloo), DDP and FSDP2.

What "the same run" means across world sizes: the global batch of 2 ranks x b windows is the next
2b windows of one stream, exactly the batch of 1 rank x 2b, so the loss trajectories agree to fp32
rounding (the gradient is reduced in another order, never bit for bit). On one world size a killed
and resumed job repeats its losses exactly. One 2-process test runs in the default suite (CI); the
rest are marked slow. Each test has its own --master_port, so they never collide.
"""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from extrapos.presets import read_toml
from extrapos.run.config import load_config
from extrapos.training.trainer import read_metrics, train
from tests.conftest import tiny_overrides

TOL = 2e-5  # fp32: a different summation order of the same gradients, a few steps of AdamW


def torchrun(port, out, sets, nproc=2, resume=False, popen=False):
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(port),
        "-m",
        "extrapos",
        "train",
        "--out",
        str(out),
        "--no-progress",
    ]
    args += ["--resume"] if resume else ["--config", "cpu/tiny"]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if popen:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def losses(run_dir):
    return [m["loss"] for m in read_metrics(run_dir) if "loss" in m]


def header(path):
    """A safetensors file's header: every tensor's name, dtype, shape and offset, and the metadata."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def assert_close_trajectories(a, b):
    assert len(a) == len(b) and len(a) >= 3
    assert max(abs(x - y) for x, y in zip(a, b)) < TOL, (a, b)


def single(tiny_data, out, **sets):
    return train(load_config("cpu/tiny", tiny_overrides(tiny_data, **sets)), out, progress=False)


def test_fsdp_two_ranks_equal_one_rank_with_twice_the_batch(tiny_data, tmp_path):
    """The CI test: 2 FSDP2 ranks x 2 windows with 2 micro-batches per step (gradient sync only on
    the second) = 1 process x 4 windows; the gathered checkpoint has the single-process format."""
    common = {"train.steps": 4, "train.batch_tokens": 2 * 2 * 32 * 2}
    torchrun(
        29541,
        tmp_path / "fsdp",
        tiny_overrides(tiny_data, **common, **{"train.batch_size": 2, "train.parallel": "fsdp"}),
    )
    single(tiny_data, tmp_path / "one", **common, **{"train.batch_size": 4})
    logged = [m for m in read_metrics(tmp_path / "fsdp") if "loss" in m]
    assert [m["step"] for m in logged] == [1, 2, 3, 4] and logged[-1]["tokens"] == 4 * 256
    assert_close_trajectories(losses(tmp_path / "fsdp"), losses(tmp_path / "one"))
    assert losses(tmp_path / "fsdp")[-1] < losses(tmp_path / "fsdp")[0]
    for name in ("model.safetensors", "optimizer.safetensors"):
        got, want = (tmp_path / r / "checkpoints" / "step-4" / name for r in ("fsdp", "one"))
        assert header(got) == header(want), name  # same names, dtypes, shapes, tied-weight metadata
    w_fsdp = load_file(str(tmp_path / "fsdp" / "checkpoints" / "step-4" / "model.safetensors"))
    w_one = load_file(str(tmp_path / "one" / "checkpoints" / "step-4" / "model.safetensors"))
    assert max(float((w_fsdp[k] - w_one[k]).abs().max()) for k in w_one) < 1e-4
    # the config of a DDP run is written as before the option existed; an FSDP run records it
    assert "parallel" not in read_toml(tmp_path / "one" / "config.toml")["train"]
    assert read_toml(tmp_path / "fsdp" / "config.toml")["train"]["parallel"] == "fsdp"


@pytest.mark.slow
def test_ddp_two_ranks_equal_one_rank_with_twice_the_batch(tiny_data, tmp_path):
    torchrun(29542, tmp_path / "ddp", tiny_overrides(tiny_data, **{"train.steps": 5, "train.batch_size": 2}))
    single(tiny_data, tmp_path / "one", **{"train.steps": 5, "train.batch_size": 4})
    logged = [m for m in read_metrics(tmp_path / "ddp") if "loss" in m]
    assert [m["step"] for m in logged] == [1, 2, 3, 4, 5] and logged[-1]["tokens"] == 5 * 2 * 2 * 32
    assert_close_trajectories(losses(tmp_path / "ddp"), losses(tmp_path / "one"))


@pytest.mark.slow
def test_fsdp_with_activation_checkpointing_equals_one_rank_and_bf16_trains(tiny_data, tmp_path):
    sets = {
        "train.steps": 4,
        "train.batch_size": 2,
        "train.parallel": "fsdp",
        "train.activation_checkpointing": "true",
        "model.dropout": 0.0,
    }
    torchrun(29543, tmp_path / "ac", tiny_overrides(tiny_data, **sets))
    single(tiny_data, tmp_path / "one", **{"train.steps": 4, "train.batch_size": 4})
    assert_close_trajectories(losses(tmp_path / "ac"), losses(tmp_path / "one"))
    # bf16 parameters and fp32 gradient reductions (MixedPrecisionPolicy): it runs and learns
    torchrun(
        29544,
        tmp_path / "bf16",
        tiny_overrides(tiny_data, **{**sets, "train.precision": "bf16", "train.steps": 6}),
    )
    got = losses(tmp_path / "bf16")
    assert all(map(torch.isfinite, torch.tensor(got))) and got[-1] < got[0]
    assert abs(got[0] - losses(tmp_path / "one")[0]) < 0.05  # the same start, to bf16 rounding
    w = load_file(str(tmp_path / "bf16" / "checkpoints" / "step-6" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in w.values())  # fp32 master weights are saved


@pytest.mark.slow
@pytest.mark.parametrize("parallel,port", [("fsdp", 29545), ("ddp", 29546)])
def test_killed_two_process_job_resumes_exactly(tiny_data, tmp_path, parallel, port):
    """SIGKILL torchrun and both workers after a checkpoint, resume under torchrun: the same losses
    and weights, bit for bit, as the job that was never interrupted."""
    sets = tiny_overrides(
        tiny_data,
        **{
            "train.steps": 8,
            "train.batch_size": 2,
            "train.checkpoint_every": 3,
            "train.keep_checkpoints": 10,
            "train.parallel": parallel,
            "model.dropout": 0.1,
        },
    )
    torchrun(port, tmp_path / "reference", sets)
    killed = tmp_path / "killed"
    proc = torchrun(port + 10, killed, sets, popen=True)
    for line in proc.stdout:  # blocks until rank 0 reports the second checkpoint
        if "checkpoint saved" in line and "step-6" in line:
            break
    workers = children(proc.pid)  # torchrun starts each worker in a session of its own
    assert len(workers) == 2
    for pid in [proc.pid, *workers]:  # the whole job, as a scheduler kills it
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()
    torchrun(port + 20, killed, [], resume=True)
    assert losses(killed) == losses(tmp_path / "reference")
    want = load_file(str(tmp_path / "reference" / "checkpoints" / "step-8" / "model.safetensors"))
    got = load_file(str(killed / "checkpoints" / "step-8" / "model.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def _cut_back_to(run_dir, step):
    """The run as if it had been stopped right after its checkpoint at ``step``."""
    for ckpt in (run_dir / "checkpoints").glob("step-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    (run_dir / "summary.json").unlink()


@pytest.mark.slow
def test_checkpoints_resume_on_another_world_size(tiny_data, tmp_path):
    """2 FSDP ranks -> 1 process and 1 process -> 2 FSDP ranks. With train.batch_tokens fixed the
    global batch stays the same (accumulation doubles on one process), so the resumed steps read the
    same windows and their losses equal the uninterrupted run's to fp32 rounding."""
    common = {
        "train.steps": 6,
        "train.checkpoint_every": 3,
        "train.keep_checkpoints": 10,
        "train.batch_size": 2,
        "train.batch_tokens": 2 * 2 * 32,
    }
    two = tmp_path / "two"
    torchrun(29551, two, tiny_overrides(tiny_data, **common, **{"train.parallel": "fsdp"}))
    one = tmp_path / "one"
    single(tiny_data, one, **common)
    assert_close_trajectories(losses(two), losses(one))

    # 2 -> 1: the one process continues the FSDP run's checkpoint (FSDP needs 2+ processes: ddp)
    shutil.copytree(two, tmp_path / "two-to-one")
    _cut_back_to(tmp_path / "two-to-one", 3)
    from extrapos.cli import main

    assert (
        main(
            [
                "train",
                "--out",
                str(tmp_path / "two-to-one"),
                "--resume",
                "--no-progress",
                "--set",
                "train.parallel=ddp",
            ]
        )
        == 0
    )
    resumed = [m for m in read_metrics(tmp_path / "two-to-one") if "loss" in m]
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    assert_close_trajectories([m["loss"] for m in resumed], losses(two))

    # 1 -> 2: two FSDP ranks continue the single process's checkpoint
    shutil.copytree(one, tmp_path / "one-to-two")
    _cut_back_to(tmp_path / "one-to-two", 3)
    torchrun(29552, tmp_path / "one-to-two", ["train.parallel=fsdp"], resume=True)
    assert_close_trajectories(losses(tmp_path / "one-to-two"), losses(one))


SHARDED_EVAL = """
import json, sys
import torch.distributed as dist
from extrapos import evaluate as ev
from extrapos.evaluate import scoring
from extrapos.run.runtime import init_distributed
import torch

rank, world, _ = init_distributed(torch.device("cpu"))
rows = [0]
score = scoring.token_losses
def counting(model, tokens, *args, **kw):
    rows[0] += tokens.shape[0]
    return score(model, tokens, *args, **kw)
scoring.token_losses = counting  # where score_windows looks it up
result = ev.evaluate(sys.argv[1], ev.EvalRequest(lengths=[1, 2, 4]), name="sharded", batch_tokens=96,
                     progress=False)
open(f"{sys.argv[2]}/rows-{rank}.json", "w").write(json.dumps({"rows": rows[0], "world": world}))
"""


@pytest.mark.slow
def test_sharded_evaluation_equals_one_process(tiny_data, tmp_path):
    from extrapos.evaluate import EvalRequest, evaluate

    run = tmp_path / "run"
    single(tiny_data, run, **{"train.steps": 3})
    script = tmp_path / "sharded_eval.py"
    script.write_text(SHARDED_EVAL)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29561",
            str(script),
            str(run),
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )
    one = evaluate(run, EvalRequest(lengths=[1, 2, 4]), name="one", batch_tokens=96, progress=False)
    sharded = json.loads((run / "eval" / "sharded.json").read_text())
    assert [r["loss"] for r in sharded["results"]] == [r["loss"] for r in one["results"]]
    assert sharded["per_position"] == one["per_position"] and sharded["target_tokens"] == one["target_tokens"]
    counts = [json.loads((tmp_path / f"rows-{r}.json").read_text()) for r in (0, 1)]
    total = sum(one["results"][i]["windows"] for i in range(3))
    assert all(c["world"] == 2 and 0 < c["rows"] < total for c in counts)  # each rank scored a share
    assert sum(c["rows"] for c in counts) == total


def launch(port, args, nproc=2):
    """``torchrun --nproc_per_node=2 -m extrapos ARGS``: the completed process (stdout of both ranks)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    cmd += ["--master_port", str(port), "-m", "extrapos", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _cells(result):
    """A task result's numbers, without the timings."""
    return [{k: v for k, v in c.items() if k != "seconds"} for c in result["results"]]


@pytest.mark.slow
def test_sharded_compare_trains_on_two_ranks_and_scores_like_one_process(tiny_data, tmp_path):
    """`torchrun -m extrapos compare`: every row (and the extension row) trains on the 2 processes,
    the loss columns and the passkey column are scored by both, and the numbers equal a single
    process scoring the same runs; rank 0 alone prints and writes."""
    from extrapos.compare import load_sweep
    from extrapos.evaluate import EvalRequest, evaluate
    from extrapos.tasks.passkey import passkey

    sets = tiny_overrides(tiny_data, **{"model.train_length": 32, "train.steps": 3, "train.batch_size": 2})
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "sharded"\ntrain = "cpu/tiny"\nlengths = [4, 8]\nmax_eval_tokens = 512\n'
        "extend_tokens = 2048\n"
        'tasks = ["passkey"]\npasskey = { depths = [0.0, 1.0], trials = 3, candidates = 3, mode = "both" }\n'
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "Kerple"\npositions = { name = "kerple-log" }\n'
        '[[rows]]\nname = "RoPE x2"\nreuse = "RoPE"\neval = { scaling = "linear", factor = 2.0 }\n'
        '[[rows]]\nname = "RoPE chunk"\nextend = { from = "RoPE", method = "chunk", alpha = 0.25, factor = '
        "[4] }\n"
    )
    out = tmp_path / "out"
    done = launch(29571, ["compare", f, "--out", out, "--no-progress"])
    assert done.stdout.count(f"-> {out / 'report.md'}") == 1  # printed by rank 0 only
    assert done.stdout.count("[1/2] RoPE: training") == 1 and "[ext 1/1] RoPE chunk x4" in done.stdout
    entries = json.loads((out / "rows.json").read_text())
    assert [e["name"] for e in entries] == [r.name for r in load_sweep(str(f)).rows]
    for run in ("rope", "kerple", "rope-chunk-x4"):  # trained by the two processes
        state = json.loads(next((out / "runs" / run / "checkpoints").glob("step-*/state.json")).read_text())
        assert state["sampler"]["world_size"] == 2
    for i, entry in enumerate(entries):
        sharded = json.loads((out / entry["eval"]).read_text())
        run = out / (entry["run"][0] if isinstance(entry["run"], list) else entry["run"])
        req = EvalRequest(**sharded["request"])
        one = evaluate(run, req, name=f"one-process-{i}", progress=False)
        assert [r["loss"] for r in sharded["results"]] == [r["loss"] for r in one["results"]], entry["name"]
        assert sharded["per_position"] == one["per_position"]
        task = json.loads((out / entry["tasks"]["passkey"]).read_text())
        args = {k: v for k, v in task["request"].items() if k not in ("step",)}
        alone = passkey(run, **args, name=f"one-process-passkey-{i}")
        assert _cells(task) == _cells(alone), entry["name"]


@pytest.mark.slow
def test_passkey_command_deals_trials_to_two_ranks(tiny_data, tmp_path):
    """`torchrun -m extrapos passkey`: the trials are dealt out to the processes and gathered; the
    grid equals one process's and is printed once."""
    from extrapos.tasks.passkey import passkey

    run = tmp_path / "run"
    single(tiny_data, run, **{"train.steps": 3})
    args = ["passkey", run, "--lengths", "4,8", "--depths", "0,0.5,1", "--trials", "3", "--mode", "both"]
    done = launch(29572, [*args, "--candidates", "4", "--name", "sharded", "--no-progress"])
    assert done.stdout.count("passkey both (") == 1
    sharded = json.loads((run / "eval" / "sharded.json").read_text())
    alone = passkey(
        run, lengths=[4, 8], depths=[0, 0.5, 1], trials=3, mode="both", candidates=4, name="one-process"
    )
    assert _cells(sharded) == _cells(alone)
    assert any(0 < c["rank_accuracy"] < 1 or 1 < c["mean_rank"] for c in alone["results"])  # not all alike
