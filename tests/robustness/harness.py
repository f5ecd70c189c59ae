"""Run ``python -m extrapos ...`` as a user would, and check that a mistake or a fault costs nothing.

The battery (issue 11) holds every command to one contract: bad input or a fault ends with exit
status 2 and exactly one sentence on stderr starting ``extrapos: error:``, never a traceback, and
every file that existed before has the same bytes after. Three pieces serve it:

``run(args, cache=..., ...)``
    ``python -m extrapos *args`` in a subprocess with ``EXTRAPOS_CACHE=cache`` (and ``HOME`` in the
    scratch dir, so nothing reaches the user's cache), optional ``fsize_limit`` (bytes, set with
    ``resource.setrlimit(RLIMIT_FSIZE)`` in the child: writes past it fail with EFBIG),
    ``unprivileged`` (when the tests run as root, drop the capabilities that read and write through
    mode bits, so a 0555 directory or a 0000 file stops root as it stops anyone else) and
    ``umask`` (the child's) and ``fault`` (see below). Returns the ``subprocess.CompletedProcess``
    (text mode). ``start`` takes the same arguments and returns the running ``Popen`` instead, for
    two processes at once.

``assert_user_error(args, cache=..., watch=[...], fragments=[...], ...)``
    Snapshots the sha256 of every file under ``watch`` and ``cache``, runs, and asserts the
    contract above plus that each fragment appears in the sentence. Returns the sentence.

``Fault("module:attr", signal.SIGKILL, when="before" | "after", nth=1, error=None, sleep=None)``
    A named point of the code: the child replaces ``module.attr`` (dotted attributes allowed,
    e.g. ``extrapos.data.shards:SplitWriter.add``) by a wrapper that sends the signal to its own
    process before (or after) the nth call, or, with ``error=errno.ENOSPC``, raises that
    ``OSError`` there instead (a full disk without filling one), or, with ``sleep=2.0``, waits
    there that long (so two processes are surely inside the same step at once). Patch the name
    where it is looked up: a function imported with ``from x import f`` into ``y`` is ``y:f``.

``snapshot(*roots)`` and ``assert_unchanged(before)`` are the file-digest half on its own.

``with bounded(cpu_s=..., wall_s=...):``
    An in-process case's time limit (the battery's): ``CaseTimeout`` once the block has used ``cpu_s`` of
    this process's CPU time, or ``wall_s`` of wall-clock time for a hang that waits without computing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# capability numbers (linux/capability.h) and prctl's PR_CAPBSET_DROP: dropped from the bounding
# set, root does not get them back at exec
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 1, 2, 3
PR_CAPBSET_DROP = 24
TIMEOUT = 120
PREFIX = "extrapos: error: "
# A second sentence: end punctuation, space, then a capital letter ("... here. Then ...").
SECOND_SENTENCE = re.compile(r"[.!?]\s+[A-Z]")


@dataclass(frozen=True)
class Fault:
    """Send ``signal`` to the child itself (or raise ``OSError(error)``) before/after the ``nth``
    call of ``target``."""

    target: str
    signal: int = signal.SIGKILL
    when: str = "before"
    nth: int = 1
    error: int | None = None
    sleep: float | None = None  # wait this many seconds there instead (two processes overlap for sure)

    def spec(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "signal": int(self.signal),
                "when": self.when,
                "nth": self.nth,
                "error": self.error,
                "sleep": self.sleep,
            }
        )


# The child: install the fault (if any), then run the CLI exactly as `python -m extrapos` does.
CHILD = r"""
import errno, importlib, json, os, sys
spec = json.loads(os.environ.pop("EXTRAPOS_TEST_FAULT", "null"))
if spec:
    module_name, _, dotted = spec["target"].partition(":")
    owner = importlib.import_module(module_name)
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    calls = [0]
    def strike():
        if spec.get("sleep") is not None:
            import time
            time.sleep(spec["sleep"])
            return
        if spec["error"] is not None:
            raise OSError(spec["error"], os.strerror(spec["error"]))
        os.kill(os.getpid(), spec["signal"])
    def wrapper(*args, **kwargs):
        calls[0] += 1
        hit = calls[0] == spec["nth"]
        if hit and spec["when"] == "before":
            strike()
        result = original(*args, **kwargs)
        if hit and spec["when"] == "after":
            strike()
        return result
    setattr(owner, name, wrapper)
peak = os.environ.pop("EXTRAPOS_TEST_PEAK_FLOPS", None)
if peak:  # a machine of a fixed speed: estimates that do not depend on the one running the test
    import extrapos.run.perf as perf
    perf.matmul_peak_flops = lambda *args, **kwargs: float(peak)
from extrapos.cli import main
sys.argv[0] = "extrapos"
raise SystemExit(main(sys.argv[1:]))
"""


def _child_setup(fsize_limit: int | None, unprivileged: bool, umask: int | None):
    def setup():
        import resource

        if umask is not None:
            os.umask(umask)
        if fsize_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
        if unprivileged and os.geteuid() == 0:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
                if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "cannot drop a capability for an unprivileged run")

    return setup


def _popen_kwargs(
    cache: Path,
    fault: Fault | None,
    fsize_limit: int | None,
    unprivileged: bool,
    umask: int | None,
    env: dict | None,
    cwd: Path | None,
) -> dict:
    cache = Path(cache)
    child_env = {
        **os.environ,
        "EXTRAPOS_CACHE": str(cache),
        "HOME": str(cache.parent),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    child_env.pop("EXTRAPOS_TEST_FAULT", None)
    if not env or "EXTRAPOS_TEST_PEAK_FLOPS" not in env:
        child_env.pop("EXTRAPOS_TEST_PEAK_FLOPS", None)
    if fault is not None:
        child_env["EXTRAPOS_TEST_FAULT"] = fault.spec()
    return {
        "env": child_env,
        "cwd": cwd or cache.parent,
        "text": True,
        "preexec_fn": _child_setup(fsize_limit, unprivileged, umask),
    }


def run(
    args,
    *,
    cache: Path,
    fault: Fault | None = None,
    fsize_limit: int | None = None,
    unprivileged: bool = False,
    umask: int | None = None,
    env: dict | None = None,
    timeout: float = TIMEOUT,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """``python -m extrapos *args`` with a scratch cache; see the module docstring."""
    return subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, args)],
        capture_output=True,
        timeout=timeout,
        **_popen_kwargs(cache, fault, fsize_limit, unprivileged, umask, env, cwd),
    )


def start(
    args,
    *,
    cache: Path,
    fault: Fault | None = None,
    fsize_limit: int | None = None,
    unprivileged: bool = False,
    umask: int | None = None,
    env: dict | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Like ``run``, but returns at once with the running process (stdout and stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **_popen_kwargs(cache, fault, fsize_limit, unprivileged, umask, env, cwd),
    )


def snapshot(*roots: Path) -> dict[Path, str]:
    """sha256 of every regular file under ``roots`` (a root may be a file or may not exist)."""
    digests = {}
    for root in map(Path, roots):
        files = (
            [root]
            if root.is_file()
            else sorted(p for p in root.rglob("*") if p.is_file())
            if root.is_dir()
            else []
        )
        for path in files:
            digests[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def assert_unchanged(before: dict[Path, str]) -> None:
    """Every file of a ``snapshot`` still exists with the same bytes."""
    for path, digest in before.items():
        assert path.is_file(), f"{path} existed before and is gone"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{path} was changed"


def assert_one_sentence_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit status 2, one line on stderr starting ``extrapos: error:`` holding one sentence with
    every fragment, no traceback; returns the sentence."""
    err = result.stderr
    assert "Traceback" not in err, err
    assert result.returncode == 2, f"exit status {result.returncode}, stderr:\n{err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), f"not one 'extrapos: error:' line:\n{err}"
    sentence = lines[0][len(PREFIX) :]
    assert sentence.endswith((".", "?", "!")) and not SECOND_SENTENCE.search(sentence), (
        f"not one sentence: {sentence}"
    )
    for fragment in fragments:
        assert fragment in sentence, f"{fragment!r} not in: {sentence}"
    return sentence


def assert_user_error(args, *, cache: Path, watch=(), fragments=(), **run_options) -> str:
    """Run ``args``; assert the contract (exit 2, one sentence with ``fragments``, no traceback)
    and that every file under ``watch`` and ``cache`` kept its bytes. Returns the sentence."""
    before = snapshot(cache, *watch)
    result = run(args, cache=cache, **run_options)
    sentence = assert_one_sentence_error(result, *fragments)
    assert_unchanged(before)
    return sentence


class CaseTimeout(BaseException):  # not an Exception: cli.main must not turn it into exit status 70
    """A case ran past its ``bounded`` limit."""


@contextmanager
def bounded(cpu_s: float, wall_s: float) -> Iterator[None]:
    """Raise ``CaseTimeout`` in the block once it has used ``cpu_s`` seconds of this process's CPU time
    (``ITIMER_PROF``: user and system time of every thread), or ``wall_s`` seconds of wall-clock time.

    The CPU time is the bound: it measures the work, which other jobs on the machine do not stretch (a
    wall-clock bound of 60 s failed two lm-eval cases on two cores at a load of 5-12, issue 48), and a loop
    that never ends still reaches it. The wall clock, set far larger, catches only a hang that waits without
    computing (a read that never returns). Main thread only (signals); the previous handlers are put back.
    """

    def on_cpu(signum, frame):
        raise CaseTimeout(f"used {cpu_s} s of CPU time")

    def on_wall(signum, frame):
        raise CaseTimeout(f"still waiting after {wall_s} s of wall-clock time")

    previous = signal.signal(signal.SIGPROF, on_cpu), signal.signal(signal.SIGALRM, on_wall)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, previous[0])
        signal.signal(signal.SIGALRM, previous[1])
