"""Fail the k-th file-system write of a command, the way SQLite tests its I/O layer (issue 48, part 1).

One seam for every command: the child replaces, before it runs the command, the few calls through which
anything reaches the disk, and counts each call whose target lies under ``root`` (the case's scratch
folder: nothing else a library writes counts):

- ``open`` (``builtins.open`` and ``io.open``, so ``Path.write_text``, ``np.save`` and ``shutil`` copies too)
  and ``os.open`` in a writing mode (``tempfile.mkstemp`` creates through ``os.open``);
- ``os.fsync`` of a file being written (the point where a full disk or a failing device shows);
- ``os.replace``, ``os.rename`` and ``os.mkdir`` (``os.makedirs``, ``Path.mkdir``, ``tempfile.mkdtemp``);
- ``safetensors.torch.save_file`` / ``save_model`` (they write from Rust, past ``open``).

``Server(scratch)`` imports torch and extrapos once and forks a child per command, each its own process
(its cwd, ``EXTRAPOS_CACHE`` and ``HOME``, stdout and stderr to files). ``server.count(args, ...)`` runs the
command once and returns the list of its points (kind and path, in order); ``server.strike(args, at=k,
error=errno.ENOSPC)`` runs it with the k-th point raising ``OSError(error)`` and ``server.strike(args,
at=k, kill=True)`` with the child killed (SIGKILL) at that point instead. A point fails
before its call has any effect, as a full disk refuses a creation, a write or a rename.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import TIMEOUT

SEAM = r"""
import builtins, io, os, signal, sys

def install(root, at, error, kill, points):
    real_open, real_os_open, real_close, real_fsync = builtins.open, os.open, os.close, os.fsync
    real_mkdir, real_replace, real_rename = os.mkdir, os.replace, os.rename
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    creating = os.O_CREAT | getattr(os, "O_TMPFILE", 0)

    def under_root(target):
        if isinstance(target, int):
            return False
        try:
            path = os.path.abspath(os.fsdecode(os.fspath(target)))
        except TypeError:
            return False
        return path == root or path.startswith(root + os.sep)

    def point(kind, target):
        points.append([kind, os.path.abspath(os.fsdecode(os.fspath(target)))])
        if len(points) == at:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(error, os.strerror(error), os.fsdecode(os.fspath(target)))

    def patched_open(file, mode="r", *args, **kwargs):
        if under_root(file) and any(c in mode for c in "wax+"):
            point("open", file)
        return real_open(file, mode, *args, **kwargs)

    def patched_os_open(path, flags, *args, **kwargs):
        if under_root(path) and flags & writing:
            point("create" if flags & creating else "open", path)
        return real_os_open(path, flags, *args, **kwargs)

    def patched_fsync(fd):
        number = fd if isinstance(fd, int) else fd.fileno()
        try:
            target = os.readlink(f"/proc/self/fd/{number}")
        except OSError:
            target = None
        if target is not None and under_root(target):
            point("fsync", target)
        return real_fsync(fd)

    def two_paths(name, real):
        def patched(src, dst, *args, **kwargs):
            if under_root(dst) or under_root(src):
                point(name, dst)
            return real(src, dst, *args, **kwargs)
        return patched

    def patched_mkdir(path, *args, **kwargs):
        if under_root(path) and not os.path.isdir(path):
            point("mkdir", path)
        return real_mkdir(path, *args, **kwargs)

    builtins.open = io.open = patched_open
    os.open, os.fsync, os.mkdir = patched_os_open, patched_fsync, patched_mkdir
    os.replace, os.rename = two_paths("replace", real_replace), two_paths("rename", real_rename)

    import safetensors.torch as st
    saving_now = [False]  # save_model calls save_file: one point

    def saving(name, real):
        def patched(first, filename, *args, **kwargs):
            if saving_now[0]:
                return real(first, filename, *args, **kwargs)
            if under_root(filename):
                point(name, filename)
            saving_now[0] = True
            try:
                return real(first, filename, *args, **kwargs)
            finally:
                saving_now[0] = False
        return patched

    for name in ("save_file", "save_model"):
        real = getattr(st, name)
        patched = saving(name, real)
        setattr(st, name, patched)
        for module in list(sys.modules.values()):  # the names `from safetensors.torch import` bound
            if getattr(module, "__name__", "").startswith("extrapos") and getattr(module, name, None) is real:
                setattr(module, name, patched)


def serve():
    import json, traceback
    import torch  # noqa: F401  (imported once here, never used before a fork)
    import extrapos.cli, extrapos.run.checkpoint, extrapos.training.trainer, extrapos.data  # noqa: F401
    from extrapos.cli import main
    answers = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        req = json.loads(line)
        if "preload" in req:  # imported here once, so that each fork finds it imported
            sys.path.insert(0, req["path"])  # a helper module of the tests' folder, or a library
            try:
                __import__(req["preload"])
            finally:
                sys.path.remove(req["path"])
            answers.write("0\n")
            answers.flush()
            continue
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            points, code = [], 70
            try:
                os.chdir(req["cwd"])
                os.environ.update(req["env"])
                for fd, name in ((1, "stdout"), (2, "stderr")):
                    target = os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(target, fd)
                    os.close(target)
                install(req["root"], req["at"], req["error"], req["kill"], points)
                sys.argv[0] = "extrapos"
                code = main(req["args"])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush(); sys.stderr.flush()
                except BaseException:
                    pass
                if req["log"]:
                    with io.FileIO(req["log"], "w") as f:
                        f.write(json.dumps(points).encode())
                os._exit(code or 0)
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
        answers.flush()

serve()
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class Server:
    """One ``python -c SEAM`` process that imports torch and extrapos once, then forks a fresh child per
    command (its own process, cwd, environment and write seam): a case costs its work, not an import."""

    def __init__(self, scratch: Path):
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "TOKENIZERS_PARALLELISM": "false"}
        # matplotlib's font cache and config, outside every case's folder: its files, not the command's
        env["MPLCONFIGDIR"] = str(self.scratch / "matplotlib")
        # Hugging Face's caches (datasets' prepared copies of lm-eval's task data, hub and module caches) the
        # same way: HOME is the case's folder, where they would count as the command's writes
        env["HF_HOME"] = str(self.scratch / "huggingface")
        self.process = subprocess.Popen(
            [sys.executable, "-c", SEAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def run(self, args, *, cache: Path, root: Path, at=0, error=0, kill=False, log=None, cwd=None) -> Result:
        out, err = self.scratch / "stdout", self.scratch / "stderr"
        cache = Path(cache)
        request = {
            "args": list(map(str, args)),
            "cwd": str(cwd or cache.parent),
            "env": {"EXTRAPOS_CACHE": str(cache), "HOME": str(cache.parent)},
            "stdout": str(out),
            "stderr": str(err),
            "root": str(Path(root).resolve()),
            "at": at,
            "error": error,
            "kill": kill,
            "log": log and str(log),
        }
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, "the fork server died"
        return Result(json.loads(answer), out.read_text(errors="replace"), err.read_text(errors="replace"))

    def preload(self, module: str) -> None:
        """Import ``module`` in the server itself (a library that takes seconds to import, or a module of this
        folder that prepares one, ``lm_eval_index``), once."""
        assert self.process.stdin is not None and self.process.stdout is not None
        request = {"preload": module, "path": str(Path(__file__).parent)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline(), "the fork server died"

    def count(self, args, *, cache: Path, root: Path, log: Path, cwd=None) -> tuple[Result, list]:
        """Run ``args`` with no fault; return the result and its write points ``[kind, path]`` in order."""
        result = self.run(args, cache=cache, root=root, log=log, cwd=cwd)
        points = json.loads(Path(log).read_text()) if Path(log).is_file() else []
        Path(log).unlink(missing_ok=True)
        return result, points

    def strike(self, args, *, cache: Path, root: Path, at: int, error: int = 0, kill: bool = False, cwd=None):
        """Run ``args`` with its ``at``-th write point failing with ``OSError(error)`` (or killed)."""
        return self.run(args, cache=cache, root=root, at=at, error=error, kill=kill, cwd=cwd)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=TIMEOUT)


def sample(n: int, budget: int) -> list[int]:
    """Fault points 1..n: every one when ``n <= budget``, else ``budget`` of them evenly spread, the first
    and the last included (one: the middle one); deterministic."""
    if n <= budget:
        return list(range(1, n + 1))
    if budget == 1:
        return [(n + 1) // 2]
    return sorted({1 + round(i * (n - 1) / (budget - 1)) for i in range(budget)})
