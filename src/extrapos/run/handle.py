"""``Run``: one trained run directory, opened once and handed to every command and evaluator.

A command used to pass the directory's path along and each step opened it again (one `extrapos eval`
read config.toml five times: the encoder check, the length check, the memory and time estimates,
the load). A ``Run`` reads each part of the directory the first time it is asked, then keeps it (the
one-object-per-loaded-model habit of torchtitan and litgpt):

* ``cfg``: the run's config (``Run.open`` reads it at once; ``Run(path)`` on first use, so a command can
  hold the run from its start and a missing or damaged config.toml is still reported at the point the
  command always reported it; a directory without config.toml is refused in one sentence);
* ``tokenizer``: the run's saved tokenizer;
* ``data_dir``: the prepared data ``data.json`` names (None when it was moved or deleted);
* ``checkpoint(step)``: the checkpoint a result scores and the digest of its weights, verified once;
* ``load(device, checkpoint)``: the weights, only when asked, as a ``LoadedRun`` (the model in eval
  mode beside the same config and tokenizer).

A Run is a view of the directory as it was when opened: a command that trains further opens it again.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from extrapos.run import checkpoint as ckpt_io
from extrapos.run.config import RunConfig, load_run_config

if TYPE_CHECKING:
    from extrapos.model import Decoder


class Run:
    """A trained run directory read once (see the module's docstring)."""

    def __init__(self, run_dir: str | Path):
        """The run in ``run_dir``, nothing read yet."""
        self.path = Path(run_dir)
        self._checkpoints: dict[int | None, tuple[ckpt_io.Checkpoint, str]] = {}

    @classmethod
    def open(cls, run: Run | str | Path) -> Run:
        """The run ``run`` names (a directory, or a ``Run`` already made: itself) with its config read: the
        one way a command, an evaluator or a library call opens a run (``Run(path)`` alone reads nothing,
        for a command that reports a missing run where it first needs it). A UserError naming the fix when
        the directory holds no config.toml."""
        opened = run if isinstance(run, Run) else cls(run)
        opened.cfg  # noqa: B018 (read now: a directory that holds no run is refused here)
        return opened

    @property
    def exists(self) -> bool:
        """Whether the directory holds a run's config.toml (nothing is read)."""
        return (self.path / "config.toml").is_file()

    @cached_property
    def cfg(self) -> RunConfig:
        return load_run_config(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def is_encoder(self) -> bool:
        """Whether the run was trained with objective mlm (a masked-LM encoder)."""
        return self.cfg.train.objective == "mlm"

    @cached_property
    def tokenizer(self) -> Any:
        from extrapos.data import load_tokenizer

        return load_tokenizer(self.path)

    @cached_property
    def data_dir(self) -> Path | None:
        """The prepared data the run trained on (None if it was moved or deleted)."""
        f = self.path / "data.json"
        if not f.is_file():
            return None
        d = Path(json.loads(f.read_text())["dir"])
        return d if (d / "manifest.json").is_file() else None

    def checkpoint(self, step: int | None = None) -> tuple[ckpt_io.Checkpoint, str]:
        """The checkpoint at ``step`` (None: the newest intact one), verified, and the sha256 of its
        weights; looked up once per step (a damaged checkpoint is reported once)."""
        if step not in self._checkpoints:
            chosen = ckpt_io.checkpoint_at(self.path, step)
            self._checkpoints[step] = (chosen, ckpt_io.weights_digest(chosen))
        return self._checkpoints[step]

    def load(
        self,
        device: str | torch.device = "cpu",
        step: int | None = None,
        checkpoint: ckpt_io.Checkpoint | None = None,
    ) -> LoadedRun:
        """The weights of ``checkpoint`` (default: ``step``'s, or the newest intact one) in a fresh model,
        in eval mode on ``device`` ("auto": CUDA when a GPU is visible; a device that is not there is a
        UserError naming ``device``)."""
        from extrapos.model import Decoder
        from extrapos.run.runtime import resolve_device

        if isinstance(device, str):
            device = resolve_device(device, "device")
        if checkpoint is None:
            checkpoint, digest = self.checkpoint(step)
        else:
            digest = ckpt_io.weights_digest(checkpoint)
        model = Decoder(self.cfg.model)
        ckpt_io.load_weights(model, checkpoint)
        model.to(device).eval()
        return LoadedRun(self, model, checkpoint.step, digest)


class LoadedRun:
    """A run with its weights loaded: the model beside the run's config, tokenizer and data."""

    def __init__(self, run: Run, model: Decoder, step: int, weights_sha256: str = ""):
        self.handle = run
        self.model = model
        self.step = step
        self.weights_sha256 = weights_sha256

    @property
    def path(self) -> Path:
        return self.handle.path

    @property
    def cfg(self) -> RunConfig:
        return self.handle.cfg

    @property
    def tokenizer(self) -> Any:
        return self.handle.tokenizer

    @property
    def data_dir(self) -> Path | None:
        return self.handle.data_dir
