"""`extrapos extend`: continue a trained run at an extended length L_e (segmented sequences §3-4).

``extend(RUN, method, factor=K)`` starts a new run from RUN's latest checkpoint that learns to use
L_e = K x L_t tokens of context:

* ``chunk`` / ``prefix`` / ``randompos``: L_t-token examples cut from L_e windows with their
  original positions (``extrapos.data.segmented``); ``full``: the L_e windows themselves;
  ``continue``: the paper's domain-adaptation control, plain contiguous L_t windows with the same
  number of tokens.
* Compute-equivalent budget (§4.4): L_e / L_t epochs of one example per L_e window of the training
  split (one epoch for ``full``), i.e. ``windows x L_e`` tokens, the same for every method. ``tokens``
  (``--tokens``, or ``--set train.tokens=N``) replaces it with a smaller budget for CPU-scale runs,
  still equal across methods. The budget is rounded down to whole optimizer steps; ``full`` feeds
  ``batch_size x L_t / L_e`` windows per step when that divides, so every method takes the same
  steps of the same tokens (else it keeps the batch size and takes fewer, longer steps).
* Optimizer: the parent's settings (schedule, betas, weight decay, clipping, batch) with a fresh
  AdamW (the parent's moments belong to its finished schedule), a short warmup of 5% of the
  extension steps, and a learning rate that continues near the parent's final one: peak
  max(parent end_lr, 0.1 x parent lr), decaying to the parent's end_lr. Re-warming a short
  extension to the parent's peak left every method worse than no training in our runs. The rule
  is the same for every method; any key can be overridden with ``--set``.
* The model keeps ``model.train_length`` (L_t: ExPE's theta and FIRE's L derive from it); a learned
  absolute table is linearly interpolated to L_e rows first (§3.2; ``model.positions.max_length = L_e``
  so ``load_run`` rebuilds the resized table); RoPE may add position interpolation
  (``rope_interpolation``: scaling = linear, factor = K).
* ``RUN2/parent.json`` records the parent, its step, the method, alpha, factor, L_t, L_e, the token
  budget and every change applied. Out-of-the-box extrapolation needs no run: ``extrapos eval RUN
  --lengths K`` (with ``--interpolate`` for a learned table).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from extrapos import checkpoint as ckpt_io
from extrapos.config import RunConfig, apply_overrides, from_dict, load_run_config, parse_override
from extrapos.errors import UserError

METHODS = ("chunk", "prefix", "full", "randompos", "continue")
EXTENSION_LR_FRACTION = 0.1
EXTENSION_WARMUP = 0.05


DEFAULT_ALPHA = 0.25


def method_label(method: str, alpha: float | None = None) -> str:
    if method in ("chunk", "prefix"):
        return f"{method}-{DEFAULT_ALPHA if alpha is None else alpha:g}"
    return method


def default_out(parent: Path, method: str, factor: int, alpha: float | None = None) -> Path:
    return parent.parent / f"{parent.name}-{method_label(method, alpha)}-x{factor}"


def _tokens_per_step(cfg: RunConfig) -> int:
    t = cfg.train
    per_micro = t.batch_size * cfg.seq_len
    accum = max(1, round(t.batch_tokens / per_micro)) if t.batch_tokens else 1
    return per_micro * accum


def _parent_split(parent: Path, cfg: RunConfig):
    from extrapos.data import open_split
    from extrapos.train import prepare_run_data

    f = parent / "data.json"
    if f.is_file():
        d = Path(json.loads(f.read_text())["dir"])
        if (d / "manifest.json").is_file():
            return open_split(d, "train")
    return open_split(prepare_run_data(cfg, progress=False), "train")


def extension_config(parent: str | Path, method: str, factor: int = 2, alpha: float | None = None,
                     tokens: int | None = None, rope_interpolation: bool = False,
                     overrides: list[str] | None = None) -> tuple[RunConfig, dict[str, Any]]:
    """The extension run's config and its ``parent.json`` record (nothing is written)."""
    from extrapos.data.segmented import compute_equivalent_tokens, segment_length

    parent = Path(parent)
    if method not in METHODS:
        raise UserError(f"unknown extension method {method!r}; choose one of: {', '.join(METHODS)}.")
    if not isinstance(factor, int) or factor < 1:
        raise UserError(f"--factor must be a positive integer (L_e = factor x L_t), got {factor!r}.")
    pcfg = load_run_config(parent)
    ckpt = ckpt_io.latest_checkpoint(parent)
    if ckpt is None:
        raise UserError(f"{parent} has no checkpoint to extend; train it first.")
    if method in ("chunk", "prefix"):
        alpha = DEFAULT_ALPHA if alpha is None else float(alpha)
        segment_length(pcfg.seq_len, alpha)
    elif alpha is not None:
        raise UserError(f"--alpha applies to chunk and prefix only, not {method}.")
    L_t, L_e = pcfg.seq_len, factor * pcfg.seq_len
    overrides = list(overrides or [])
    # a budget in --set: train.tokens is the CPU-scale override (kept equal across methods); steps /
    # epochs are taken literally (and then the methods no longer see equal token counts)
    literal_budget = None
    for text in list(overrides):
        keys, value = parse_override(text)
        if keys == ["train", "tokens"]:
            tokens = int(value)
            overrides.remove(text)
        elif keys in (["train", "steps"], ["train", "epochs"]):
            literal_budget = text

    raw = pcfg.to_dict()
    changes: list[str] = []
    pos = dict(raw["model"]["positions"])
    name = pos["name"]
    if name == "learned":
        rows = pos.get("max_length") or pcfg.model.train_length
        pos.pop("interpolate_to", None)
        if L_e > rows:
            pos["max_length"] = L_e
            changes.append(f"learned table interpolated {rows} -> {L_e} rows (model.positions.max_length = {L_e})")
    if rope_interpolation:
        if name != "rope":
            raise UserError(f"--rope-interpolation applies to RoPE models; {parent} uses {name!r}.")
        pos.update(scaling="linear", factor=float(factor))
        changes.append(f"RoPE position interpolation: scaling = linear, factor = {factor}")
    raw["model"]["positions"] = pos

    d, t = raw["data"], raw["train"]
    old_sampler = d.get("sampler", "contiguous")
    d["sampler"] = "contiguous" if method == "continue" else method
    d["extended_length"] = L_e
    d["packed"] = False if method != "continue" else d.get("packed", False)
    if method in ("chunk", "prefix"):
        d["alpha"] = alpha
    changes.append(f"data.sampler {old_sampler} -> {d['sampler']}"
                   + (f" (alpha {alpha:g})" if method in ("chunk", "prefix") else "")
                   + f", data.extended_length = {L_e}")
    t["seq_len"] = L_t
    if method == "full":
        t["seq_len"] = L_e
        if (t["batch_size"] * L_t) % L_e == 0:
            new_batch = t["batch_size"] * L_t // L_e
            changes.append(f"train.seq_len = {L_e}, train.batch_size {t['batch_size']} -> {new_batch} "
                           "(the same tokens per step as the L_t methods)")
            t["batch_size"] = new_batch
        else:
            changes.append(f"train.seq_len = {L_e} (batch size kept: more tokens per step than the L_t methods)")
    for key in ("steps", "tokens", "epochs"):
        t.pop(key, None)
    t["warmup"] = EXTENSION_WARMUP
    # continue near where the parent's schedule ended instead of re-warming to its peak: a short
    # extension re-warmed to the peak ends worse than the parent (measured: every method, `continue`
    # included, lost to no training at all). The same rule for every method.
    parent_lr, parent_end = float(t.get("lr", 1e-3)), float(t.get("end_lr", 1e-4))
    t["lr"] = max(parent_end, EXTENSION_LR_FRACTION * parent_lr)
    t["end_lr"] = min(parent_end, t["lr"])
    changes.append(f"fresh AdamW with the parent's settings, lr {t['lr']:g} -> {t['end_lr']:g} "
                   f"(max of the parent's end lr and {EXTENSION_LR_FRACTION:g} x its peak), "
                   f"warmup {EXTENSION_WARMUP:g} of the steps")

    budget_tokens = tokens
    budget_kind = "override" if tokens is not None else "compute-equivalent (L_e / L_t epochs of L_e windows)"
    if budget_tokens is None:
        budget_tokens = compute_equivalent_tokens(_parent_split(parent, pcfg), L_t, L_e)
    raw = apply_overrides(raw, overrides + ([] if literal_budget else ["train.tokens=1"]))
    cfg = from_dict(raw)
    if not literal_budget:
        per_step = _tokens_per_step(cfg)
        steps = max(1, budget_tokens // per_step)
        cfg.train.tokens = steps * per_step
        changes.append(f"budget: train.tokens = {cfg.train.tokens:,} ({steps} steps of {per_step:,} tokens; "
                       f"{budget_kind}: {budget_tokens:,})")
    else:
        changes.append(f"budget: {literal_budget} (as given; token counts may differ across methods)")
    if overrides:
        changes.append("overrides: " + ", ".join(overrides))
    record = {
        "parent": str(parent.resolve()), "checkpoint": str(ckpt.path.resolve()), "step": ckpt.step,
        "method": method, "alpha": alpha if method in ("chunk", "prefix") else None, "factor": factor,
        "train_length": L_t, "extended_length": L_e, "tokens": cfg.train.tokens,
        "compute_equivalent": budget_kind != "override" and not literal_budget,
        "rope_interpolation": rope_interpolation, "encoding": name, "changes": changes,
    }
    return cfg, record


def extend(parent: str | Path, method: str, factor: int = 2, alpha: float | None = None,
           out: str | Path | None = None, tokens: int | None = None, rope_interpolation: bool = False,
           overrides: list[str] | None = None, resume: bool = False, progress: bool = True):
    """Create (or with ``resume`` continue) the extension run ``out``; returns train's TrainResult."""
    import torch

    from extrapos.model import Decoder
    from extrapos.train import train

    parent = Path(parent)
    out = Path(out) if out is not None else default_out(parent, method, factor, alpha)
    cfg, record = extension_config(parent, method, factor, alpha, tokens, rope_interpolation, overrides)
    init = out / "init" / "model.safetensors"
    if (out / "config.toml").is_file():
        if not resume:
            raise UserError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")
        saved = json.loads((out / "parent.json").read_text()) if (out / "parent.json").is_file() else {}
        if {k: saved.get(k) for k in ("parent", "method", "alpha", "factor")} != \
                {k: record[k] for k in ("parent", "method", "alpha", "factor")}:
            raise UserError(f"{out} extends {saved.get('parent')} with {saved.get('method')}; it is not this "
                            "extension. Choose another --out.")
        if (out / "config.toml").read_text() != cfg.to_toml():
            raise UserError(f"{out} was started with a different config; resume it with the same options.")
        return train(cfg, out, resume=True, progress=progress,
                     init_from=init if init.is_file() else record["checkpoint"])
    out.mkdir(parents=True, exist_ok=True)
    init_from: Path = Path(record["checkpoint"])
    if cfg.model.positions["name"] == "learned" and cfg.model.positions.get("max_length"):
        # resize the learned table: load the parent as it was, interpolate, save the initial weights
        from safetensors.torch import save_model

        pcfg = load_run_config(parent)
        model = Decoder(pcfg.model)
        ckpt_io.load_weights(model, init_from)
        if cfg.model.positions["max_length"] > model.pos.length:
            model.pos.extend_table(cfg.model.positions["max_length"])
        check = Decoder(cfg.model)
        if check.pos.table.shape != model.pos.table.shape:  # pragma: no cover - a config/table mismatch
            raise UserError("the resized learned table does not match the extension config.")
        init.parent.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            save_model(model, str(init.with_suffix(".tmp")))
        os.replace(init.with_suffix(".tmp"), init)
        init_from = init
    tmp = out / "parent.json.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, out / "parent.json")
    if progress:
        print(f"extrapos extend: {record['method']} x{factor} of {parent} (step {record['step']}): L_t "
              f"{record['train_length']} -> L_e {record['extended_length']}\n  " + "\n  ".join(record["changes"]),
              flush=True)
    return train(cfg, out, resume=False, progress=progress, init_from=init_from)


# ---- CLI -----------------------------------------------------------------------------------------

def register(sub) -> None:
    p = sub.add_parser("extend", help="extend a run's context to K x L_t (segmented-sequence training)",
                       description="Continue RUN's training at L_e = K x L_t with chunk / prefix / full / randompos "
                                   "sampling, or the continue control, on a compute-equivalent token budget.")
    p.add_argument("run", help="the run directory to extend")
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--alpha", type=float, default=None, help="segment fraction for chunk / prefix (default 0.25)")
    p.add_argument("--factor", type=int, default=2, help="L_e / L_t (default 2)")
    p.add_argument("--out", default=None, help="the new run directory (default: RUN-<method>-x<factor>)")
    p.add_argument("--tokens", type=int, default=None,
                   help="token budget instead of the compute-equivalent one (same for every method)")
    p.add_argument("--rope-interpolation", action="store_true", help="RoPE: add linear position interpolation")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the extension run (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted extension run in --out")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    result = extend(args.run, args.method, args.factor, args.alpha, args.out, args.tokens, args.rope_interpolation,
                    args.overrides, resume=args.resume, progress=not args.no_progress)
    print(f"done: {result.steps} steps, {result.tokens:,} tokens in {result.wall_time:.1f}s -> {result.run_dir}")
    return 0
