"""What ``extrapos extend`` says before it trains (its plan: method, L_t -> L_e, the position table,
tokens, steps, learning rate and the time one measured step predicts) and after (a summary).

The estimate times one forward and backward pass of one micro-batch of the extension's own shape
(batch size x example length, the model as configured, random weights and tokens: the cost does not
depend on them) on the training device, after one untimed pass, and multiplies it by the micro-batches
of the whole run; the optimizer step, data loading and evaluation come on top.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from extrapos.run.config import RunConfig


def imported_parent_note(parent: Path, lr: float, end_lr: float) -> str | None:
    """For a parent made by ``extrapos import`` (it has source.json): its training settings are not in
    its Hugging Face config, so the run carries extrapos' defaults and the extension's learning rate is
    derived from them, a guess; None for a parent trained here."""
    if not (parent / "source.json").is_file():
        return None
    return (
        f"the parent is an imported model: its own training settings are unknown (a Hugging Face config "
        f"does not record them), so the learning rate {lr:g} -> {end_lr:g} is derived from extrapos' "
        "defaults and is a guess; set it with --set train.lr=LR --set train.end_lr=LR"
    )


def seconds_per_micro_batch(cfg: RunConfig) -> tuple[float, str]:
    """One forward and backward pass of a micro-batch of the extension's shape, timed (module docstring),
    and the device it ran on."""
    import torch

    from extrapos.model import Decoder
    from extrapos.run.runtime import resolve_device

    device = resolve_device(cfg.train.device, "train.device")
    # the random weights and tokens of this measurement come from a fork of the generators, never from the
    # run's own: the run is seeded before the plan is said, so drawing here moved the RNG state its
    # checkpoints save, and an extension started over (which says no plan) saved another one (issue 48)
    accelerators = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=accelerators, device_type=device.type):
        model = Decoder(cfg.model).to(device).train()
        B, T = cfg.train.batch_size, cfg.seq_len
        tokens = torch.randint(0, cfg.model.vocab_size, (B, T + 1), device=device)
        positions = torch.arange(T, device=device).expand(B, T)
        mask = torch.ones(B, T, device=device)
        elapsed = 0.0
        for timed in (False, True):
            start = time.perf_counter()
            loss = model(tokens[:, :-1], positions, targets=tokens[:, 1:], loss_mask=mask)
            loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if timed:
                elapsed = time.perf_counter() - start
            model.zero_grad(set_to_none=True)
    return elapsed, str(device)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_lines(
    cfg: RunConfig, record: dict[str, Any], parent: Path, measured: tuple[float, str] | None
) -> list[str]:
    """The plan, one line per fact; ``measured``: a micro-batch's seconds and device (None: no estimate)."""
    from extrapos.run.runtime import accumulation_steps, tokens_per_step

    plan = cfg.model.positions_plan()
    per_step = tokens_per_step(cfg)
    steps = -(-cfg.train.tokens // per_step) if cfg.train.tokens else cfg.train.steps
    lines = [
        f"method {record['method']}"
        + (f" (alpha {record['alpha']:g})" if record.get("alpha") is not None else "")
        + (f", preset {record['preset']}" if record.get("preset") else ""),
        f"L_t {record['train_length']} -> L_e {record['extended_length']} (factor {record['factor']})",
    ]
    if plan.name == "learned":
        from extrapos.positions.absolute import LearnedAbsolute

        rows = plan.options_as(LearnedAbsolute.Options).max_length or cfg.model.train_length
        lines.append(f"position table: {rows} rows (learned; interpolated from the parent's when longer)")
    else:
        lines.append(f"position table: none ({plan.name} computes positions at any length)")
    if cfg.train.tokens:
        lines.append(f"tokens: {cfg.train.tokens:,} in {steps} steps of {per_step:,} tokens")
    else:
        lines.append(f"steps: {steps} of {per_step:,} tokens")
    lines.append(
        f"learning rate {cfg.train.lr:g} -> {cfg.train.end_lr:g} ({cfg.train.schedule}, "
        f"warmup {cfg.train.warmup:g}), batch {cfg.train.batch_size} x {cfg.seq_len} tokens"
    )
    if measured is not None and steps:
        seconds, device = measured
        micro = steps * accumulation_steps(cfg)
        lines.append(
            f"estimated time: {duration(micro * seconds)} ({micro} forward+backward passes x {seconds:.3g} s "
            f"measured on {device}; the optimizer, data loading and a busy machine add to it)"
        )
    note = imported_parent_note(parent, cfg.train.lr, cfg.train.end_lr)
    if note:
        lines.append(f"note: {note}")
    return lines


def summary_lines(result: Any, record: dict[str, Any], parent: str) -> list[str]:
    """What the finished extension did and how to compare it with its parent (the same flags for both)."""
    K = record["factor"]
    lengths = ",".join(str(k) for k in sorted({1, K, 2 * K}))
    flags = f"--lengths {lengths}" + (" --interpolate" if record.get("encoding") == "learned" else "")
    out = str(result.run_dir)
    return [
        f"{record['method']} x{K}: L_t {record['train_length']} -> L_e {record['extended_length']}, "
        f"{result.steps} steps, {result.tokens:,} tokens, final training loss {result.final_loss:.4f}",
        "changed: " + "; ".join(record.get("changes", [])),
        f"compare: extrapos eval {parent} {flags} and extrapos eval {out} {flags}",
        f"export: extrapos export {out} --out HF_DIR (its config records L_e = {record['extended_length']})",
    ]
