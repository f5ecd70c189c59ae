"""Checkpoints: safetensors for tensors, JSON for the rest, written atomically, never unpickled.

Layout of ``RUN/checkpoints/step-N/``:

- ``model.safetensors``      the model weights (tied weights stored once)
- ``optimizer.safetensors``  AdamW moments and step counts, keyed ``<param index>.<state name>``
- ``rng.safetensors``        torch CPU (and CUDA) generator states as uint8 tensors
- ``state.json``             step, optimizer param groups, sampler position, config, anything JSON,
                             and the size and sha256 of each tensor file (``files``)

A checkpoint is written into ``.tmp-step-N`` and renamed, so any ``step-N`` directory is complete:
a process killed mid-write leaves only a temporary directory that the next save removes. A file
damaged later (a full disk, a bad copy) fails ``verify``, and ``latest_intact`` falls back to the
newest checkpoint that is whole, saying so in one line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from extrapos.errors import UserError
from extrapos.files import sha256_file

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class TensorState:
    """A model and optimizer state as tensors in this module's layout, for processes that hold no
    whole module to save (FSDP shards gathered on rank 0) or load into.

    ``weights`` holds one name per shared tensor and ``weights_metadata`` the dropped names
    (dropped -> kept), as safetensors' ``save_model`` writes them; ``optimizer`` is keyed
    ``<param index>.<state name>``, ``param_groups`` as ``Optimizer.state_dict`` gives them.
    """

    weights: dict[str, torch.Tensor]
    weights_metadata: dict[str, str]
    optimizer: dict[str, torch.Tensor]
    param_groups: list[dict[str, Any]]


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


def untrusted_entries(run_dir: Path) -> list[str]:
    """What ``checkpoints/`` holds that ``list_checkpoints`` skips (a step folder without state.json, a
    renamed folder, a stray file), as ``checkpoints/NAME`` phrases; temporary ``.tmp-*`` folders of an
    interrupted save are not counted (the next save removes them)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-"):
            continue
        if not _STEP_DIR.match(p.name):
            found.append(f"checkpoints/{p.name} (not a step-N folder)")
        elif not (p / "state.json").is_file():
            found.append(f"checkpoints/{p.name} (no state.json)")
    return found


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")


def verify(ckpt: Checkpoint, digests: bool = True) -> str | None:
    """What is wrong with a checkpoint (a short phrase), or None if it is whole.

    Checks that ``state.json`` parses, and each tensor file against the size and sha256 recorded
    at save time (``digests=False``: sizes only). A checkpoint from before digests were recorded is
    checked by reading its safetensors headers.
    """
    try:
        state = ckpt.state
    except (OSError, ValueError):
        return "state.json is unreadable or truncated"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return "state.json holds no step"
    files = state.get("files")
    if not isinstance(files, dict):
        return _verify_headers(ckpt.path)
    for name, meta in files.items():
        f = ckpt.path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta.get("bytes"):
            return f"{name} has {f.stat().st_size} bytes, {meta.get('bytes')} were written"
        if digests and sha256_file(f) != meta.get("sha256"):
            return f"{name} does not match its recorded sha256"
    return None


def _verify_headers(path: Path) -> str | None:
    from safetensors import safe_open

    for name in ("model.safetensors",):
        try:
            with safe_open(str(path / name), framework="pt") as f:
                f.keys()
        except Exception as e:  # SafetensorError, OSError: all mean "not a whole file"
            return f"{name} is unreadable ({str(e).splitlines()[0][:80]})"
    return None


def latest_intact(run_dir: Path, say: Callable[[str], None] | None = None) -> Checkpoint | None:
    """The newest checkpoint that passes ``verify``; a damaged newer one is reported (``say``, a warning of
    this module's logger by default) and skipped."""
    found = list_checkpoints(run_dir)
    for i, ckpt in enumerate(reversed(found)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        older = [c for c in found[: len(found) - 1 - i]]
        (say or logger.warning)(
            f"extrapos: checkpoint {ckpt.path} is damaged ({problem}); "
            + (f"trying step {older[-1].step}." if older else "no older checkpoint is left.")
        )
    return None


def checkpoint_at(run_dir: Path, step: int | None, say: Callable[[str], None] | None = None) -> Checkpoint:
    """The checkpoint at ``step`` (None: the newest intact one), verified; a UserError otherwise."""
    found = list_checkpoints(run_dir)
    if not found:
        raise UserError(f"{run_dir} has no checkpoint yet; train it first (extrapos train --out {run_dir}).")
    if step is None:
        chosen = latest_intact(run_dir, say)
        if chosen is None:
            raise UserError(
                f"every checkpoint of {run_dir} is damaged; retrain it or restore the checkpoints "
                "from a copy."
            )
        return chosen
    match = [c for c in found if c.step == step]
    if not match:
        raise UserError(
            f"{run_dir} has no checkpoint at step {step}; it has steps {[c.step for c in found]}."
        )
    problem = verify(match[0])
    if problem is not None:
        raise UserError(f"checkpoint {match[0].path} is damaged ({problem}); evaluate another --step.")
    return match[0]


def weights_digest(ckpt: Checkpoint) -> str:
    """sha256 of the checkpoint's weights (recorded at save; computed for older checkpoints)."""
    meta = (ckpt.state.get("files") or {}).get("model.safetensors")
    return meta["sha256"] if meta else sha256_file(ckpt.path / "model.safetensors")


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (0 keeps all), and no temporary ones."""
    root = Path(run_dir) / "checkpoints"
    for stale in root.glob(".tmp-*") if root.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old.path, ignore_errors=True)


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
    model: nn.Module | TensorState,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    keep: int = 0,
    before_publish: Callable[[], None] | None = None,
) -> Path:
    """Write ``run_dir/checkpoints/step-<step>`` atomically; keep the newest ``keep`` (0 keeps all).

    ``model`` is a module and ``optimizer`` its optimizer, or ``model`` is a ``TensorState`` that
    holds both (``optimizer`` None): the files are the same either way. ``before_publish`` runs once
    every file of the checkpoint is written, just before it is renamed into place; when it raises, the
    checkpoint is dropped (a resumed finished run changes its own files there, ``training.held``)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    try:
        tmp.mkdir()
        groups = []
        if isinstance(model, TensorState):
            save_file(model.weights, str(tmp / "model.safetensors"), metadata=model.weights_metadata or None)
            groups = model.param_groups
            save_file(model.optimizer, str(tmp / "optimizer.safetensors"))
        else:
            save_model(model, str(tmp / "model.safetensors"))
        if optimizer is not None:
            tensors, groups = _optimizer_tensors(optimizer)
            save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file(_rng_tensors(), str(tmp / "rng.safetensors"))
        files = {
            name: {"bytes": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
            for name in TENSOR_FILES
            if (tmp / name).is_file()
        }
        record = {**state, "step": step, "param_groups": groups, "files": files}
        (tmp / "state.json").write_text(json.dumps(record, indent=1))
        _fsync_dir(tmp)
        if before_publish is not None:
            before_publish()
        if final.exists():  # re-saving the same step (e.g. the final step after a resume)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk or a kill signal leaves no partial directory
        if type(e).__name__ == "SafetensorError":  # safetensors reports I/O errors (ENOSPC, EFBIG) as its own
            reason = str(e).rpartition("I/O error: ")[2] or str(e)
            raise UserError(
                f"cannot write checkpoint {final} ({reason}); free some space or raise the file-size "
                "limit, then resume the run."
            ) from None
        raise
    _fsync_dir(root)
    prune_checkpoints(run_dir, keep)
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
        raise UserError(
            f"checkpoint {file} does not fit this model ({str(e).splitlines()[0]}); "
            "use the config the checkpoint was trained with."
        ) from None
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


def read_state(ckpt: Checkpoint) -> TensorState:
    """A checkpoint's weights and optimizer state as tensors (for a model with no whole module here)."""
    from safetensors import safe_open

    with safe_open(str(ckpt.path / "model.safetensors"), framework="pt") as f:
        metadata = {k: v for k, v in (f.metadata() or {}).items()}
    return TensorState(
        load_file(str(ckpt.path / "model.safetensors")),
        metadata,
        load_file(str(ckpt.path / "optimizer.safetensors")),
        ckpt.state["param_groups"],
    )


def restore_rng(ckpt: Checkpoint) -> None:
    states = load_file(str(ckpt.path / "rng.safetensors"))
    torch.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted(k for k in states if k.startswith("cuda"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
