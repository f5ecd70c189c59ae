"""An exclusive lock on a file descriptor this process owns, on every platform, dropped by the OS when the
process dies (even by SIGKILL): the primitive under a run's lock (run/lock.py) and a staging directory's
(data/staging.py).

The lock is filelock's native one on a caller-owned descriptor (``filelock.lock_descriptor``): ``flock`` of
the whole file on Unix, ``LockFileEx`` of its first byte on Windows, the same lock ``filelock.FileLock``
takes, so another program using filelock on the file contends with us. We keep the descriptor rather than
hand the file to ``FileLock`` because the lock file also names its holder ("process N", read by the process
that is refused) and a waiter must see that the file it locked was removed meanwhile; ``SoftFileLock``
would not do: its marker outlives a killed process.

On Windows the first byte is locked for reading too, so the holder is written after it; and a file still
open cannot be removed, so ``remove_held`` lets go before removing instead of after.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from filelock import lock_descriptor, unlock_descriptor

WINDOWS = sys.platform == "win32"
#: where the holder's name starts: past the byte Windows locks, which no other process can read
HOLDER_OFFSET = 1 if WINDOWS else 0
#: ``os.open`` flag that refuses a symlink, where the platform has one
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: how often a waiting ``wait_lock`` asks again (filelock's native lock has no blocking call on Windows)
POLL_SECONDS = 0.05


def try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` if no other process holds it; whether it was taken. An error other
    than contention (a file system without locks) is an ``OSError``."""
    return lock_descriptor(fd, blocking=False)


def wait_lock(fd: int) -> None:
    """Take the exclusive lock on ``fd``, waiting for its holder to let go (or die)."""
    lock_descriptor(fd, blocking=True, poll_interval=POLL_SECONDS)


def unlock(fd: int) -> None:
    unlock_descriptor(fd)


def write_holder(fd: int) -> None:
    """Name this process in the lock file it holds (``process N``), replacing what was there."""
    os.ftruncate(fd, 0)
    os.lseek(fd, HOLDER_OFFSET, os.SEEK_SET)
    os.write(fd, f"process {os.getpid()}".encode())


def clear_holder(fd: int) -> None:
    """Name no one: the lock is being let go."""
    os.ftruncate(fd, 0)


def read_holder(fd: int) -> str:
    """Who holds the lock of ``fd``'s file, as it wrote itself (``process N``), or "another process"."""
    try:
        os.lseek(fd, HOLDER_OFFSET, os.SEEK_SET)
        text = os.read(fd, 32).decode(errors="replace").strip()
    except OSError:  # a holder on Windows that wrote nothing past its locked byte yet
        text = ""
    return text or "another process"


def remove_held(path: Path, fd: int) -> None:
    """Remove the lock file ``path`` whose lock ``fd`` holds, and close ``fd``.

    On Unix the file goes while still locked, so whoever waits on it wakes to a removed file (and takes the
    next one) and no one ever finds it unlocked; Windows removes no open file, so there it is let go and
    closed first (a waiter that has it open keeps it in place, and then simply holds it)."""
    if not WINDOWS:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        return
    try:  # pragma: no cover - Windows
        unlock(fd)
    finally:
        os.close(fd)
    try:  # pragma: no cover - Windows
        path.unlink(missing_ok=True)
    except PermissionError:  # pragma: no cover - another process has it open: it is theirs now
        pass
