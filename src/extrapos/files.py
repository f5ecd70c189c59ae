"""Writing files so that a kill, a full disk or a symlink never leaves a damaged one behind.

Every file extrapos writes into a run, a cache or a report goes through ``atomic_write``: the
bytes go to a temporary file in the same directory, are flushed to disk, and the temporary file
is renamed over the target. A rename replaces a symlink itself, never the file it points to, so a
crafted link in a run directory cannot redirect a write. On any error the temporary file is
removed and the old file is untouched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from extrapos.errors import UserError


def check_text(value: str | Path | None, flag: str) -> None:
    """Refuse a command-line value that is not UTF-8 text (its bytes arrive as lone surrogates) before any
    work: a path or a title is written into JSON, TOML and Markdown files, which hold UTF-8 only."""
    if value is None:
        return
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            f"{flag} holds bytes that are not UTF-8 ({str(value)!r}); give it as UTF-8 text."
        ) from None


def check_regular_file(path: Path, label: str, fix: str) -> None:
    """Refuse an input ``path`` that is not a regular file, in one sentence naming what it is (``label``: how
    the sentence names the path; ``fix``: what to do). A directory, a device such as /dev/zero or a FIFO was
    "does not exist" (issue 48), and reading the last two never ends or waits for a writer: it is judged
    by ``stat`` alone, never opened."""
    import stat as st

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{label} does not exist; {fix}.") from None
    except OSError as e:
        raise UserError(f"cannot read {label} ({describe_os_error(e)}); {fix}.") from None
    if st.S_ISREG(mode):
        return
    kinds = [
        (st.S_ISDIR, "a directory"),
        (st.S_ISFIFO, "a FIFO (a named pipe)"),
        (st.S_ISCHR, "a character device"),
        (st.S_ISBLK, "a block device"),
        (st.S_ISSOCK, "a socket"),
    ]
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    raise UserError(f"{label} is {kind}, not a file; {fix}.")


def finite_json(result: Any, options: dict[str, Any] | None, what: str = "result") -> str:
    """``result`` as JSON text, refused in one sentence naming ``options`` when it holds a NaN or infinite
    number: ``json.dumps`` would write the bare ``NaN`` token and the file would read as a valid result
    (option values that pass validation can still overflow the attention, e.g. YaRN's attention_factor
    1e30). The writer of every result calls it before anything is written."""
    try:
        return json.dumps(result, indent=1, allow_nan=False, default=str)
    except ValueError:
        given = ", ".join(f"{k}={v}" for k, v in (options or {}).items()) or "the run's own settings"
        raise UserError(
            f"the {what} with {given} holds a NaN or infinite loss, so nothing was written; "
            "score it without these options or with smaller values."
        ) from None


def atomic_write(path: str | Path, data: bytes | str, skip_unchanged: bool = True) -> bool:
    """Write ``data`` to ``path`` atomically; returns False when the file already held exactly it."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if skip_unchanged and path.is_file() and not path.is_symlink():
        try:
            if path.stat().st_size == len(payload) and path.read_bytes() == payload:
                return False
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def save_png(fig: Any, path: str | Path, dpi: int = 120) -> None:
    """A matplotlib figure's PNG written whole or not at all (``atomic_write``): ``savefig`` onto the path
    itself truncates the old picture first, and a disk that fills part-way leaves a damaged one."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    # what a killed command left before the rename: no lock guards a picture, so only once abandoned
    sweep_temporaries_of(path, older_than=ABANDONED_SECONDS)
    atomic_write(path, buf.getvalue())


# the name ``atomic_write`` gives its temporary file: ``.<name>.<mkstemp's 8 characters>.tmp``
_TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


# a temporary older than this is abandoned: ``atomic_write`` keeps one only while it writes one small file
ABANDONED_SECONDS = 60.0


def sweep_temporaries(folder: str | Path, older_than: float = 0.0) -> list[Path]:
    """Remove the temporary files ``atomic_write`` (or a writer like it) left in ``folder`` when killed
    between creating one and renaming it, and the ``.tokenizer-*`` folders of a killed run's tokenizer
    copy; return them. Call it only while holding what keeps every other writer out of ``folder`` (a run's
    ``RunLock`` for the run's own files): a live writer's temporary looks the same. A folder no lock guards
    (a compare's or a report's) passes ``older_than=ABANDONED_SECONDS``: only what has not been touched
    for that long goes, so a writer alive beside it keeps its temporary. Errors are ignored: sweeping is
    housekeeping, never the job at hand."""
    try:
        found = [p for p in Path(folder).iterdir() if _TEMPORARY.match(p.name)]
        found += [p for p in Path(folder).glob(".tokenizer-*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    return _remove(found, older_than)


def sweep_temporaries_of(path: str | Path, older_than: float = 0.0) -> list[Path]:
    """Remove the temporaries ``atomic_write(path, ...)`` left beside ``path`` when killed before its rename
    (``.<name>.<8 characters>.tmp``); return them. Call it only while holding what keeps every other writer
    of ``path`` out (a result's ``ResultLock``), or with ``older_than=ABANDONED_SECONDS`` (a picture no
    lock guards)."""
    path = Path(path)
    own = re.compile(re.escape(f".{path.name}.") + r"[a-z0-9_]{8}\.tmp")
    try:
        found = [p for p in path.parent.iterdir() if own.fullmatch(p.name)]
    except OSError:
        return []
    return _remove(found, older_than)


def _remove(found: list[Path], older_than: float) -> list[Path]:
    removed: list[Path] = []
    now = time.time()
    for path in found:
        if older_than:
            try:
                if now - path.lstat().st_mtime < older_than:
                    continue
            except OSError:
                continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and not path.is_symlink():
            try:
                path.unlink()
            except OSError:
                continue
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def ensure_writable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` (a directory we are about to write into) or fail now with one sentence.

    Called before long work (scoring, training) so that a read-only or full location is reported
    before the work is done, not after it is lost.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(
            f"cannot write {what} in {path} ({describe_os_error(e)}); "
            "choose a writable location or free some space."
        ) from None
    return path


def describe_os_error(e: OSError) -> str:
    """'No space left on device' style text for an OSError, with the file when it names one."""
    reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
    return f"{reason}: {e.filename}" if e.filename else reason


def fresh_output_dir(out: Path, what: str) -> Path:
    """A new, empty temporary directory beside ``out`` to build ``out`` in (then ``os.replace`` it into
    place, so ``out`` appears whole or not at all); a UserError when ``out`` already exists. The ones that
    killed writers left beside it are swept first (``sweep_abandoned_outputs``)."""
    from extrapos.owned import refuse_inside_run

    if out.exists():
        raise UserError(f"{out} already exists; choose another output directory or remove it first.")
    refuse_inside_run(out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_abandoned_outputs(out.parent, what)
    tmp = out.parent / f".tmp-{what}-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def sweep_abandoned_outputs(parent: Path, what: str) -> list[Path]:
    """Remove the ``.tmp-<what>-<name>-<pid>`` directories in ``parent`` whose process is gone; return them.

    A writer removes its own on any error, but a kill -9 (or a power cut) leaves it, and nothing else
    would (issue 48: three killed exports piled up beside --out). The pid in the name tells an abandoned
    one from one a live export or import is filling (kept, as is a name without a pid: not ours), as
    ``data/staging.py`` sweeps the cache's staging folders by their locks. Errors are ignored: sweeping is
    housekeeping, never the job at hand.
    """
    removed: list[Path] = []
    try:
        found = [p for p in parent.glob(f".tmp-{what}-*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for path in found:
        pid = path.name.rpartition("-")[2]
        if not pid.isdigit() or _process_alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists here (one of another user counts; pid 0 or ours is never swept)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by another user
        return True
    return True
