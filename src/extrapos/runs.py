"""A trained run directory, loaded back: config, model weights, tokenizer, data location."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from extrapos import checkpoint as ckpt_io
from extrapos.config import RunConfig, load_run_config
from extrapos.errors import UserError


@dataclass
class LoadedRun:
    path: Path
    cfg: RunConfig
    model: torch.nn.Module
    tokenizer: object
    step: int

    @property
    def data_dir(self) -> Path | None:
        """The prepared data the run trained on (None if it was moved or deleted)."""
        f = self.path / "data.json"
        if not f.is_file():
            return None
        d = Path(json.loads(f.read_text())["dir"])
        return d if (d / "manifest.json").is_file() else None


def load_run(run_dir: str | Path, device: str | torch.device = "cpu", step: int | None = None) -> LoadedRun:
    """Load the latest (or a given ``step``) checkpoint of a run, model in eval mode."""
    from extrapos.data import load_tokenizer
    from extrapos.model import Decoder

    path = Path(run_dir)
    cfg = load_run_config(path)
    found = ckpt_io.list_checkpoints(path)
    if not found:
        raise UserError(f"{path} has no checkpoint yet; train it first (extrapos train --out {path}).")
    if step is not None:
        match = [c for c in found if c.step == step]
        if not match:
            raise UserError(f"{path} has no checkpoint at step {step}; it has steps {[c.step for c in found]}.")
        chosen = match[0]
    else:
        chosen = found[-1]
    model = Decoder(cfg.model)
    ckpt_io.load_weights(model, chosen)
    model.to(device).eval()
    return LoadedRun(path, cfg, model, load_tokenizer(path), chosen.step)
