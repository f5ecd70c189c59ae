"""An exclusive lock on a run directory, so two processes never train the same run at once."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from extrapos.errors import UserError

logger = logging.getLogger(__name__)

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


#: result locks this process holds, by path: a second slot of one name in one process would wait on itself
_HELD: dict[Path, ResultLock] = {}


class ResultLock:
    """``RUN/<folder>/.<name>.json.lock`` (flock, as ``RunLock``): held by a result slot from the moment it
    decides to score until its result is on disk, so two requests of one result name take turns and the
    second reads what the first wrote (reused when it is the same request, refused when it is another)
    instead of writing over it. ``wait`` False refuses at once instead of waiting (under torchrun, where
    the other ranks cannot wait with rank 0)."""

    def __init__(self, result: Path):
        self.result = Path(result)
        self.path = self.result.parent / f".{self.result.name}.lock"
        self._fd: int | None = None

    def acquire(self, wait: bool = True, say: Callable[[str], None] | None = None) -> ResultLock:
        """Take the lock; a wait is said once (``say``; by default this module's logger, at info)."""
        if fcntl is None:  # pragma: no cover - no advisory locks
            return self
        stale = _HELD.get(self.path)
        if stale is not None:
            # one process scores one result at a time, so a lock it still holds belongs to an evaluation
            # that failed and whose slot an exception's traceback keeps alive: let it go
            stale.release()
        said = False
        while True:  # the holder removes the file as it lets go: lock the file that is at the path now
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
                if not wait:
                    os.close(fd)
                    raise UserError(
                        f"{self.result} is being scored by {holder}; wait for it to finish, then ask again "
                        "(the same request is then reused)."
                    ) from None
                if not said:
                    (say or logger.info)(f"extrapos: waiting for {holder}, which is scoring {self.result}.")
                    said = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # it was removed while we waited: take the next one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()}".encode(), 0)
        self._fd = fd
        _HELD[self.path] = self
        return self

    def release(self) -> None:
        """Remove the file, then let go (a waiter on the removed file takes the next one), so a run keeps
        no lock files."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            if _HELD.get(self.path) is self:
                del _HELD[self.path]

    def __del__(self) -> None:  # a slot dropped without writing (its evaluation failed) lets go
        self.release()


def release_result_locks() -> None:
    """Let go of every result lock this process still holds: a command that stopped between deciding to
    score and writing (a refusal, an error) leaves no lock file in the run."""
    for lock in list(_HELD.values()):
        lock.release()
