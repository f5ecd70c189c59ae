"""``metrics.jsonl``: the training log of a run (rank 0), with TensorBoard / W&B mirrors when asked for.

A run killed and resumed replays the steps after its checkpoint; ``truncate_after`` cuts the log
back to that step first, so the log of a resumed run equals the log of one that never stopped.
A finished run trained further holds its new lines (``hold``) until its first new checkpoint is
written (``release``), so a continuation that fails before leaves the finished run's log as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from extrapos.errors import UserError
from extrapos.files import atomic_write
from extrapos.run.config import RunConfig


class MetricsLog:
    """Append-only ``metrics.jsonl`` (rank 0), plus TensorBoard / W&B mirrors when asked for."""

    def __init__(self, run_dir: Path, cfg: RunConfig, enabled: bool, hold: bool = False):
        """``hold``: keep the lines in memory until ``release`` (the TensorBoard / W&B mirrors get them
        at once: they are views of the run, not its record)."""
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.held: list[str] | None = [] if hold else None
        self.tb = self.wandb = None
        if not enabled:
            return
        if cfg.train.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UserError(
                    "train.tensorboard needs the tensorboard package: pip install tensorboard."
                ) from None
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.train.wandb:
            try:
                import wandb
            except ImportError:
                raise UserError("train.wandb needs the wandb package: pip install wandb.") from None
            self.wandb = wandb.init(
                project=cfg.train.wandb,
                name=run_dir.name,
                config=cfg.to_dict(),
                dir=str(run_dir),
                resume="allow",
                id=run_dir.name,
            )

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
        atomic_write(self.path, "".join(line + "\n" for line in kept))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.held is not None:
            self.held.append(json.dumps(record) + "\n")
        else:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        step = record["step"]
        if self.tb:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log({k: v for k, v in record.items() if k != "step"}, step=step)

    def release(self) -> None:
        """Append the held lines, all or none (a write cut short by a full disk is cut back to the old
        end, which needs no space), and log straight to the file from now on."""
        if self.held is None:
            return
        if self.enabled and self.held:
            existed = self.path.exists()
            size = self.path.stat().st_size if existed else 0
            try:
                with self.path.open("a") as f:
                    f.write("".join(self.held))
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    if existed:
                        os.truncate(self.path, size)
                    else:
                        self.path.unlink()
                raise
        self.held = None

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
