"""Checkpoints: safetensors for tensors, JSON for the rest, written atomically, never unpickled.

Layout of ``RUN/checkpoints/step-N/``:

- ``model.safetensors``      the model weights (tied weights stored once)
- ``optimizer.safetensors``  AdamW moments and step counts, keyed ``<param index>.<state name>``
- ``rng.safetensors``        torch CPU (and CUDA) generator states as uint8 tensors
- ``state.json``             step, optimizer param groups, sampler position, config, anything JSON

A checkpoint is written into ``.tmp-step-N`` and renamed, so any ``step-N`` directory is complete:
a process killed mid-write leaves only a temporary directory that the next save removes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from extrapos.errors import UserError

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class Checkpoint:
    path: Path
    step: int

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.path / "state.json").read_text())


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "state.json").is_file():
            found.append(Checkpoint(p, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    sd = optimizer.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{idx}.{name}"] = t.detach().cpu().contiguous()
    return tensors, sd["param_groups"]


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda{i}"] = s
    return out


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    keep: int = 0,
) -> Path:
    """Write ``run_dir/checkpoints/step-<step>`` atomically; keep the newest ``keep`` (0 keeps all)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    groups = []
    if optimizer is not None:
        tensors, groups = _optimizer_tensors(optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
    save_file(_rng_tensors(), str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps({**state, "step": step, "param_groups": groups}, indent=1))
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. the final step after a resume)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old.path, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    # make the rename durable; best effort on filesystems that refuse directory fsync
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def load_weights(model: nn.Module, ckpt: Checkpoint | Path, strict: bool = True) -> None:
    path = ckpt.path if isinstance(ckpt, Checkpoint) else Path(ckpt)
    file = path / "model.safetensors" if path.is_dir() else path
    try:
        missing, unexpected = load_model(model, str(file), strict=False, device=str(_device_of(model)))
    except RuntimeError as e:  # shape mismatch: a checkpoint of another model size / vocabulary
        raise UserError(f"checkpoint {file} does not fit this model ({str(e).splitlines()[0]}); "
                        "use the config the checkpoint was trained with.") from None
    if strict and (missing or unexpected):
        raise UserError(
            f"checkpoint {file} does not match the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); use the config it was trained with."
        )


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def load_optimizer(optimizer: torch.optim.Optimizer, ckpt: Checkpoint) -> None:
    state = ckpt.state
    tensors = load_file(str(ckpt.path / "optimizer.safetensors"))
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        idx, _, name = key.partition(".")
        per_param.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})


def restore_rng(ckpt: Checkpoint) -> None:
    states = load_file(str(ckpt.path / "rng.safetensors"))
    torch.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted(k for k in states if k.startswith("cuda"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
