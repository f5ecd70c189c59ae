"""An exclusive lock on a run directory, so two processes never train the same run at once."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from extrapos import locks
from extrapos.errors import UserError

logger = logging.getLogger(__name__)


class RunLock:
    """``with RunLock(run_dir):`` holds ``RUN/.lock`` (locks.py: released by the OS if the process dies)."""

    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.path = Path(run_dir) / ".lock"
        self.enabled = enabled
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        if not self.enabled:
            return self
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        if not _try_lock(self._fd):
            holder = locks.read_holder(self._fd)
            os.close(self._fd)
            self._fd = None
            raise UserError(
                f"{self.path.parent} is being trained by {holder}; wait for it to finish "
                "(or stop it) before starting another process on the same run."
            ) from None
        locks.write_holder(self._fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            locks.clear_holder(self._fd)  # no holder named once released
            locks.unlock(self._fd)
            os.close(self._fd)
            self._fd = None


def _try_lock(fd: int) -> bool:
    """Whether the lock was taken; a file system that refuses locks reads as another holder, as it always
    has (the refusal names the lock file's holder, "another process" when it names none)."""
    try:
        return locks.try_lock(fd)
    except OSError:
        return False


#: result locks this process holds, by path: a second slot of one name in one process would wait on itself
_HELD: dict[Path, ResultLock] = {}


class ResultLock:
    """``RUN/<folder>/.<name>.json.lock`` (locks.py, as ``RunLock``): held by a result slot from the moment it
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
        stale = _HELD.get(self.path)
        if stale is not None:
            # one process scores one result at a time, so a lock it still holds belongs to an evaluation
            # that failed and whose slot an exception's traceback keeps alive: let it go
            stale.release()
        said = False
        while True:  # the holder removes the file as it lets go: lock the file that is at the path now
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            if not _try_lock(fd):
                holder = locks.read_holder(fd)
                if not wait:
                    os.close(fd)
                    raise UserError(
                        f"{self.result} is being scored by {holder}; wait for it to finish, then ask again "
                        "(the same request is then reused)."
                    ) from None
                if not said:
                    (say or logger.info)(f"extrapos: waiting for {holder}, which is scoring {self.result}.")
                    said = True
                locks.wait_lock(fd)
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # it was removed while we waited: take the next one
        locks.write_holder(fd)
        self._fd = fd
        _HELD[self.path] = self
        return self

    def release(self) -> None:
        """Remove the file, then let go (a waiter on the removed file takes the next one), so a run keeps
        no lock files."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            locks.remove_held(self.path, fd)
            if _HELD.get(self.path) is self:
                del _HELD[self.path]

    def __del__(self) -> None:  # a slot dropped without writing (its evaluation failed) lets go
        self.release()


def release_result_locks() -> None:
    """Let go of every result lock this process still holds: a command that stopped between deciding to
    score and writing (a refusal, an error) leaves no lock file in the run."""
    for lock in list(_HELD.values()):
        lock.release()
