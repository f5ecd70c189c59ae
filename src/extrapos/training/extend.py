"""`extrapos extend`: continue a trained run at L_e = K x L_t (Karypis et al., segmented sequences, §3-4).

Methods: ``chunk`` / ``prefix`` / ``randompos`` / ``pose`` (L_t-token examples cut from L_e windows;
chunk and prefix keep original positions, randompos and pose spread them over [0, L_e)), ``full``
(the L_e windows) and ``continue`` (the paper's domain-adaptation control), all on the same
compute-equivalent token budget (§4.4) and the same optimizer rule.
The rules and why they are what they are: docs/extension.md.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extrapos.errors import UserError
from extrapos.files import atomic_write
from extrapos.owned import refuse_inside_run
from extrapos.run import checkpoint as ckpt_io
from extrapos.run.config import (
    DataConfig,
    RunConfig,
    TrainConfig,
    load_run_config,
    parse_override,
    with_overrides,
)
from extrapos.run.runtime import prepare_run_data, tokens_per_step

if TYPE_CHECKING:
    from extrapos.data.shards import TokenSplit
    from extrapos.training.trainer import TrainResult

logger = logging.getLogger(__name__)
METHODS = ("chunk", "prefix", "full", "randompos", "pose", "continue")
EXTENSION_LR_FRACTION = 0.1
EXTENSION_WARMUP = 0.05


DEFAULT_ALPHA = 0.25


def method_label(method: str, alpha: float | None = None) -> str:
    if method in ("chunk", "prefix"):
        return f"{method}-{DEFAULT_ALPHA if alpha is None else alpha:g}"
    return method


def default_out(parent: Path, method: str, factor: int, alpha: float | None = None) -> Path:
    return parent.parent / f"{parent.name}-{method_label(method, alpha)}-x{factor}"


def _parent_split(parent: Path, cfg: RunConfig) -> TokenSplit:
    """The parent's train split: the data it trained on (data.json), else its data prepared again; either
    must hold the parent's tokenizer."""
    from extrapos.data import load_tokenizer, open_split
    from extrapos.run.runtime import check_data_tokenizer

    f = parent / "data.json"
    if f.is_file():
        d = Path(json.loads(f.read_text())["dir"])
        if (d / "manifest.json").is_file():
            check_data_tokenizer(d, load_tokenizer(parent).hash, parent, "set data.dir = DIR with --set")
            return open_split(d, "train")
    return open_split(prepare_run_data(cfg, progress=False, run_dir=parent), "train")


def parent_checkpoint(parent: Path) -> ckpt_io.Checkpoint:
    """The parent's newest intact checkpoint, verified as eval and generate verify theirs: every tensor file
    against the size and sha256 recorded at save (weights copied in from another run are damage too)."""
    if not ckpt_io.list_checkpoints(parent):
        raise UserError(f"{parent} has no checkpoint to extend; train it first.")
    return ckpt_io.checkpoint_at(parent, None)


def parent_tokenizer(parent: Path, data: DataConfig) -> DataConfig:
    """A tokenizer file is the parent's own saved copy (an imported parent records it relative to itself,
    older ones by an absolute path that may since name another tokenizer); bpe:N and named ones stay."""
    from extrapos.run.runtime import is_file_spec, run_tokenizer_file

    own = run_tokenizer_file(parent)
    if own is None or not is_file_spec(data.tokenizer):
        return data
    return replace(data, tokenizer=str(own.resolve()))


# ---- the derived config, one part at a time: each returns the new part and what it changed ----------


#: the RoPE scalings a fine-tune at L_e can train with (factor s = L_e / L_t); LongRoPE's per-frequency
#: factors come from a search this does not run, so it is not among them
TRAINABLE_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")


def extended_positions(
    pcfg: RunConfig,
    L_e: int,
    factor: int,
    rope_interpolation: bool,
    parent: Path,
    rope_scaling: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The encoding at L_e: a learned table resized to L_e rows; RoPE with position interpolation, or
    another RoPE scaling at factor L_e / L_t (the YaRN paper's fine-tune with the scaling on), if asked."""
    plan = pcfg.model.positions_plan()
    pos, changes = dict(pcfg.model.positions), []  # the stored table, rewritten for L_e
    name = plan.name
    if name == "learned":
        from extrapos.positions.absolute import LearnedAbsolute

        rows = plan.options_as(LearnedAbsolute.Options).max_length or pcfg.model.train_length
        pos.pop("interpolate_to", None)
        if L_e > rows:
            pos["max_length"] = L_e
            changes.append(
                f"learned table interpolated {rows} -> {L_e} rows (model.positions.max_length = {L_e})"
            )
    if rope_interpolation and rope_scaling not in (None, "linear"):
        raise UserError(
            f"--rope-interpolation is --rope-scaling linear; give one of them, not it and {rope_scaling!r}."
        )
    if rope_interpolation:
        if name != "rope":
            raise UserError(f"--rope-interpolation applies to RoPE models; {parent} uses {name!r}.")
        pos.update(scaling="linear", factor=float(factor))
        changes.append(f"RoPE position interpolation: scaling = linear, factor = {factor}")
    elif rope_scaling is not None:
        if rope_scaling not in TRAINABLE_SCALINGS:
            raise UserError(
                f"--rope-scaling must be one of {', '.join(TRAINABLE_SCALINGS)}, got {rope_scaling!r} "
                "(longrope needs per-frequency factors from its own search)."
            )
        if name != "rope":
            raise UserError(f"--rope-scaling applies to RoPE models; {parent} uses {name!r}.")
        pos.update(scaling=rope_scaling, factor=float(factor))
        changes.append(f"RoPE scaling: scaling = {rope_scaling}, factor = {factor}")
    return pos, changes


def extended_data(
    data: DataConfig, method: str, alpha: float | None, L_e: int
) -> tuple[DataConfig, list[str]]:
    """The method's sampler over windows of L_e tokens (``continue``: the parent's contiguous windows)."""
    from extrapos.data.segmented import POSE_CHUNKS

    segmented = method in ("chunk", "prefix")
    keeps_windows = method == "continue"
    new = replace(
        data,
        sampler="contiguous" if keeps_windows else method,
        extended_length=L_e,
        packed=data.packed if keeps_windows else False,
        # the extension methods draw each example from one document, so a packed parent's document mask
        # and restarted positions have nothing to act on (and an unpacked config refuses them)
        document_mask=data.document_mask if keeps_windows else False,
        document_positions=data.document_positions if keeps_windows else "continue",
        alpha=alpha if segmented and alpha is not None else data.alpha,
        pose_chunks=data.pose_chunks if method == "pose" else POSE_CHUNKS,  # a pose parent's, for pose only
    )
    change = (
        f"data.sampler {data.sampler} -> {new.sampler}"
        + (f" (alpha {alpha:g})" if segmented else "")
        + f", data.extended_length = {L_e}"
    )
    changes = [change]
    if not keeps_windows and (data.document_mask or data.document_positions != "continue"):
        changes.append(
            "data.document_mask = false, data.document_positions = continue: each example is drawn from "
            "one document"
        )
    return new, changes


def extended_train(train: TrainConfig, method: str, L_t: int, L_e: int) -> tuple[TrainConfig, list[str]]:
    """Examples of L_t tokens (``full``: L_e, with the batch cut to keep tokens per step), no budget yet,
    a short warmup and a learning rate that continues near the parent's final one."""
    changes, seq_len, batch_size = [], L_t, train.batch_size
    if method == "full":
        seq_len = L_e
        if (batch_size * L_t) % L_e == 0:
            batch_size = batch_size * L_t // L_e
            changes.append(
                f"train.seq_len = {L_e}, train.batch_size {train.batch_size} -> {batch_size} "
                "(the same tokens per step as the L_t methods)"
            )
        else:
            changes.append(
                f"train.seq_len = {L_e} (batch size kept: more tokens per step than the L_t methods)"
            )
    # continue near where the parent's schedule ended instead of re-warming to its peak: a short
    # extension re-warmed to the peak ends worse than the parent (measured: every method, `continue`
    # included, lost to no training at all). The same rule for every method.
    lr = max(train.end_lr, EXTENSION_LR_FRACTION * train.lr)
    end_lr = min(train.end_lr, lr)
    changes.append(
        f"fresh AdamW with the parent's settings, lr {lr:g} -> {end_lr:g} "
        f"(max of the parent's end lr and {EXTENSION_LR_FRACTION:g} x its peak), "
        f"warmup {EXTENSION_WARMUP:g} of the steps"
    )
    new = replace(
        train,
        seq_len=seq_len,
        batch_size=batch_size,
        steps=None,
        tokens=None,
        epochs=None,
        warmup=EXTENSION_WARMUP,
        lr=lr,
        end_lr=end_lr,
    )
    return new, changes


def _budget_tokens(value: Any, where: str) -> int:
    """A token budget: a positive integer of at most 64 bits (``schema.check`` bounds it), never a float
    or a word cut to an int."""
    from extrapos import schema

    tokens = schema.check(int, value, where)
    if tokens < 1:
        raise UserError(f"{where} must be a positive number of tokens, got {tokens}.")
    return tokens


def _split_budget(overrides: list[str], tokens: int | None) -> tuple[list[str], int | None, str | None]:
    """(other overrides, token budget, literal steps/epochs override) from ``--set`` and ``--tokens``.

    ``train.tokens`` is the CPU-scale budget (kept equal across methods); ``train.steps`` /
    ``train.epochs`` are taken literally (and then the methods no longer see equal token counts).
    """
    rest, literal = [], None
    for text in overrides:
        keys, value = parse_override(text)
        if keys == ["train", "tokens"]:
            tokens = _budget_tokens(value, "config key 'train.tokens'")
            continue
        if keys in (["train", "steps"], ["train", "epochs"]):
            literal = text
        rest.append(text)
    return rest, tokens, literal


def _check_window_memory(pcfg: RunConfig, L_e: int, factor: int) -> None:
    """Refuse, before anything is built, an extended window that one forward of one row cannot hold
    (``memory.forward_bytes``, a lower bound of a training step): ``--factor 10**30`` is one sentence,
    never an overflow deep in the sampler."""
    from extrapos.run.memory import check_memory, forward_bytes

    check_memory(
        forward_bytes(pcfg.model, L_e),
        "cpu",
        f"a training window of L_e = {factor} x {pcfg.seq_len} tokens",
        "give a smaller --factor",
    )


def extension_config(
    parent: str | Path,
    method: str,
    factor: int = 2,
    alpha: float | None = None,
    tokens: int | None = None,
    rope_interpolation: bool = False,
    overrides: list[str] | None = None,
    rope_scaling: str | None = None,
    preset: str | None = None,
) -> tuple[RunConfig, dict[str, Any]]:
    """The extension run's config and its ``parent.json`` record (nothing is written); ``preset``: the
    extension preset that chose method, alpha and factor (training/extension_presets.py), recorded."""
    from extrapos.data.segmented import compute_equivalent_tokens, segment_length

    parent = Path(parent)
    if method not in METHODS:
        raise UserError(f"unknown extension method {method!r}; choose one of: {', '.join(METHODS)}.")
    if not isinstance(factor, int) or factor < 1:
        raise UserError(f"--factor must be a positive integer (L_e = factor x L_t), got {factor!r}.")
    pcfg = load_run_config(parent)
    ckpt = parent_checkpoint(parent)
    if method in ("chunk", "prefix"):
        alpha = DEFAULT_ALPHA if alpha is None else float(alpha)
        segment_length(pcfg.seq_len, alpha)
    elif alpha is not None:
        raise UserError(f"--alpha applies to chunk and prefix only, not {method}.")
    L_t, L_e = pcfg.seq_len, factor * pcfg.seq_len
    _check_window_memory(pcfg, L_e, factor)
    if tokens is not None:
        tokens = _budget_tokens(tokens, "--tokens")
    overrides, tokens, literal_budget = _split_budget(list(overrides or []), tokens)

    positions, changes = extended_positions(pcfg, L_e, factor, rope_interpolation, parent, rope_scaling)
    data, data_changes = extended_data(parent_tokenizer(parent, pcfg.data), method, alpha, L_e)
    train, train_changes = extended_train(pcfg.train, method, L_t, L_e)
    changes += data_changes + train_changes
    cfg = replace(pcfg, model=replace(pcfg.model, positions=positions), data=data, train=train)
    # a placeholder budget keeps the config valid until the real one is known
    cfg = with_overrides(cfg, overrides + ([] if literal_budget else ["train.tokens=1"]))

    budget_tokens = tokens
    budget_kind = "override" if tokens is not None else "compute-equivalent (L_e / L_t epochs of L_e windows)"
    if budget_tokens is None:
        budget_tokens = compute_equivalent_tokens(_parent_split(parent, pcfg), L_t, L_e)
    if not literal_budget:
        per_step = tokens_per_step(cfg)
        steps = max(1, budget_tokens // per_step)
        cfg = replace(cfg, train=replace(cfg.train, tokens=steps * per_step))
        changes.append(
            f"budget: train.tokens = {cfg.train.tokens:,} ({steps} steps of {per_step:,} tokens; "
            f"{budget_kind}: {budget_tokens:,})"
        )
    else:
        changes.append(f"budget: {literal_budget} (as given; token counts may differ across methods)")
    if overrides:
        changes.append("overrides: " + ", ".join(overrides))
    record = {
        "parent": str(parent.resolve()),
        "checkpoint": str(ckpt.path.resolve()),
        "step": ckpt.step,
        "weights_sha256": ckpt_io.weights_digest(ckpt),
        "method": method,
        "alpha": alpha if method in ("chunk", "prefix") else None,
        "factor": factor,
        "train_length": L_t,
        "extended_length": L_e,
        "tokens": cfg.train.tokens,
        "compute_equivalent": budget_kind != "override" and not literal_budget,
        "rope_interpolation": rope_interpolation,
        # only when set, so the records of runs without it stay as they were
        **({"rope_scaling": rope_scaling} if rope_scaling is not None else {}),
        **({"preset": preset} if preset is not None else {}),
        "encoding": pcfg.model.positions_plan().name,  # the parent's: extended_positions keeps the name
        "changes": changes,
    }
    return cfg, record


def extend(
    parent: str | Path,
    method: str,
    factor: int = 2,
    alpha: float | None = None,
    out: str | Path | None = None,
    tokens: int | None = None,
    rope_interpolation: bool = False,
    overrides: list[str] | None = None,
    resume: bool = False,
    progress: bool = True,
    rope_scaling: str | None = None,
    preset: str | None = None,
) -> TrainResult:
    """Create (or with ``resume`` continue) the extension run ``out``; returns train's TrainResult. With
    ``progress`` it prints its plan first (training/extension_plan.py)."""
    import torch

    from extrapos.model import Decoder
    from extrapos.positions.absolute import LearnedAbsolute
    from extrapos.run.runtime import barrier, init_distributed, resolve_device
    from extrapos.training.trainer import train

    parent = Path(parent)
    out = Path(out) if out is not None else default_out(parent, method, factor, alpha)
    if not (out / "config.toml").is_file():  # RUN/checkpoints/step-22 would be pruned with its weights
        refuse_inside_run(out, "--out")
    cfg, record = extension_config(
        parent, method, factor, alpha, tokens, rope_interpolation, overrides, rope_scaling=rope_scaling,
        preset=preset,
    )  # fmt: skip
    init = out / "init" / "model.safetensors"
    # under torchrun (a sweep's extension rows): every process looks at ``out`` before rank 0 writes
    is_main = init_distributed(resolve_device(cfg.train.device))[0] == 0
    started = (out / "config.toml").is_file()
    barrier()
    if started:
        if not resume:
            raise UserError(
                f"{out} already holds a run; pass --resume to continue it or choose another --out."
            )
        saved = json.loads((out / "parent.json").read_text()) if (out / "parent.json").is_file() else {}
        if {k: saved.get(k) for k in ("parent", "method", "alpha", "factor")} != {
            k: record[k] for k in ("parent", "method", "alpha", "factor")
        }:
            raise UserError(
                f"{out} extends {saved.get('parent')} with {saved.get('method')}; it is not this "
                "extension. Choose another --out."
            )
        if (out / "config.toml").read_text() != cfg.to_toml():
            raise UserError(f"{out} was started with a different config; resume it with the same options.")
        return train(
            cfg,
            out,
            resume=True,
            progress=progress,
            init_from=init if init.is_file() else record["checkpoint"],
        )
    out.mkdir(parents=True, exist_ok=True)
    init_from: Path = Path(record["checkpoint"])
    plan = cfg.model.positions_plan()
    rows = plan.options_as(LearnedAbsolute.Options).max_length if plan.name == "learned" else None
    if rows:
        # resize the learned table: load the parent as it was, interpolate, save the initial weights
        from safetensors.torch import save_model

        pcfg = load_run_config(parent)
        model = Decoder(pcfg.model)
        ckpt_io.load_weights(model, init_from)
        assert isinstance(model.pos, LearnedAbsolute)  # the parent's encoding: extension keeps the name
        if rows > model.pos.length:
            model.pos.extend_table(rows)
        check = Decoder(cfg.model)
        if check.pos.table.shape != model.pos.table.shape:  # pragma: no cover - a config/table mismatch
            raise UserError("the resized learned table does not match the extension config.")
        if is_main:
            init.parent.mkdir(parents=True, exist_ok=True)
            with torch.no_grad():
                save_model(model, str(init.with_suffix(".tmp")))
            os.replace(init.with_suffix(".tmp"), init)
        init_from = init
    if is_main:
        atomic_write(out / "parent.json", json.dumps(record, indent=1))
    barrier()  # the record and the resized weights are on disk before any process reads them

    def show_plan() -> None:
        # the plan and its time estimate always (docs/extension.md), on stdout as train's own first line;
        # said once the trainer's checks pass, so that a refused config is its one sentence alone and
        # stderr holds nothing but the error of a run that fails (the battery's contract)
        from extrapos.training.extension_plan import plan_lines, seconds_per_micro_batch

        lines = plan_lines(cfg, record, parent, seconds_per_micro_batch(cfg))
        logger.info(
            f"extrapos extend: {record['method']} x{factor} of {parent} (step {record['step']}): L_t "
            f"{record['train_length']} -> L_e {record['extended_length']}\n  "
            + "\n  ".join(lines + ["changes:"])
            + "\n    "
            + "\n    ".join(record["changes"])
        )

    return train(cfg, out, resume=False, progress=progress, init_from=init_from, before_start=show_plan)
