"""A finished run changes only once its continuation has a checkpoint (issue 48, item 1).

``train --resume --set train.steps=N`` of a finished run used to remove ``summary.json`` and write the new
``config.toml`` at once, then log its steps into ``metrics.jsonl``: a full disk at the first checkpoint
left a run that looked unfinished, with a budget and a log that no checkpoint backs. Instead the three
changes are held (the metrics lines in memory, ``MetricsLog(hold=True)``) and made by ``publish``, which
``save_checkpoint`` calls once every file of the first new checkpoint is written, before it is renamed
into place. Until then a failure or a kill leaves every file of the run as it was.

``publish`` does first what needs space (the new config.toml into a temporary file, the held metrics lines,
cut back if they fail), then what needs none: ``summary.json`` is removed before config.toml is renamed,
so a kill between the steps leaves either the finished run, or a run that a resume finishes (no summary,
the old budget, its final checkpoint) or continues (no summary, the new budget).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from extrapos.run.metrics import MetricsLog


class HeldChanges:
    """The new config.toml, the removal of summary.json and the held metrics lines of a finished run
    being trained further, made together by ``publish`` (once; later calls do nothing)."""

    def __init__(self, run_dir: Path, config_text: str, metrics: MetricsLog):
        self.run_dir, self.config_text, self.metrics = Path(run_dir), config_text, metrics
        self.published = False

    def publish(self) -> None:
        if self.published:
            return
        config = self.run_dir / "config.toml"
        fd, tmp = tempfile.mkstemp(dir=self.run_dir, prefix=".config.toml.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.config_text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            self.metrics.release()
            (self.run_dir / "summary.json").unlink(missing_ok=True)
            os.replace(tmp, config)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(tmp).unlink()
            raise
        self.published = True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
