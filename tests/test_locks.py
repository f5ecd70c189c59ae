"""locks.py: the exclusive lock under a run's and a staging directory's, its holder named in the file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import filelock
import pytest

from extrapos import locks
from extrapos.errors import UserError
from extrapos.run.lock import ResultLock, RunLock


def opened(path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


def test_a_held_lock_refuses_another_and_names_its_holder(tmp_path):
    path = tmp_path / "x.lock"
    held, other = opened(path), opened(path)  # two open files contend even within one process
    try:
        assert locks.try_lock(held)
        locks.write_holder(held)
        assert not locks.try_lock(other)
        assert locks.read_holder(other) == f"process {os.getpid()}"
        locks.clear_holder(held)
        assert locks.read_holder(other) == "another process"
        locks.unlock(held)
        assert locks.try_lock(other)
    finally:
        os.close(held)
        os.close(other)


def test_it_is_filelock_s_own_lock(tmp_path):
    """Another program locking the file with filelock.FileLock contends with us."""
    path = tmp_path / "x.lock"
    fd = opened(path)
    try:
        assert locks.try_lock(fd)
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(str(path), timeout=0).acquire()
    finally:
        os.close(fd)
    with filelock.FileLock(str(path), timeout=0):
        fd = opened(path)
        try:
            assert not locks.try_lock(fd)
        finally:
            os.close(fd)


def test_the_lock_of_a_killed_process_is_let_go(tmp_path):
    path = tmp_path / ".lock"  # a run's
    code = (
        "import os, sys, time\n"
        "from extrapos import locks\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o666)\n"
        "assert locks.try_lock(fd)\n"
        "locks.write_holder(fd)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        with pytest.raises(UserError, match=f"is being trained by process {child.pid}; wait for it"):
            with RunLock(tmp_path):
                pass
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        fd = opened(path)
        try:
            assert locks.try_lock(fd)  # no one let it go but the operating system
        finally:
            os.close(fd)
    finally:
        child.kill()
        child.wait(timeout=30)


def test_remove_held_removes_the_file_and_closes(tmp_path):
    path = tmp_path / "x.lock"
    fd = opened(path)
    assert locks.try_lock(fd)
    locks.remove_held(path, fd)
    assert not path.exists()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_run_and_result_locks_are_never_switched_off(tmp_path):
    """On Windows the run lock used to be a no-op (fcntl only): now every platform holds it."""
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text() == f"process {os.getpid()}" or locks.WINDOWS
        with pytest.raises(UserError, match="is being trained by process"):
            with RunLock(tmp_path):
                pass
    assert (tmp_path / ".lock").read_text() == ""  # no holder named once released
    result = tmp_path / "eval" / "r.json"
    result.parent.mkdir()
    first = ResultLock(result).acquire(wait=False)
    fd = opened(first.path)
    try:
        assert not locks.try_lock(fd)
    finally:
        os.close(fd)
    first.release()
    assert not first.path.exists()
