"""A sweep's time budget: ``budget_seconds = S`` gives every trained run the same number of tokens, as many
as fit S seconds of training in all, measured on the machine the sweep runs on.

Why: the same sweep file then fits whatever GPU (or CPU) it lands on, an H100 and an H200 alike, and
the rows stay comparable, as the papers' tables are: every encoding sees the same tokens, never the same
seconds (a slower encoding is not trained less).

How: before the first row trains, each trained row's configuration runs ``PROBE_WARMUP`` optimizer steps
(kernel selection, FlexAttention's and torch.compile's compilation) and then ``PROBE_TIMED`` timed ones
on its own data, in a scratch run directory that is deleted afterwards; its step time is the median of
the timed steps. With ``r`` seconds per token for row r and ``n`` runs per row (seeds), every run gets

    tokens = S / (n * sum_r r)    rounded down to whole optimizer steps,

so the rows' training, at the measured speeds, takes S seconds in all. Compilation, warm-up, the probe
itself and evaluation are outside S (the probe's seconds are recorded beside it). The measurement is
written to ``OUT/budget.json`` and reused when the sweep is run again into the same directory, so a
resumed sweep gives its rows the token budget their runs started with.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from extrapos.compare.sweep import Sweep, SweepRow, row_config, slug
from extrapos.errors import UserError
from extrapos.files import atomic_write
from extrapos.run.config import RunConfig

logger = logging.getLogger(__name__)

PROBE_WARMUP = 2  # untimed steps: the first one compiles and selects kernels
PROBE_TIMED = 3  # timed steps: their median is the row's step time
BUDGET_FILE = "budget.json"


def _step_times(
    cfg: RunConfig, probe_dir: Path, device: torch.device, rank: int, world: int
) -> dict[str, Any]:
    """``PROBE_WARMUP + PROBE_TIMED`` optimizer steps of ``cfg`` (the Trainer's own step: its data, its
    precision, its document mask) in ``probe_dir``; the median timed step and what warming up cost."""
    from extrapos.training.trainer import Trainer

    steps = PROBE_WARMUP + PROBE_TIMED
    train = replace(cfg.train, steps=steps, tokens=None, epochs=None, tensorboard=False, wandb=None)
    probe = replace(cfg, train=train)
    probe_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trainer = Trainer(probe, probe_dir, device, rank, world, progress=False)
    for i in range(PROBE_WARMUP):
        trainer.train_step(i)  # its loss is read back as a float, so the device has finished the step
    warmup = time.perf_counter() - t0
    timed = [trainer.train_step(PROBE_WARMUP + i).seconds for i in range(PROBE_TIMED)]
    tokens_per_step = trainer.plan.tokens_per_step
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    step = statistics.median(timed)
    return {
        "step_seconds": step,
        "tokens_per_step": tokens_per_step,
        "tokens_per_second": tokens_per_step / step,
        "warmup_seconds": warmup,
    }


def _agreed(value: float) -> float:
    """Rank 0's ``value`` on every process (under torchrun each rank times its own steps; the token budget,
    and with it every run's config, must be one number)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return value
    backend_device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=backend_device)
    dist.broadcast(t, src=0)
    return float(t.item())


def plan_budget(
    sweep: Sweep,
    trained: list[SweepRow],
    runs_per_row: int,
    extra: list[str],
    out: Path,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    say: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """The sweep's budget (module docstring): tokens per run and how they were measured, also written to
    ``OUT/budget.json`` by rank 0; the saved one when ``out`` already holds a plan for this budget and
    these rows."""
    assert sweep.budget_seconds is not None, "plan_budget is asked only for a sweep with budget_seconds"
    names = [r.name for r in trained]
    saved_path = out / BUDGET_FILE
    if saved_path.is_file():
        try:
            saved = json.loads(saved_path.read_text())
        except (OSError, ValueError):
            raise UserError(
                f"{saved_path} cannot be read as the sweep's budget; delete it (or the whole --out) to "
                "measure the budget again."
            ) from None
        same = (saved.get("budget_seconds"), saved.get("rows"), saved.get("runs_per_row"))
        if same == (sweep.budget_seconds, names, runs_per_row):
            say(f"budget: {saved['tokens_per_run']:,} tokens per run, as measured before ({saved_path})")
            return saved
        if any((out / "runs").glob("*/config.toml")):
            raise UserError(
                f"{saved_path} holds the budget of other rows, seeds or another budget_seconds, and "
                f"{out / 'runs'} holds runs trained with it; use a new --out for this sweep."
            )
    t0 = time.perf_counter()
    measured = []
    for row in trained:
        cfg = row_config(sweep, row, extra)
        probe_dir = out / ".budget-probe" / slug(row.name)
        try:
            m = _step_times(cfg, probe_dir, device, rank, world)
        finally:
            if rank == 0:
                shutil.rmtree(out / ".budget-probe", ignore_errors=True)
        m["step_seconds"] = _agreed(m["step_seconds"])
        m["tokens_per_second"] = m["tokens_per_step"] / m["step_seconds"]
        measured.append({"row": row.name, **m})
        say(
            f"budget probe {row.name}: {m['step_seconds'] * 1e3:.1f} ms per step of {m['tokens_per_step']:,} "
            f"tokens ({m['tokens_per_second']:,.0f} tokens/s; warm-up {m['warmup_seconds']:.1f} s)"
        )
    per_step = measured[0]["tokens_per_step"]
    seconds_per_token = sum(m["step_seconds"] / m["tokens_per_step"] for m in measured)
    tokens = int(sweep.budget_seconds / (runs_per_row * seconds_per_token))
    steps = max(1, tokens // per_step)
    plan = {
        "budget_seconds": sweep.budget_seconds,
        "rows": names,
        "runs_per_row": runs_per_row,
        "tokens_per_run": steps * per_step,
        "steps_per_run": steps,
        "tokens_per_step": per_step,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": world,
        "probe": {"warmup_steps": PROBE_WARMUP, "timed_steps": PROBE_TIMED, "rows": measured},
        "probe_seconds": time.perf_counter() - t0,
        "expected_training_seconds": steps * per_step * runs_per_row * seconds_per_token,
    }
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(saved_path, json.dumps(plan, indent=1))
    say(
        f"budget: {sweep.budget_seconds:g} s of training for {len(names)} rows x {runs_per_row} run(s) -> "
        f"{plan['tokens_per_run']:,} tokens ({steps} steps) per run"
    )
    return plan


def budget_fact(plan: dict[str, Any]) -> str:
    """The report's statement of the budget: what was asked, what each row's probe measured, what it gave."""
    speeds = ", ".join(f"{m['row']} {m['tokens_per_second']:,.0f}" for m in plan["probe"]["rows"])
    return (
        f"budget: {plan['budget_seconds']:g} s of training in all on {plan['device']} (world size "
        f"{plan['world_size']}), split into equal tokens: {plan['tokens_per_run']:,} tokens "
        f"({plan['steps_per_run']} steps) per run, {plan['runs_per_row']} run(s) per row, from each row's "
        f"median of {plan['probe']['timed_steps']} timed steps after {plan['probe']['warmup_steps']} "
        f"warm-up steps (tokens/s: {speeds}); the probe took {plan['probe_seconds']:.0f} s, outside the "
        "budget, as are compilation and evaluation"
    )
