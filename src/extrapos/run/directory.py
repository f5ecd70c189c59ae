"""A trained run directory, loaded back: ``load_run`` opens the run (``run/handle.py``) and loads its
weights in one call, for the commands that need nothing else of it."""

from __future__ import annotations

from pathlib import Path

import torch

from extrapos.run import checkpoint as ckpt_io
from extrapos.run.handle import LoadedRun, Run

__all__ = ["LoadedRun", "load_run"]


def load_run(
    run_dir: Run | str | Path,
    device: str | torch.device = "cpu",
    step: int | None = None,
    checkpoint: ckpt_io.Checkpoint | None = None,
) -> LoadedRun:
    """Load the newest intact (or a given ``step``'s, or a verified ``checkpoint``) weights, model in eval
    mode; ``run_dir`` a directory or a run already open (then its config is not read again).

    ``device`` "auto" is CUDA when a GPU is visible, else the CPU; a device that is not there is a
    UserError naming ``device``."""
    from extrapos.run.runtime import resolve_device

    if isinstance(device, str):  # a bad device is named before a missing run, as it always was
        device = resolve_device(device, "device")
    return Run.open(run_dir).load(device, step=step, checkpoint=checkpoint)
