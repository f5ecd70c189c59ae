"""An exclusive lock on a run directory, so two processes never train the same run at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from extrapos.errors import UserError

if sys.platform == "win32":  # pragma: no cover - no advisory locks, runs are not protected
    fcntl = None
else:
    import fcntl


class RunLock:
    """``with RunLock(run_dir):`` holds ``RUN/.lock`` (flock, released by the OS if the process dies)."""

    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.path = Path(run_dir) / ".lock"
        self.enabled = enabled and fcntl is not None
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(self._fd)
            self._fd = None
            raise UserError(
                f"{self.path.parent} is being trained by {holder}; wait for it to finish "
                "(or stop it) before starting another process on the same run."
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"process {os.getpid()}".encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # no holder named once released
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
