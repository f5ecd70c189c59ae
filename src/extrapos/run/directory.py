"""A trained run directory, loaded back: config, model weights, tokenizer, data location."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from extrapos.run import checkpoint as ckpt_io
from extrapos.run.config import RunConfig, load_run_config

if TYPE_CHECKING:  # imported where a run is loaded, as the command's --help needs neither
    from extrapos.data.tokenizer import Tokenizer
    from extrapos.model import Decoder


@dataclass
class LoadedRun:
    path: Path
    cfg: RunConfig
    model: Decoder
    tokenizer: Tokenizer
    step: int
    weights_sha256: str = ""

    @property
    def data_dir(self) -> Path | None:
        """The prepared data the run trained on (None if it was moved or deleted)."""
        f = self.path / "data.json"
        if not f.is_file():
            return None
        d = Path(json.loads(f.read_text())["dir"])
        return d if (d / "manifest.json").is_file() else None


def load_run(
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    step: int | None = None,
    checkpoint: ckpt_io.Checkpoint | None = None,
) -> LoadedRun:
    """Load the newest intact (or a given ``step``'s, or a verified ``checkpoint``) weights, model in eval
    mode.

    ``device`` "auto" is CUDA when a GPU is visible, else the CPU; a device that is not there is a
    UserError naming ``device``."""
    from extrapos.data import load_tokenizer
    from extrapos.model import Decoder
    from extrapos.run.runtime import resolve_device

    if isinstance(device, str):
        device = resolve_device(device, "device")

    path = Path(run_dir)
    cfg = load_run_config(path)
    chosen = checkpoint if checkpoint is not None else ckpt_io.checkpoint_at(path, step)
    model = Decoder(cfg.model)
    ckpt_io.load_weights(model, chosen)
    model.to(device).eval()
    return LoadedRun(path, cfg, model, load_tokenizer(path), chosen.step, ckpt_io.weights_digest(chosen))
