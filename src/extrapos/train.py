"""`extrapos train`: one loop for every encoding, from a laptop CPU to torchrun.

The loop is nanoGPT's, with what a practitioner expects around it: AdamW with weight decay on
matrices only, warmup + cosine/linear decay to an end learning rate, gradient accumulation to an
effective batch in tokens, clipping, bf16 autocast, optional torch.compile, periodic validation,
``metrics.jsonl`` + a progress bar, atomic checkpoints that resume exactly, and a clear stop on a
non-finite loss. Multi-process (torchrun) is data parallel: each rank reads its own shard of the
window order, rank 0 alone writes files.

Exact resume: the checkpoint holds weights, optimizer moments, the torch RNG (dropout) and the
sampler position; on resume ``metrics.jsonl`` is cut back to the checkpoint's step, so a run
killed at any point and resumed logs the same losses and ends with the same weights as one that
never stopped (fp32, CPU; tested by killing a real process).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from extrapos import checkpoint as ckpt_io
from extrapos.config import RunConfig, load_config, load_run_config
from extrapos.data.batch import Batch
from extrapos.errors import UserError
from extrapos.model import Decoder, count_parameters, flops_per_token
from extrapos.perf import matmul_peak_flops


class TrainingDiverged(UserError):
    """The loss became non-finite; the last good checkpoint is kept."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    final_loss: float
    val_loss: float | None
    wall_time: float


# ---- environment ---------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"train.device is {name!r} but no CUDA device is visible; use train.device=cpu.")
    return dev


def distributed_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(device: torch.device) -> tuple[int, int, torch.device]:
    rank, world, local_rank = distributed_env()
    if world > 1:
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


# ---- data ----------------------------------------------------------------------------------------

def prepare_run_data(cfg: RunConfig, progress: bool = True) -> Path:
    """The prepared data directory of a config: ``data.dir`` or the cache entry of corpus+tokenizer."""
    from extrapos.data import prepare_data

    if cfg.data.dir:
        path = Path(cfg.data.dir)
        if not (path / "manifest.json").is_file():
            raise UserError(f"data.dir {path} is not a prepared data directory; run `extrapos data prepare` first.")
        return path
    d = cfg.data
    return prepare_data(
        d.corpus, d.tokenizer, None, min_doc_tokens=d.min_doc_tokens, max_tokens=d.max_tokens,
        max_docs=d.max_docs, split_fractions=tuple(d.split_fractions), text_field=d.text_field,
        progress=progress,
    )


def build_sampler(cfg: RunConfig, split, batch_size: int, seed: int, rank: int = 0, world: int = 1):
    """The training example sampler the config names (see data/sampling.py and data/segmented.py)."""
    from extrapos.data import sampling

    name = cfg.data.sampler
    if name == "contiguous":
        return sampling.ContiguousSampler(split, cfg.seq_len, batch_size, seed=seed, rank=rank,
                                          world_size=world, packed=cfg.data.packed)
    # chunk | prefix | full | randompos: segmented sampling for context extension
    from extrapos.data.segmented import build_sampler as segmented_sampler

    return segmented_sampler(name, split, cfg, batch_size, seed=seed, rank=rank, world_size=world)


# ---- optimisation --------------------------------------------------------------------------------

def build_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norm gains, biases and scalar position params are not decayed)."""
    t = cfg.train
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, foreach=True)


def learning_rate(step: int, total: int, cfg: RunConfig) -> float:
    """Linear warmup to lr, then cosine / linear decay (or constant) to end_lr at the last step."""
    t = cfg.train
    warmup = int(round(t.warmup * total)) if t.warmup < 1 else int(t.warmup)
    if step < warmup:
        return t.lr * (step + 1) / warmup
    if t.schedule == "constant" or total <= warmup + 1:
        return t.lr
    progress = min(1.0, (step - warmup) / (total - warmup - 1))
    if t.schedule == "linear":
        return t.lr + (t.end_lr - t.lr) * progress
    return t.end_lr + 0.5 * (t.lr - t.end_lr) * (1 + math.cos(math.pi * progress))


def masked_loss_sum(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Sum of token cross-entropies over the loss mask (fp32)."""
    losses = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), reduction="none")
    return (losses * batch.loss_mask.flatten()).sum()


def plan(cfg: RunConfig, windows_per_epoch: int, world: int) -> tuple[int, int]:
    """(gradient accumulation steps, total optimizer steps) from the batch and budget settings."""
    t = cfg.train
    per_micro = t.batch_size * cfg.seq_len * world
    accum = max(1, round(t.batch_tokens / per_micro)) if t.batch_tokens else 1
    tokens_per_step = per_micro * accum
    if t.tokens is not None:
        total = math.ceil(t.tokens / tokens_per_step)
    elif t.epochs is not None:
        total = math.ceil(t.epochs * windows_per_epoch / (t.batch_size * accum * world))
    else:
        total = t.steps if t.steps is not None else 200
    return accum, max(1, total)


@torch.no_grad()
def validation_loss(model: nn.Module, cfg: RunConfig, split, device: torch.device) -> float | None:
    """Mean token loss on the first ``eval_batches`` batches of the validation split, in a fixed order."""
    from extrapos.data import sampling

    try:
        sampler = sampling.ContiguousSampler(split, cfg.seq_len, cfg.train.batch_size, seed=1234)
    except UserError:
        return None  # validation split too small for one window: nothing to report
    if sampler.windows_per_epoch == 0:
        return None
    n_batches = min(cfg.train.eval_batches, max(1, sampler.windows_per_epoch // cfg.train.batch_size))
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for _ in range(n_batches):
        b = sampler.next_batch().to(device)
        with autocast(device, cfg.train.precision):
            logits = model(b.tokens, b.positions)
        total += float(masked_loss_sum(logits, b))
        count += b.num_tokens
    model.train(was_training)
    return total / max(count, 1)


# ---- metrics -------------------------------------------------------------------------------------

class MetricsLog:
    """Append-only ``metrics.jsonl`` (rank 0), plus TensorBoard / W&B mirrors when asked for."""

    def __init__(self, run_dir: Path, cfg: RunConfig, enabled: bool):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.tb = self.wandb = None
        if not enabled:
            return
        if cfg.train.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UserError("train.tensorboard needs the tensorboard package: pip install tensorboard.") from None
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.train.wandb:
            try:
                import wandb
            except ImportError:
                raise UserError("train.wandb needs the wandb package: pip install wandb.") from None
            self.wandb = wandb.init(project=cfg.train.wandb, name=run_dir.name, config=cfg.to_dict(),
                                    dir=str(run_dir), resume="allow", id=run_dir.name)

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (they are replayed after a resume)."""
        if not (self.enabled and self.path.exists()):
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (json.JSONDecodeError, KeyError):
                break  # a line torn by a kill mid-write: everything after it is replayed
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        step = record["step"]
        if self.tb:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log({k: v for k, v in record.items() if k != "step"}, step=step)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- the run -------------------------------------------------------------------------------------

def run_is_complete(run_dir: Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file()


def _start_run_dir(run_dir: Path, cfg: RunConfig, resume: bool, is_main: bool) -> RunConfig:
    """Create RUN (fresh) or check it (resume); returns the config to use."""
    existing = (run_dir / "config.toml").is_file()
    if resume and existing:
        return load_run_config(run_dir)
    if existing:
        raise UserError(
            f"{run_dir} already holds a run; pass --resume to continue it or choose another --out."
        )
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / "config.toml.tmp"
        tmp.write_text(cfg.to_toml())
        os.replace(tmp, run_dir / "config.toml")
    return cfg


def train(
    cfg: RunConfig | None,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    init_from: str | Path | None = None,
) -> TrainResult:
    """Train ``cfg`` into ``run_dir``; ``resume`` continues from the latest checkpoint there.

    ``init_from``: a checkpoint directory whose weights initialise the model (context extension).
    """
    from extrapos.data import load_tokenizer, open_split

    run_dir = Path(run_dir)
    if cfg is None:
        if not (run_dir / "config.toml").is_file():
            raise UserError(f"{run_dir} holds no run to resume; start it with --config FILE_OR_PRESET.")
        cfg = load_run_config(run_dir)
    device = resolve_device(cfg.train.device)
    rank, world, device = init_distributed(device)
    is_main = rank == 0
    cfg = _start_run_dir(run_dir, cfg, resume, is_main)
    if resume and run_is_complete(run_dir):
        s = json.loads((run_dir / "summary.json").read_text())
        return TrainResult(run_dir, s["steps"], s["tokens"], s["final_loss"], s["val_loss"], s["wall_time"])
    t = cfg.train
    if t.threads and device.type == "cpu":
        torch.set_num_threads(t.threads)

    data_dir = prepare_run_data(cfg, progress=progress and is_main)
    tokenizer = load_tokenizer(data_dir)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise UserError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is {cfg.model.vocab_size}; "
            f"set model.vocab_size={tokenizer.vocab_size} or use a smaller tokenizer."
        )
    if is_main:
        tokenizer.save(run_dir)
        (run_dir / "data.json").write_text(json.dumps({"dir": str(Path(data_dir).resolve())}, indent=1))
    train_split = open_split(data_dir, "train")
    val_split = open_split(data_dir, "val")

    torch.manual_seed(t.seed)
    model = Decoder(cfg.model).to(device)
    if init_from is not None:
        ckpt_io.load_weights(model, Path(init_from))
    optimizer = build_optimizer(model, cfg)
    sampler = build_sampler(cfg, train_split, t.batch_size, seed=t.seed, rank=rank, world=world)
    if sampler.windows_per_epoch < t.batch_size * world:
        raise UserError(
            f"the training split has {sampler.windows_per_epoch} windows of {cfg.seq_len} tokens, fewer than one "
            f"batch ({t.batch_size * world}); use more data or a smaller train.batch_size."
        )
    accum, total_steps = plan(cfg, sampler.windows_per_epoch, world)
    tokens_per_step = t.batch_size * cfg.seq_len * accum * world

    start_step, elapsed_before, tokens_seen = 0, 0.0, 0
    last = ckpt_io.latest_checkpoint(run_dir) if resume else None
    metrics = MetricsLog(run_dir, cfg, enabled=is_main)
    if last is not None:
        state = last.state
        ckpt_io.load_weights(model, last)
        ckpt_io.load_optimizer(optimizer, last)
        ckpt_io.restore_rng(last)
        sampler.load_state_dict(state["sampler"])
        start_step, elapsed_before, tokens_seen = state["step"], state["elapsed"], state["tokens"]
        metrics.truncate_after(start_step)
    elif resume:
        metrics.truncate_after(-1)  # killed before its first checkpoint: start over cleanly
        if is_main:
            _remove_summary(run_dir)

    train_model: nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if t.compile:
        train_model = torch.compile(train_model)

    n_params = count_parameters(model)
    flops_token = flops_per_token(cfg.model, cfg.seq_len)
    peak = matmul_peak_flops(str(device), t.precision) if is_main else 0.0
    if is_main and start_step == 0:
        print(f"extrapos train: {n_params['total'] / 1e6:.2f}M parameters, encoding "
              f"{cfg.model.positions['name']}, {total_steps} steps x {tokens_per_step} tokens "
              f"(accumulation {accum}) on {device} in {t.precision}", flush=True)

    def save(step: int, loss: float) -> None:
        if is_main:
            path = ckpt_io.save_checkpoint(
                run_dir, step, model, optimizer,
                {"sampler": sampler.state_dict(), "elapsed": elapsed_before + (time.perf_counter() - t_start),
                 "tokens": tokens_seen, "loss": loss, "config": cfg.to_dict()},
                keep=t.keep_checkpoints,
            )
            _say(f"checkpoint saved: {path}")
        if world > 1:
            torch.distributed.barrier()

    bar = _progress(total_steps, start_step, enabled=progress and is_main)
    model.train()
    t_start = time.perf_counter()
    loss_value, val_loss = float("nan"), None
    for step in range(start_step, total_steps):
        t_step = time.perf_counter()
        lr = learning_rate(step, total_steps, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batches = [sampler.next_batch().to(device) for _ in range(accum)]
        n_tokens = torch.tensor(float(sum(b.num_tokens for b in batches)), device=device)
        if world > 1:
            torch.distributed.all_reduce(n_tokens)
        n_tokens = n_tokens * 1.0 / world  # DDP averages gradients over ranks
        step_loss = torch.zeros((), device=device)
        for i, b in enumerate(batches):
            sync = nullcontext() if (world == 1 or i == accum - 1) else train_model.no_sync()
            with sync, autocast(device, t.precision):
                logits = train_model(b.tokens, b.positions)
                loss = masked_loss_sum(logits, b) / n_tokens
            loss.backward()
            step_loss += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip if t.grad_clip > 0 else float("inf"))
        if world > 1:
            torch.distributed.all_reduce(step_loss)
            step_loss /= world
        loss_value = float(step_loss)
        if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
            bar.close()
            last_good = ckpt_io.latest_checkpoint(run_dir)
            where = f"the last good checkpoint is {last_good.path}" if last_good else "no checkpoint was written yet"
            raise TrainingDiverged(
                f"the loss became non-finite ({loss_value}) at step {step + 1}; {where}; "
                "lower train.lr or use train.precision=fp32."
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += tokens_per_step
        done = step + 1
        dt = time.perf_counter() - t_step
        tok_s = tokens_per_step / dt
        if is_main and (done % t.log_every == 0 or done == total_steps or done == 1):
            metrics.log({
                "step": done, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm),
                "tokens": tokens_seen, "tokens_per_s": tok_s,
                "mfu": flops_token * tok_s / peak if peak else None,
                "elapsed": elapsed_before + time.perf_counter() - t_start,
            })
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tok_s:,.0f}")
        if t.eval_every and done % t.eval_every == 0 and done != total_steps:
            val_loss = validation_loss(model, cfg, val_split, device)
            if val_loss is not None:
                metrics.log({"step": done, "val_loss": val_loss})
        if t.checkpoint_every and done % t.checkpoint_every == 0 and done != total_steps:
            save(done, loss_value)
    bar.close()

    val_loss = validation_loss(model, cfg, val_split, device)
    if val_loss is not None:
        metrics.log({"step": total_steps, "val_loss": val_loss})
    if start_step < total_steps or last is None:
        save(total_steps, loss_value)
    wall = elapsed_before + time.perf_counter() - t_start
    result = TrainResult(run_dir, total_steps, tokens_seen, loss_value, val_loss, wall)
    if is_main:
        summary = {"steps": total_steps, "tokens": tokens_seen, "final_loss": loss_value, "val_loss": val_loss,
                   "wall_time": wall, "parameters": n_params, "encoding": cfg.model.positions["name"]}
        tmp = run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, run_dir / "summary.json")
    metrics.close()
    return result


def _say(message: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(message, file=sys.stdout)
    sys.stdout.flush()


def _remove_summary(run_dir: Path) -> None:
    (run_dir / "summary.json").unlink(missing_ok=True)


def _progress(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True)


# ---- CLI -----------------------------------------------------------------------------------------

def register(sub) -> None:
    p = sub.add_parser("train", help="train a language model with a positional encoding",
                       description="Train a model from a TOML config or a preset (e.g. cpu/tiny).")
    p.add_argument("--config", default=None, help="a .toml file or a preset name (see `extrapos presets`)")
    p.add_argument("--data", default=None, help="a prepared data directory (default: the preset's corpus)")
    p.add_argument("--out", default=None, help="run directory (default: runs/<config name>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cli)

    ps = sub.add_parser("presets", help="list the shipped config presets")
    ps.set_defaults(func=lambda args: print("\n".join(__import__("extrapos.config", fromlist=["x"]).preset_names())))


def _cli(args) -> int:
    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.dir={json.dumps(str(args.data))}")
    out = Path(args.out) if args.out else Path("runs") / (Path(args.config).stem if args.config else "default")
    if args.resume and not args.config:
        cfg = None  # the run's own config.toml
    else:
        cfg = load_config(args.config, overrides)
    result = train(cfg, out, resume=args.resume, progress=not args.no_progress)
    val = f", validation loss {result.val_loss:.4f}" if result.val_loss is not None else ""
    print(f"done: {result.steps} steps, {result.tokens:,} tokens in {result.wall_time:.1f}s, "
          f"final loss {result.final_loss:.4f}{val} -> {result.run_dir}")
    return 0
