"""Staging directories: where a prepared directory is built before it is renamed into place.

A staging directory is ``.<name>.tmp-<random>`` next to its target. Three things make it safe:

- It is created with ``os.mkdir(path, 0o777)``, so the process umask decides its mode, as for
  every other file we write: a team sharing a cache (umask 002 or 022) can read what a teammate
  prepared. (``tempfile.mkdtemp`` would force 0700.)
- Its owner holds an ``flock`` on it until it is renamed or removed. The kernel drops the lock
  when the owner dies, even by SIGKILL, so ``sweep_stale`` can tell an abandoned staging
  directory (unlocked) from one a concurrent prepare is filling (locked) and removes only the
  former. A directory younger than ``GRACE_SECONDS`` is left alone too: that covers the instant
  between its creation and its lock.
- ``terminate_raises`` turns SIGTERM into ``SystemExit`` while a directory is staged, so the
  ``finally`` that removes it runs; without it the default action kills the process on the spot.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

GRACE_SECONDS = 60.0
MARKER = ".tmp-"


def staging_name(target_name: str) -> str:
    return f".{target_name}{MARKER}{secrets.token_hex(4)}"


@contextlib.contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A fresh, locked staging directory next to ``target``; removed on exit unless renamed away."""
    parent = target.parent
    while True:
        path = parent / staging_name(target.name)
        try:
            os.mkdir(path, 0o777)  # the umask applies
            break
        except FileExistsError:
            continue
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with terminate_raises():
            yield path
    finally:
        try:
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)  # the lock goes last, so a sweeper never sees it half removed and unlocked


def sweep_stale(parent: Path, pattern: str = f".*{MARKER}*") -> list[Path]:
    """Remove the abandoned staging directories matching ``pattern`` in ``parent``; return them.

    Only unlocked directories older than GRACE_SECONDS go; errors (a read-only or vanished
    directory) are ignored, since sweeping is housekeeping, never the job at hand.
    """
    removed = []
    try:
        candidates = [p for p in parent.glob(pattern) if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    now = time.time()
    for path in candidates:
        try:
            if now - path.stat().st_mtime < GRACE_SECONDS:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live prepare holds it
        try:
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143) (so ``finally`` clauses run) when its
    handler is the default one and we are on the main thread; otherwise nothing changes."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def raise_exit(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
