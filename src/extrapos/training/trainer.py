"""`extrapos train`: one loop for every encoding, from a laptop CPU to torchrun.

The loop is nanoGPT's, with what a practitioner expects around it: AdamW with weight decay on
matrices only, warmup + cosine/linear decay to an end learning rate, gradient accumulation to an
effective batch in tokens, clipping, bf16 autocast, optional torch.compile, periodic validation,
``metrics.jsonl`` + a progress bar, atomic checkpoints that resume exactly, and a clear stop on a
non-finite loss. It runs in stages (``Trainer``): build or resume, ``train_step`` once per optimizer
step, the periodic work (log, validate, checkpoint), finish. Multi-process (torchrun) is data
parallel, DDP or FSDP2 (``train.parallel``, run/parallelize.py): each rank reads its own share of the
global window order, rank 0 alone writes files, and checkpoints have the single-process format.
How exact resume works is described in docs/architecture.md.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from extrapos.console import ABOVE_BARS
from extrapos.data.batch import Batch
from extrapos.data.mlm import objective_sampler
from extrapos.errors import UserError
from extrapos.files import atomic_write, ensure_writable_dir, sweep_temporaries
from extrapos.losses import model_loss_sum
from extrapos.model import Decoder, count_parameters, flops_per_token
from extrapos.run import checkpoint as ckpt_io
from extrapos.run.config import RunConfig
from extrapos.run.lock import RunLock
from extrapos.run.metrics import MetricsLog, read_metrics
from extrapos.run.parallelize import Parallel
from extrapos.run.perf import matmul_peak_flops
from extrapos.run.precision import with_resolved_precision
from extrapos.run.runtime import (
    autocast,
    barrier,
    build_sampler,
    coverage_note,
    distributed_env,
    prepare_run_data,
    resolve_device,
    step_plan,
    trains_on_answers,
    warn_slow_bf16,
)
from extrapos.training.determinism import deterministic_kernels
from extrapos.training.held import HeldChanges
from extrapos.training.placement import Placement
from extrapos.training.start import (
    Kind,
    RunDirectoryFacts,
    checkpoint_to_resume,
    decide,
    run_is_complete,
    saved_checkpoint_every,
)

if TYPE_CHECKING:
    from extrapos.data.shards import TokenSplit

logger = logging.getLogger(__name__)

__all__ = ["TrainResult", "Trainer", "TrainingDiverged", "read_metrics", "run_is_complete", "train"]


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

    @classmethod
    def from_summary(cls, run_dir: Path) -> TrainResult:
        s = json.loads((run_dir / "summary.json").read_text())
        return cls(run_dir, s["steps"], s["tokens"], s["final_loss"], s["val_loss"], s["wall_time"])


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    lr: float
    seconds: float


# ---- optimisation --------------------------------------------------------------------------------


def build_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norm gains, biases and scalar position params are not
    decayed)."""
    t = cfg.train
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel for every parameter's update (CPU too), instead of a dozen foreach passes
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=True)


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


@torch.no_grad()
def validation_loss(
    model: nn.Module, cfg: RunConfig, split: TokenSplit, device: torch.device
) -> float | None:
    """Mean token loss on the first ``eval_batches`` batches of the validation split, in a fixed order: over
    the tokens the training loss counts (a synthetic task's answers, a text's every token)."""
    from extrapos.data import sampling, synthetic

    try:
        d = cfg.data
        if trains_on_answers(cfg, split):
            # the answers of whole examples, as the training sampler reads them: every token of windows
            # across examples would score the random haystack, whose loss says nothing about the task
            # and reads as if the model had overfitted
            sampler: Any = synthetic.SyntheticSampler(split, cfg.seq_len, cfg.train.batch_size, seed=1234)
        else:  # a packed run is validated on packed windows of the same kind
            sampler = sampling.ContiguousSampler(
                split,
                cfg.seq_len,
                cfg.train.batch_size,
                seed=1234,
                packed=d.packed and d.sampler == "contiguous",
                document_mask=d.document_mask and d.sampler == "contiguous",
                document_positions=d.document_positions if d.sampler == "contiguous" else "continue",
            )
    except UserError:
        return None  # validation split too small for one window: nothing to report
    if sampler.windows_per_epoch == 0:
        return None
    # validation masks BERT's 15% whatever train.mask_rate is, so its loss compares across runs and with eval
    sampler = objective_sampler(cfg.train.objective, sampler, model_vocab_size=cfg.model.vocab_size)
    n_batches = min(cfg.train.eval_batches, max(1, sampler.windows_per_epoch // cfg.train.batch_size))
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for _ in range(n_batches):
        b = sampler.next_batch().to(device)
        with autocast(device, cfg.train.precision):
            logits = model(b.tokens, b.positions, documents=b.documents)
        total += float(masked_loss_sum(logits, b))
        count += b.num_tokens
    model.train(was_training)
    return total / max(count, 1)


# ---- the run -------------------------------------------------------------------------------------


def train(
    cfg: RunConfig | None,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    init_from: str | Path | None = None,
    before_start: Callable[[], None] | None = None,
) -> TrainResult:
    """Train ``cfg`` into ``run_dir``; ``resume`` continues from the latest intact checkpoint there.
    ``before_start`` is called on the main process once every check has passed, just before the first
    step (``extend`` prints its plan there, so a refused config is one sentence and nothing else).

    ``cfg`` None with ``resume`` means the run's own saved config; a given ``cfg`` may change only
    the budget and logging keys of a saved run (``RESUMABLE_KEYS``). ``init_from``: a checkpoint
    directory whose weights initialise the model (context extension). Everything is checked before
    the run directory is created or changed.
    """
    run_dir = Path(run_dir)
    device = None
    if cfg is not None:  # "auto" becomes what it picks here before a saved run's config is compared with it
        device = resolve_device(cfg.train.device)
        cfg, note = with_resolved_precision(cfg, device)
        if note and distributed_env()[0] == 0:
            _say(f"extrapos train: {note}")
    start = decide(RunDirectoryFacts(run_dir), cfg, resume)
    if start.kind is Kind.REFUSE:
        raise UserError(start.refusal)
    assert start.cfg is not None
    cfg = start.cfg
    if device is None:  # a resume with the run's own config: its device and precision, resolved once here
        device = resolve_device(cfg.train.device)
        cfg = with_resolved_precision(cfg, device)[0]
    placement = Placement.join(cfg, device)  # the parallel plan is checked here, before anything is written
    is_main = placement.is_main
    barrier()  # under torchrun: every process has looked at run_dir before rank 0 writes into it
    if is_main:
        ensure_writable_dir(run_dir, "the run")
    with RunLock(run_dir, enabled=is_main):
        if is_main:  # a killed run's temporary files and folders: no one else writes here
            sweep_temporaries(run_dir)
        restore_from = None
        if start.kind is Kind.RESUME:
            restore_from = checkpoint_to_resume(
                run_dir, saved_checkpoint_every(run_dir), say=_say_warning if is_main else lambda _: None
            )
        if start.kind is Kind.RESTART and is_main:
            logger.info(f"extrapos train: {run_dir} stopped before its first checkpoint; starting it over.")
        if start.changes and is_main:  # config.toml and summary.json change once the Trainer's checks pass
            logger.info("extrapos train: resuming with " + ", ".join(start.changes))
        if start.kind is Kind.COMPLETE:
            result = TrainResult.from_summary(run_dir)
        else:
            with deterministic_kernels(cfg.train.deterministic):  # torch's setting restored after the run
                trainer = Trainer(
                    cfg,
                    run_dir,
                    resume=start.resume,
                    progress=progress,
                    init_from=init_from,
                    restore_from=restore_from,
                    before_start=before_start,
                    placement=placement,
                )
                result = trainer.run()
    barrier()  # every process returns once the run is complete on disk (compare reads it next)
    return result


class Trainer:
    """One training run in stages: build (or resume) -> ``train_step`` per optimizer step -> periodic
    work (log, validate, checkpoint) -> ``finish``."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        device: torch.device | None = None,
        rank: int = 0,
        world: int = 1,
        resume: bool = False,
        progress: bool = True,
        init_from: str | Path | None = None,
        restore_from: ckpt_io.Checkpoint | None = None,
        parallel: Parallel | None = None,
        before_start: Callable[[], None] | None = None,
        placement: Placement | None = None,
    ):
        """``placement``: the device, process group, precision and parallel plan ``train`` resolved (its
        config is then ``placement.cfg``, which ``cfg`` is); a direct caller gives ``device`` (with
        ``rank``, ``world``, and ``parallel`` when it has checked one) and they are resolved here, once.
        ``before_start``: see ``train``."""
        if placement is None:
            if device is None:
                raise TypeError("Trainer needs a device or a Placement")
            placement = Placement.given(cfg, device, rank, world, parallel)
        self.before_start = before_start
        self.placement = placement
        cfg, device, rank, world = placement.cfg, placement.device, placement.rank, placement.world
        self.cfg, self.run_dir, self.device, self.rank, self.world = cfg, run_dir, device, rank, world
        self.is_main = placement.is_main
        self.progress = progress and self.is_main
        t = cfg.train
        parallel = placement.parallel
        if t.threads and device.type == "cpu":
            torch.set_num_threads(t.threads)
        warn_slow_bf16(device, t.precision)
        # everything that can fail on the user's input is checked before the run directory is written
        tokenizer, data_dir, self.train_split, self.val_split = self._open_data()
        self.sampler = build_sampler(cfg, self.train_split, t.batch_size, seed=t.seed, rank=rank, world=world)
        self.coverage = (
            coverage_note(self.sampler, cfg.seq_len) if hasattr(self.sampler, "coverage") else None
        )
        # objective mlm: masked batches, the encoder's special tokens added to the run's tokenizer
        self.sampler = objective_sampler(
            t.objective, self.sampler, tokenizer, cfg.model.vocab_size, mask_rate=t.mask_rate
        )
        if self.sampler.windows_per_epoch < t.batch_size * world:
            raise UserError(
                f"the training split has {self.sampler.windows_per_epoch} windows of {cfg.seq_len} tokens, "
                f"fewer than one batch ({t.batch_size * world}); use more data or a smaller train.batch_size."
            )
        self.plan = step_plan(cfg, self.sampler.windows_per_epoch, world)
        self.restore_from = restore_from
        if restore_from is not None and restore_from.step > self.plan.total_steps:
            raise UserError(
                f"{run_dir} is already at step {restore_from.step}, past the {self.plan.total_steps} steps "
                "of the asked budget; --resume continues a run and never shortens it, so ask for at least "
                f"{restore_from.step} steps (e.g. --set train.steps={restore_from.step}) or start a new run "
                "with another --out."
            )
        # a finished run trained further keeps its summary, config.toml and log until the first new
        # checkpoint is written (training.held): a continuation that fails before changes nothing
        finished = resume and run_is_complete(run_dir)
        if self.is_main:
            self._write_run_files(tokenizer, data_dir, config=not finished)

        torch.manual_seed(t.seed)  # the model's initialisation; the samplers draw from their own seeds
        self.model = Decoder(cfg.model).to(device)
        if init_from is not None:
            ckpt_io.load_weights(self.model, Path(init_from))
        # FSDP2 replaces the parameters by shards, so the optimizer is built after it, and restored after both
        self.parallel = parallel.wrap(self.model)
        self.optimizer = build_optimizer(self.model, cfg)
        self.metrics = MetricsLog(run_dir, cfg, enabled=self.is_main, hold=finished)
        self.held = HeldChanges(run_dir, cfg.to_toml(), self.metrics) if finished and self.is_main else None
        self.start_step, self.elapsed_before, self.tokens_seen = 0, 0.0, 0
        self.resumed_from = self._restore() if resume else None
        self.flops_per_token = flops_per_token(cfg.model, cfg.seq_len)
        self.peak_flops = matmul_peak_flops(str(device), t.precision) if self.is_main else 0.0
        self.t_start = time.perf_counter()

    # ---- build ------------------------------------------------------------------------------

    def _open_data(self) -> tuple[Any, Path, TokenSplit, TokenSplit]:
        """Prepare (or reuse) the run's data and check that the tokenizer fits the model."""
        from extrapos.data import load_tokenizer, open_split

        cfg = self.cfg
        data_dir = prepare_run_data(cfg, progress=self.progress)
        tokenizer = load_tokenizer(data_dir)
        if tokenizer.vocab_size > cfg.model.vocab_size:
            raise UserError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
                f"{cfg.model.vocab_size}; "
                f"set model.vocab_size={tokenizer.vocab_size} or use a smaller tokenizer."
            )
        train_split, val_split = open_split(data_dir, "train"), open_split(data_dir, "val")
        longest = int(val_split.doc_lengths.max(initial=0))
        if self.is_main and longest < cfg.seq_len + 1 and not cfg.data.packed:
            logger.warning(
                f"extrapos: warning: no validation document holds one window of {cfg.seq_len + 1} tokens "
                "(the "
                f"longest has {longest}), so this run reports no validation loss; prepare the data with "
                'data.split_rule = "within" or a larger validation fraction to get one.'
            )
        return tokenizer, data_dir, train_split, val_split

    def _write_run_files(self, tokenizer: Any, data_dir: Path, config: bool = True) -> None:
        """config.toml (unless ``config`` is False: a finished run's, written by ``HeldChanges``), the
        tokenizer and data.json: written atomically, and only when they change."""
        import tempfile

        if config:
            atomic_write(self.run_dir / "config.toml", self.cfg.to_toml())
        with tempfile.TemporaryDirectory(dir=self.run_dir, prefix=".tokenizer-") as tmp:
            tokenizer.save(tmp)
            for f in sorted(Path(tmp).iterdir()):
                atomic_write(self.run_dir / f.name, f.read_bytes())
        atomic_write(self.run_dir / "data.json", json.dumps({"dir": str(Path(data_dir).resolve())}, indent=1))

    def _restore(self) -> ckpt_io.Checkpoint | None:
        """Continue from the latest checkpoint: weights, optimizer moments, RNG, data position, log."""
        last = self.restore_from or ckpt_io.latest_intact(self.run_dir, say=_say_warning)
        if last is None:  # killed before its first checkpoint: start over cleanly
            self.metrics.truncate_after(-1)
            if self.held is not None:  # a direct caller's finished run without a checkpoint
                self.held.publish()
            return None
        state = last.state
        self.parallel.load_state(self.optimizer, last)
        ckpt_io.restore_rng(last)
        self.sampler.load_state_dict(state["sampler"])
        saved_world = state["sampler"].get("world_size", 1)
        if saved_world != self.world and self.is_main:
            _say(
                f"extrapos train: resuming a checkpoint of {saved_world} process(es) on {self.world}; the "
                "data "
                f"stream continues where it stopped, {self.plan.tokens_per_step} tokens per step."
            )
        self.start_step, self.elapsed_before, self.tokens_seen = (
            state["step"],
            state["elapsed"],
            state["tokens"],
        )
        self.metrics.truncate_after(self.start_step)
        if self.is_main:
            ckpt_io.prune_checkpoints(self.run_dir, self.cfg.train.keep_checkpoints)
        return last

    # ---- one optimizer step -----------------------------------------------------------------

    def train_step(self, step: int) -> StepStats:
        """Micro-batches to one optimizer step; the loss is the token mean over all of them (and ranks)."""
        t_step = time.perf_counter()
        cfg, device, world, accum = self.cfg, self.device, self.world, self.plan.accumulation
        lr = learning_rate(step, self.plan.total_steps, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches = [self.sampler.next_batch().to(device) for _ in range(accum)]
        n_tokens = torch.tensor(float(sum(b.num_tokens for b in batches)), device=device)
        if world > 1:
            torch.distributed.all_reduce(n_tokens)
        n_tokens = n_tokens * 1.0 / world  # DDP and FSDP2 average gradients over ranks
        step_loss = torch.zeros((), device=device)
        for i, b in enumerate(batches):
            # gradients are reduced across processes once per step, on the last micro-batch
            with self.parallel.gradient_sync(enabled=i == accum - 1), autocast(device, cfg.train.precision):
                # the forward computes the loss (fused with the head, losses.py), wrapped or not
                masked = {} if b.documents is None else {"documents": b.documents}  # a document mask
                loss = (
                    model_loss_sum(
                        self.parallel.stepped, b.tokens, b.positions, b.targets, b.loss_mask, **masked
                    )
                    / n_tokens
                )
            loss.backward()
            step_loss += loss.detach()
        clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if world > 1:
            torch.distributed.all_reduce(step_loss)
            step_loss /= world
        loss_value = float(step_loss)
        if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
            last_good = ckpt_io.latest_checkpoint(self.run_dir)
            where = (
                f"the last good checkpoint is {last_good.path}"
                if last_good
                else "no checkpoint was written yet"
            )
            raise TrainingDiverged(
                f"the loss became non-finite ({loss_value}) at step {step + 1}; {where}; "
                "lower train.lr or use train.precision=fp32."
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss_value, float(grad_norm), lr, time.perf_counter() - t_step)

    # ---- periodic work ----------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t_start

    def after_step(self, done: int, stats: StepStats) -> None:
        """Log, validate and checkpoint at their intervals (the last step is the caller's: ``finish``)."""
        t, total = self.cfg.train, self.plan.total_steps
        tok_s = self.plan.tokens_per_step / stats.seconds
        if self.is_main and (done % t.log_every == 0 or done == total or done == 1):
            self.metrics.log(
                {
                    "step": done,
                    "loss": stats.loss,
                    "lr": stats.lr,
                    "grad_norm": stats.grad_norm,
                    "tokens": self.tokens_seen,
                    "tokens_per_s": tok_s,
                    "mfu": self.flops_per_token * tok_s / self.peak_flops if self.peak_flops else None,
                    "elapsed": self.elapsed(),
                }
            )
        if t.eval_every and done % t.eval_every == 0 and done != total:
            val_loss = validation_loss(self.model, self.cfg, self.val_split, self.device)
            if val_loss is not None:
                self.metrics.log({"step": done, "val_loss": val_loss})
        if t.checkpoint_every and done % t.checkpoint_every == 0 and done != total:
            self.save(done, stats.loss)

    def save(self, step: int, loss: float, val_loss: float | None = None) -> None:
        # shards are gathered by every process (a collective) into one full state on rank 0
        gathered = self.parallel.gather_state(self.optimizer)
        if self.is_main:
            extra = {"val_loss": val_loss} if step == self.plan.total_steps else {}
            path = ckpt_io.save_checkpoint(
                self.run_dir,
                step,
                gathered or self.model,
                None if gathered else self.optimizer,
                {
                    "sampler": self.sampler.state_dict(),
                    "elapsed": self.elapsed(),
                    "tokens": self.tokens_seen,
                    "loss": loss,
                    "config": self.cfg.to_dict(),
                    **extra,
                },
                keep=self.cfg.train.keep_checkpoints,
                before_publish=self.held.publish if self.held is not None else None,
            )
            _say(f"checkpoint saved: {path}")
        if self.world > 1:
            torch.distributed.barrier()

    # ---- the whole run ----------------------------------------------------------------------

    def announce(self) -> None:
        if self.before_start is not None:
            self.before_start()
        cfg, plan = self.cfg, self.plan
        n_params = count_parameters(self.model)
        logger.info(
            f"extrapos train: {n_params['total'] / 1e6:.2f}M parameters, encoding "
            f"{cfg.model.positions_plan().name}, {plan.total_steps} steps x {plan.tokens_per_step} tokens "
            f"(accumulation {plan.accumulation}) on {self.device} in {cfg.train.precision}"
        )
        if self.coverage is not None:
            text, low = self.coverage
            if low:
                logger.warning(f"extrapos: warning: {text}.")
            else:
                logger.info(f"extrapos train: {text}.")

    def run(self) -> TrainResult:
        total = self.plan.total_steps
        if self.is_main and self.start_step == 0:
            self.announce()
        bar = _progress(total, self.start_step, enabled=self.progress)
        self.model.train()
        self.t_start = time.perf_counter()
        loss = float("nan")
        try:
            for step in range(self.start_step, total):
                stats = self.train_step(step)
                loss = stats.loss
                self.tokens_seen += self.plan.tokens_per_step
                self.after_step(step + 1, stats)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.plan.tokens_per_step / stats.seconds:,.0f}")
        finally:
            bar.close()
        return self.finish(loss)

    def finish(self, loss: float) -> TrainResult:
        """Validate, write the final checkpoint and ``summary.json`` (which marks the run complete).

        A run killed after its final checkpoint but before ``summary.json`` resumes here with no
        step to take: its loss and validation loss come from that checkpoint, nothing is logged twice.
        """
        total = self.plan.total_steps
        last = self.resumed_from
        if last is not None and self.start_step >= total:
            loss = last.state["loss"]
        if last is not None and self.start_step >= total and "val_loss" in last.state:
            val_loss = last.state["val_loss"]
        else:
            val_loss = validation_loss(self.model, self.cfg, self.val_split, self.device)
            if val_loss is not None:
                self.metrics.log({"step": total, "val_loss": val_loss})
        if self.start_step < total or last is None:
            self.save(total, loss, val_loss)
        wall = self.elapsed()
        if self.is_main:
            summary = {
                "steps": total,
                "tokens": self.tokens_seen,
                "final_loss": _finite(loss),
                "val_loss": _finite(val_loss),
                "wall_time": wall,
                "parameters": count_parameters(self.model),
                "encoding": self.cfg.model.positions_plan().name,
            }
            atomic_write(self.run_dir / "summary.json", json.dumps(summary, indent=1, allow_nan=False))
        self.metrics.close()
        return TrainResult(self.run_dir, total, self.tokens_seen, loss, val_loss, wall)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _say(message: str) -> None:
    """A line said during training: written above the progress bar by the command's console."""
    logger.info(message, extra=ABOVE_BARS)


def _say_warning(message: str) -> None:
    logger.warning(message, extra=ABOVE_BARS)


def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True)
