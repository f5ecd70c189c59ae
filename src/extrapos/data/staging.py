"""Staging directories: where a prepared directory is built before it is renamed into place.

A staging directory is ``.<name>.tmp-<random>`` next to its target, with a lock file
``.<name>.tmp-<random>.lock`` beside it. Three things make it safe:

- It is created with ``os.mkdir(path, 0o777)``, so the process umask decides its mode, as for
  every other file we write: a team sharing a cache (umask 002 or 022) can read what a teammate
  prepared. (``tempfile.mkdtemp`` would force 0700.)
- Its owner creates the lock file and holds a lock on it (``extrapos.locks``: ``flock`` on Unix,
  ``LockFileEx`` on Windows) *before* the directory exists,
  until the directory is renamed or removed. The kernel drops the lock when the owner dies, even
  by SIGKILL, so ``sweep_stale`` can tell an abandoned staging directory (lock file unlocked) from
  one a concurrent prepare is filling (locked) with no window in between, and removes only the
  former. A ``.tmp-`` directory without a lock file was made by something else (an older
  version, another writer): it is removed only when untouched for ``FOREIGN_AGE_SECONDS``.
- ``terminate_raises`` turns SIGTERM into ``SystemExit`` while a directory is staged, so the
  ``finally`` that removes it runs; without it the default action kills the process on the spot.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from extrapos import locks

MARKER = ".tmp-"
LOCK_SUFFIX = ".lock"
FOREIGN_AGE_SECONDS = 24 * 3600
ORPHAN_LOCK_SECONDS = 60


def lock_path(staging: Path) -> Path:
    return staging.with_name(staging.name + LOCK_SUFFIX)


@contextlib.contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A fresh staging directory next to ``target``, locked while the block runs; removed on exit
    unless it was renamed away."""
    parent = target.parent
    while True:
        path = parent / f".{target.name}{MARKER}{secrets.token_hex(4)}"
        try:
            fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        locks.wait_lock(fd)  # before the directory exists: a sweeper never sees it unlocked
        os.mkdir(path, 0o777)  # the umask applies
        with terminate_raises():
            yield path
    finally:
        try:
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
        finally:
            locks.remove_held(lock_path(path), fd)


def sweep_stale(parent: Path, pattern: str = f".*{MARKER}*") -> list[Path]:
    """Remove the abandoned staging directories matching ``pattern`` in ``parent``; return them.

    Errors (a read-only or vanished directory) are ignored: sweeping is housekeeping, never the
    job at hand.
    """
    removed: list[Path] = []
    try:
        found = list(parent.glob(pattern))
        candidates = [p for p in found if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    _remove_orphan_locks([p for p in found if p.name.endswith(LOCK_SUFFIX) and p not in candidates])
    for path in candidates:
        fd = _claim_if_abandoned(path)
        if fd is None:
            continue
        try:  # holding the dead owner's lock while removing, so two sweepers never race
            shutil.rmtree(path, ignore_errors=True)
        finally:
            if fd >= 0:
                locks.remove_held(lock_path(path), fd)
            else:
                lock_path(path).unlink(missing_ok=True)
        if not path.exists():
            removed.append(path)
    return removed


def _remove_orphan_locks(lock_files: list[Path]) -> None:
    """Lock files whose directory is gone (the owner died between the two): removed when unlocked
    and older than ORPHAN_LOCK_SECONDS, which covers an owner between creating and locking one."""
    for lock in lock_files:
        staging = lock.with_name(lock.name[: -len(LOCK_SUFFIX)])
        try:
            if staging.exists() or time.time() - lock.stat().st_mtime < ORPHAN_LOCK_SECONDS:
                continue
            fd = os.open(lock, os.O_RDWR | locks.NOFOLLOW)
        except OSError:
            continue
        try:
            taken = locks.try_lock(fd)
        except OSError:
            taken = False
        if not taken:
            os.close(fd)
            continue
        with contextlib.suppress(OSError):  # housekeeping: a read-only directory keeps it
            locks.remove_held(lock, fd)


def _claim_if_abandoned(path: Path) -> int | None:
    """The locked fd of an abandoned staging directory's lock file (-1 for an old foreign one
    without a lock file), or None when it is in use or not ours to judge."""
    lock = lock_path(path)
    try:
        if not lock.exists():
            return -1 if time.time() - path.stat().st_mtime > FOREIGN_AGE_SECONDS else None
        fd = os.open(lock, os.O_RDWR | locks.NOFOLLOW)
    except OSError:
        return None
    try:
        taken = locks.try_lock(fd)
    except OSError:
        taken = False
    if not taken:
        os.close(fd)
        return None  # a live prepare holds it
    return fd


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143) (so ``finally`` clauses run) when its
    handler is the default one and we are on the main thread; otherwise nothing changes."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def raise_exit(signum: int, frame: object) -> NoReturn:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
