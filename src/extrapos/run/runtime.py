"""What every command needs around a model: device, processes, precision, data and the step plan.

train, eval, extend, bench and compare all read these from one place, so a rule (how many
micro-batches make a step, which data a run uses, what bf16 means) is written once.
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from extrapos.errors import UserError
from extrapos.run.config import RunConfig

if TYPE_CHECKING:
    from extrapos.data.sampling import ContiguousSampler
    from extrapos.data.shards import TokenSplit

logger = logging.getLogger(__name__)

# ---- device and processes ------------------------------------------------------------------------


def resolve_device(name: str, flag: str = "train.device") -> torch.device:
    """The device ``name`` stands for ("auto": CUDA when present, else the CPU); ``flag`` is where the
    caller's user wrote it (``train.device`` for a config, ``--device`` for a command line), so the
    error names what to change."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"{flag} {name!r} is not a device; {_device_fix(flag)}.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{flag} is {name!r} but no CUDA device is visible; {_device_fix(flag)}.")
    return dev


def _device_fix(flag: str) -> str:
    if flag.startswith("--"):
        return f"pass {flag} cpu (or auto)"
    return f"set {flag}=cpu (or auto)"


def distributed_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(device: torch.device) -> tuple[int, int, torch.device]:
    """Join torchrun's process group (NCCL on CUDA, gloo on CPU); one process needs nothing."""
    rank, world, local_rank = distributed_env()
    if world > 1:
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def process_group() -> tuple[int, int]:
    """(rank, world size) of the torchrun group this process has joined; (0, 1) outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Wait until every process of the group gets here; nothing outside a group."""
    if process_group()[1] > 1:
        import torch.distributed as dist

        dist.barrier()


class Shard:
    """Jobs dealt out to the processes of a group, and their per-job outcomes summed back.

    Job n (numbered across calls, so that many small sets of jobs still spread) belongs to rank
    n % world. A process fills the outcomes of its own jobs and leaves zeros elsewhere; ``sum``
    adds the processes' tensors, which is exact when every entry was written by one process. One
    process (world 1) takes every job and ``sum`` returns its tensor unchanged.
    """

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | str = "cpu"):
        self.rank, self.world, self.device, self.next_job = rank, world, torch.device(device), 0

    @classmethod
    def of_group(cls, device: torch.device | str = "cpu") -> Shard:
        """The group this process has joined (NCCL reduces tensors on ``device``, gloo CPU ones)."""
        rank, world = process_group()
        return cls(rank, world, device)

    def take(self) -> bool:
        """Whether the next job is this process's."""
        mine = self.next_job % self.world == self.rank
        self.next_job += 1
        return mine

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return t
        import torch.distributed as dist

        summed = t.to(self.device)
        dist.all_reduce(summed)
        return summed.cpu()


def autocast(device: torch.device, precision: str) -> torch.autocast | nullcontext[None]:
    """bf16 autocast for ``precision == "bf16"``, else nothing (fp32)."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


# ---- data ----------------------------------------------------------------------------------------


def prepare_run_data(cfg: RunConfig, progress: bool = True, run_dir: str | Path | None = None) -> Path:
    """The prepared data directory of a config: ``data.dir`` or the cache entry of corpus+tokenizer.

    With ``run_dir`` (the config is that run's), a tokenizer file is the run's own saved copy: an imported
    run records its tokenizer relative to the run (older imports an absolute path, which may since name
    another model's tokenizer), and the data found or prepared must hold that tokenizer's hash."""
    from extrapos.data import prepare_data

    d = cfg.data
    own = run_tokenizer_file(run_dir) if run_dir is not None else None
    spec = d.tokenizer
    if run_dir is not None and is_file_spec(spec):
        spec = str(own.resolve()) if own is not None else str(Path(run_dir) / spec)
    elif _run_relative(spec) and not d.dir:
        raise UserError(
            f"data.tokenizer {spec!r} is the tokenizer file of the run this config was saved in (an import "
            f"records it relative to the run); set data.tokenizer to that run's {spec} with its path, or "
            "continue from the run itself (extrapos extend RUN)."
        )
    if d.dir:
        path = Path(d.dir)
        if not (path / "manifest.json").is_file():
            raise UserError(
                f"data.dir {path} is not a prepared data directory; run `extrapos data prepare` first."
            )
    else:
        # unset split keys keep the call (and so the cache key) of runs saved before they existed
        split = {k: v for k, v in (("split_rule", d.split_rule), ("split_gap", d.split_gap)) if v is not None}
        path = prepare_data(
            d.corpus,
            spec,
            None,
            min_doc_tokens=d.min_doc_tokens,
            max_tokens=d.max_tokens,
            max_docs=d.max_docs,
            split_fractions=tuple(d.split_fractions),
            text_field=d.text_field,
            progress=progress,
            **split,
        )
    if own is not None and run_dir is not None:  # (own is only found in a run_dir)
        from extrapos.data import load_tokenizer

        check_data_tokenizer(path, load_tokenizer(own).hash, run_dir, "set data.dir = DIR")
    return path


def is_file_spec(spec: str) -> bool:
    """Whether a ``data.tokenizer`` spec names a tokenizer file (not ``bpe:N``, a named tokenizer such as
    ``gpt2``, or ``synthetic``)."""
    from extrapos.data.named_tokenizers import NAMED_TOKENIZERS
    from extrapos.data.tokenizer import is_trained_spec

    s = str(spec).strip()
    return not (is_trained_spec(s) or s in NAMED_TOKENIZERS or s == "synthetic")


def _run_relative(spec: str) -> bool:
    """A bare tokenizer file name (``tokenizer.json``) that is not in the current directory: as an import
    records it, relative to the run, read here from a config without its run."""
    from extrapos.data.tokenizer import TOKENIZER_FILES

    return str(spec).strip() in TOKENIZER_FILES and not Path(str(spec).strip()).is_file()


def run_tokenizer_file(run_dir: str | Path) -> Path | None:
    """The tokenizer file a run directory holds (train and import save it there), or None."""
    from extrapos.data.tokenizer import TOKENIZER_FILES

    return next((Path(run_dir) / n for n in TOKENIZER_FILES if (Path(run_dir) / n).is_file()), None)


def check_data_tokenizer(data_dir: str | Path, tokenizer_hash: str, run_dir: str | Path, use: str) -> None:
    """Refuse prepared data tokenized with another tokenizer than the run's (its ids would be scored, or
    trained on, as the wrong tokens): the manifest records the hash of the tokenizer that wrote it. ``use``
    says where the user passes the right directory ("pass DIR as --data")."""
    from extrapos.data.shards import read_manifest

    found = read_manifest(data_dir)["tokenizer"].get("hash")
    if found != tokenizer_hash and not _encoder_tokenizer_of(data_dir, tokenizer_hash):
        own = run_tokenizer_file(run_dir) or Path(run_dir) / "tokenizer.json"
        raise UserError(
            f"{data_dir} was prepared with another tokenizer (hash {found}) than the run {run_dir} "
            f"(hash {tokenizer_hash}), so its token ids would be read as other tokens; prepare the "
            f"corpus with the run's tokenizer (extrapos data prepare --corpus CORPUS --tokenizer {own} "
            f"--out DIR), then {use}."
        )


def _encoder_tokenizer_of(data_dir: str | Path, tokenizer_hash: str) -> bool:
    """Whether the run's tokenizer is the data's with an encoder's special tokens appended ([CLS], [SEP],
    [MASK], [PAD] after the last id, as masked-LM training adds them): the data's ids mean the same."""
    from extrapos.data import load_tokenizer
    from extrapos.data.mlm import encoder_special_tokens

    try:
        tokenizer = load_tokenizer(data_dir)
        encoder_special_tokens(tokenizer)
    except (UserError, OSError, ValueError):
        return False
    return tokenizer.hash == tokenizer_hash


#: below this share of the train split's tokens reached by an epoch of windows, a run says so
LOW_COVERAGE = 0.5


def coverage_note(sampler: ContiguousSampler, seq_len: int) -> tuple[str, bool]:
    """One sentence on the share of the split's tokens an epoch of ``sampler`` predicts, and whether it is
    low enough to warn (unpacked windows skip every document shorter than the window)."""
    reached, total = sampler.coverage()
    share = reached / max(total, 1)
    text = f"an epoch of {seq_len}-token windows predicts {share:.1%} of the train split's {total:,} tokens"
    if share >= LOW_COVERAGE:
        return text, False
    return (
        f"{text}: documents shorter than {seq_len + 1} tokens are never seen; set data.packed = true to "
        "lay documents end to end (data.document_mask = true keeps attention inside each)",
        True,
    )


def trains_on_answers(cfg: RunConfig, split: TokenSplit) -> bool:
    """Whether ``cfg`` trains on ``split``'s synthetic examples, the loss on their answers only
    (``SyntheticSampler``), rather than on windows of its tokens: training and validation read it alike."""
    from extrapos.data import synthetic

    name = cfg.data.sampler
    return name == "synthetic" or (name == "contiguous" and synthetic.task_of(split.directory) is not None)


def build_sampler(
    cfg: RunConfig, split: TokenSplit, batch_size: int, seed: int, rank: int = 0, world: int = 1
) -> Any:
    # a Sampler; Any until training/trainer.py is annotated (issue 45): it hands the result to
    # coverage_note after a hasattr test, which mypy does not narrow to ContiguousSampler
    """The training sampler ``data.sampler`` names: contiguous windows or a segmented sampler.

    chunk / prefix / randompos cut examples of the run's sequence length (L_t) from windows of
    ``data.extended_length`` (L_e) tokens; ``full`` trains on the L_e windows themselves, so it
    needs ``train.seq_len = data.extended_length`` for token budgets to count what it feeds.
    """
    from extrapos.data import sampling, segmented, synthetic

    name, d = cfg.data.sampler, cfg.data
    if trains_on_answers(cfg, split):
        # answer-masked examples of a synthetic: corpus; the contiguous sampler would train on every token
        return synthetic.SyntheticSampler(
            split, cfg.seq_len, batch_size, seed=seed, rank=rank, world_size=world
        )
    if name == "contiguous":
        return sampling.ContiguousSampler(
            split,
            cfg.seq_len,
            batch_size,
            seed=seed,
            rank=rank,
            world_size=world,
            packed=d.packed,
            document_mask=d.document_mask,
            document_positions=d.document_positions,
        )
    if name not in segmented.SEGMENTED:
        raise UserError(
            f"unknown data.sampler {name!r}; choose contiguous, {', '.join(segmented.SEGMENTED)}."
        )
    if d.packed:
        raise UserError(
            f"data.sampler={name} cuts windows of single documents; it cannot be packed "
            "(set data.packed=false)."
        )
    if d.extended_length is None:
        raise UserError(
            f"data.sampler={name} needs data.extended_length (L_e, e.g. 2 x the training length)."
        )
    if name == "full":
        if cfg.seq_len != d.extended_length:
            raise UserError(
                f"data.sampler=full trains on windows of data.extended_length={d.extended_length} "
                f"tokens; set train.seq_len={d.extended_length} too (it is {cfg.seq_len})."
            )
        train_length = cfg.model.train_length
    else:
        train_length = cfg.seq_len
    return segmented.SegmentedSampler(
        split,
        name,
        train_length,
        d.extended_length,
        batch_size,
        alpha=d.alpha,
        seed=seed,
        rank=rank,
        world_size=world,
        chunk_targets=d.chunk_targets or "original",
        pose_chunks=d.pose_chunks,
    )


# ---- the step plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPlan:
    """How a budget becomes optimizer steps: micro-batches per step, tokens per step, total steps."""

    accumulation: int
    tokens_per_step: int
    total_steps: int


def accumulation_steps(cfg: RunConfig, world: int = 1) -> int:
    """Micro-batches per optimizer step so that a step holds about ``train.batch_tokens`` tokens."""
    t = cfg.train
    per_micro = t.batch_size * cfg.seq_len * world
    return max(1, round(t.batch_tokens / per_micro)) if t.batch_tokens else 1


def tokens_per_step(cfg: RunConfig, world: int = 1) -> int:
    return cfg.train.batch_size * cfg.seq_len * world * accumulation_steps(cfg, world)


def step_plan(cfg: RunConfig, windows_per_epoch: int, world: int = 1) -> StepPlan:
    """The plan for a budget of ``train.tokens``, ``train.epochs`` or ``train.steps`` (default 200 steps)."""
    t = cfg.train
    accum = accumulation_steps(cfg, world)
    per_step = tokens_per_step(cfg, world)
    if t.tokens is not None:
        total = math.ceil(t.tokens / per_step)
    elif t.epochs is not None:
        total = math.ceil(t.epochs * windows_per_epoch / (t.batch_size * accum * world))
    else:
        total = t.steps if t.steps is not None else 200
    if total * per_step >= 2**63:  # a token count no counter holds (and no machine trains): refused up front
        key = "epochs" if t.epochs is not None else "tokens" if t.tokens is not None else "steps"
        raise UserError(
            f"train.{key} = {getattr(t, key)} means {total:,} steps of {per_step:,} tokens, past 2^63 "
            f"tokens; give a budget of fewer tokens."
        )
    return StepPlan(accum, per_step, max(1, total))


# ---- precision -----------------------------------------------------------------------------------


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 / AMX): run/precision.py's answer."""
    from extrapos.run.precision import cpu_has_fast_bf16 as native

    return native()


def warn_slow_bf16(device: torch.device, precision: str) -> None:
    if precision == "bf16" and device.type == "cpu" and not cpu_has_fast_bf16():
        logger.warning(
            f"extrapos: this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native bf16, so "
            "precision=bf16 runs about 20x slower than fp32 here; use train.precision=fp32 on this machine."
        )
