"""How a ``train`` call starts on its run directory: one small decision, made before anything is written.

``decide`` reads the directory's facts (``RunFacts``: a run there or not, the given config against its saved
one, finished or not, stopped before its first checkpoint or not) and the flags (a config given or not,
``--resume``), and returns a frozen ``Start``: a fresh run, a restart (a run that stopped before its first
checkpoint holds nothing trained, so the same command starts it over), a resume (from the newest intact
checkpoint, chosen under the run's lock: ``checkpoint_to_resume``), a finished run with nothing to train,
or a refusal in one sentence. ``train`` acts on it. The facts are read when ``decide`` asks for them and
once at most, so a refusal reads no more than it needs (a finished run's checkpoints are verified, which
reads every byte, only when the run is finished and nothing would change) and the table of cases in
tests/training/test_start.py runs on facts written in memory.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

from extrapos.errors import UserError
from extrapos.owned import refuse_inside_run
from extrapos.run import checkpoint as ckpt_io
from extrapos.run.config import RunConfig, load_run_config


class Kind(enum.Enum):
    FRESH = "fresh"  # no run in the directory: a new one
    RESTART = "restart"  # a run that stopped before its first checkpoint: started over from step 0
    RESUME = "resume"  # continued from its newest intact checkpoint
    COMPLETE = "complete"  # finished, and nothing asks for more: its summary is the result
    REFUSE = "refuse"  # one sentence, nothing touched


@dataclass(frozen=True)
class Start:
    """What a ``train`` call does with its run directory (``decide``)."""

    kind: Kind
    cfg: RunConfig | None = None  # what the run trains with (None: refused)
    changes: tuple[str, ...] = ()  # a resume's changes to the saved config ("train.steps 8 -> 12")
    refusal: str = ""  # the sentence of a refusal

    @property
    def resume(self) -> bool:
        """Whether the Trainer continues the directory's run (a restart too: it cuts metrics.jsonl back)."""
        return self.kind in (Kind.RESTART, Kind.RESUME, Kind.COMPLETE)


def refuse(sentence: str) -> Start:
    return Start(Kind.REFUSE, refusal=sentence)


@dataclass(frozen=True)
class Saved:
    """A config given to a resume against the run's saved one: what the run continues with and the changes
    (``resume_config``), or the sentence refusing a change no resume may make."""

    cfg: RunConfig | None = None
    changes: tuple[str, ...] = ()
    refusal: str = ""


class RunFacts(Protocol):
    """What ``decide`` asks about a run directory (``RunDirectoryFacts`` reads them from disk)."""

    run_dir: Path

    @property
    def holds_run(self) -> bool:
        """config.toml is there: a run, trained, imported or started."""
        ...

    @property
    def inside_run(self) -> str:
        """The refusal of a directory inside another run's tree ("" when it is not)."""
        ...

    @property
    def stopped_early(self) -> bool:
        """``stopped_before_first_checkpoint``."""
        ...

    def saved(self, cfg: RunConfig | None) -> Saved:
        """``cfg`` (None: the saved config itself) against the saved config."""
        ...

    @property
    def complete(self) -> bool:
        """summary.json is there."""
        ...

    @property
    def unusable(self) -> str:
        """The refusal of a finished run with no usable checkpoint left ("" when it has one)."""
        ...


def decide(facts: RunFacts, cfg: RunConfig | None, resume: bool) -> Start:
    """How ``train(cfg, facts.run_dir, resume=resume)`` starts (module docstring); the refusals come in the
    order they always did, each read only once the ones before it passed."""
    run_dir = facts.run_dir
    if not facts.holds_run:
        # inside another run's tree, its pruning, resumes and evaluations would delete or replace the run
        inside = facts.inside_run
        if inside:
            return refuse(inside)
        if cfg is None:
            return refuse(f"{run_dir} holds no run to resume; start it with --config FILE_OR_PRESET.")
        return Start(Kind.FRESH, cfg)
    # a run that stopped before its first checkpoint (e.g. a loss that was NaN at step 1) holds nothing
    # trained: the same command, or one with a corrected config, starts it over
    if cfg is not None and facts.stopped_early:
        return Start(Kind.RESTART, cfg)
    if not resume:
        return refuse(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out.")
    saved = facts.saved(cfg)
    if saved.refusal:
        return refuse(saved.refusal)
    assert saved.cfg is not None
    # decided before anything is written: a larger budget (``changes``) continues a finished run
    if not saved.changes and facts.complete:
        unusable = facts.unusable
        if unusable:
            return refuse(unusable)
        return Start(Kind.COMPLETE, saved.cfg)
    return Start(Kind.RESUME, saved.cfg, saved.changes)


class RunDirectoryFacts:
    """``RunFacts`` read from ``run_dir`` on first use, each once."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)

    @cached_property
    def holds_run(self) -> bool:
        return (self.run_dir / "config.toml").is_file()

    @cached_property
    def inside_run(self) -> str:
        try:
            refuse_inside_run(self.run_dir, "--out")
        except UserError as e:
            return str(e)
        return ""

    @cached_property
    def stopped_early(self) -> bool:
        return stopped_before_first_checkpoint(self.run_dir)

    def saved(self, cfg: RunConfig | None) -> Saved:
        try:
            kept, changes = resume_config(self.run_dir, cfg)
        except UserError as e:
            return Saved(refusal=str(e))
        return Saved(kept, tuple(changes))

    @cached_property
    def complete(self) -> bool:
        return run_is_complete(self.run_dir)

    @cached_property
    def unusable(self) -> str:
        return unusable_checkpoint(self.run_dir)


# ---- the facts -----------------------------------------------------------------------------------


def run_is_complete(run_dir: Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file()


# keys a --resume may change: they decide how long to train and what to log, not what is learned
RESUMABLE_KEYS = {
    f"train.{k}"
    for k in (
        "steps",
        "tokens",
        "epochs",
        "log_every",
        "eval_every",
        "eval_batches",
        "checkpoint_every",
        "keep_checkpoints",
        "threads",
        "tensorboard",
        "wandb",
        "parallel",
        "activation_checkpointing",
    )
}


def _flat(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "model.positions":
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def resume_config(run_dir: Path, cfg: RunConfig | None) -> tuple[RunConfig, list[str]]:
    """The config a resumed run continues with, and the changes to its saved one.

    ``cfg`` None is the saved config. Otherwise only the keys in ``RESUMABLE_KEYS`` (the budget,
    logging, checkpointing) may differ from the saved config; anything else would silently mix two
    different runs in one directory, so it is an error naming the key.
    """
    saved = load_run_config(run_dir)
    if cfg is None:
        return saved, []
    old, new = _flat(saved.to_dict()), _flat(cfg.to_dict())
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    fixed = [k for k in changed if k not in RESUMABLE_KEYS]
    if fixed:
        k = fixed[0]
        raise UserError(
            f"{run_dir} was trained with {k} = {old.get(k, '(default)')!r}; --resume cannot change it "
            f"to {new.get(k, '(default)')!r}; drop that --set/--config, or start a new run with another "
            "--out."
        )
    return cfg, [f"{k} {old.get(k, '(default)')} -> {new.get(k, '(default)')}" for k in changed]


def stopped_before_first_checkpoint(run_dir: Path) -> bool:
    """A trained run directory (config.toml) that holds no checkpoint, finished or partial, no summary and
    was not imported: it failed or was killed before its first checkpoint, so nothing in it is lost by
    starting it over."""
    run_dir = Path(run_dir)
    return (
        (run_dir / "config.toml").is_file()
        and not (run_dir / "summary.json").exists()
        and not (run_dir / "source.json").exists()
        and not ckpt_io.list_checkpoints(run_dir)
        and not any((run_dir / "checkpoints").glob("*"))
        and not trained_without_checkpoint(run_dir, saved_checkpoint_every(run_dir))
    )


def saved_checkpoint_every(run_dir: Path) -> int:
    """The run's saved ``train.checkpoint_every`` (0, checkpoints at the end only, when unreadable)."""
    try:
        return load_run_config(run_dir).train.checkpoint_every
    except UserError:
        return 0


def _last_logged_step(run_dir: Path) -> int:
    """The highest step metrics.jsonl logs (0 when it logs none; a torn line ends the reading)."""
    last = 0
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    for line in lines:
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            break
        if isinstance(step, int):
            last = max(last, step)
    return last


def trained_without_checkpoint(run_dir: Path, checkpoint_every: int) -> list[str]:
    """What shows that ``run_dir`` was trained past a checkpoint it no longer has (nothing when it was
    not): ``summary.json`` (written after the final checkpoint), ``metrics.jsonl`` logging a step past
    ``checkpoint_every`` (a step is logged before its checkpoint is saved, so a later step means the save
    returned), and what ``checkpoints/`` holds that is not a checkpoint. A run that has none of these
    stopped before its first checkpoint was due, and starting it over loses nothing."""
    run_dir = Path(run_dir)
    found = ["summary.json"] if (run_dir / "summary.json").is_file() else []
    last = _last_logged_step(run_dir)
    if last and (found or (checkpoint_every and last > checkpoint_every)):
        found.append(f"metrics.jsonl up to step {last}")
    return found + ckpt_io.untrusted_entries(run_dir)


def checkpoint_to_resume(
    run_dir: Path, checkpoint_every: int, say: Callable[[str], None] | None
) -> ckpt_io.Checkpoint | None:
    """The newest intact checkpoint a resume continues from (None: the run stopped before its first
    checkpoint was due); a UserError when the run was trained further than that and has no checkpoint to
    trust, or every checkpoint is damaged, as training again from step 0 would replace its metrics and
    summary."""
    if not ckpt_io.list_checkpoints(run_dir):
        found = trained_without_checkpoint(run_dir, checkpoint_every)
        if found:
            raise UserError(
                f"{run_dir} holds {', '.join(found)} but no checkpoint a resume can trust, so --resume would "
                "train it again from step 0 and replace them; restore checkpoints/ from a copy, or start a "
                "new run with another --out."
            )
        return None
    last = ckpt_io.latest_intact(run_dir, say=say)
    if last is None:
        raise UserError(
            f"every checkpoint of {run_dir} is damaged, so --resume would train it again from step 0 and "
            "replace its metrics; restore the checkpoints from a copy, or start a new run with another --out."
        )
    return last


def unusable_checkpoint(run_dir: Path) -> str:
    """A finished run resumed with its own budget has nothing to train, but it must still hold a checkpoint
    whole: without one it was reported "done" (exit 0) although nothing in it can be evaluated, exported or
    trained further (issue 48, item 6). The sentence saying what is wrong and the fix ("" when one is
    whole)."""
    found = ckpt_io.list_checkpoints(run_dir)
    if ckpt_io.latest_intact(run_dir, say=lambda _: None) is not None:
        return ""
    if found:
        newest = found[-1]
        what = f"every checkpoint is damaged ({newest.path.name}: {ckpt_io.verify(newest)})"
    else:
        untrusted = ckpt_io.untrusted_entries(run_dir)
        what = f"it holds no checkpoint ({', '.join(untrusted)})" if untrusted else "it holds no checkpoint"
    return (
        f"{run_dir} is finished but has no usable checkpoint left: {what}, so nothing in it can be "
        "evaluated, exported or trained further; restore checkpoints/ from a copy, or train it again with "
        "another --out (or after deleting this run)."
    )
