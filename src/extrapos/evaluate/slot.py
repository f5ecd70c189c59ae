"""The result slot every evaluator shares: where its result goes, whether a saved one is reused, and how it
is written.

A result is ``RUN/<folder>/<name>.json`` (``eval``; ``attention`` for the diagnostics), ``name`` a plain
file name, never a path. Before any work the slot reads what that file holds:

* the same request scored on the same weights (under the same definitions): reused as it is;
* a request an older extrapos wrote for what is now another request (``older``): scored again;
* another request: refused in one sentence, the file kept, unless ``overwrite``;
* the same request of other weights (the run was trained further) or a damaged file: scored again.

What "the same" means is each evaluator's: the fields a saved result must hold (a key of the request,
or the request itself and the checkpoint it scored). The result is written atomically, refused in one
sentence when it holds a NaN or an infinity, by rank 0 alone under torchrun, every process waiting at a
barrier until it is on disk.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from extrapos.errors import UserError
from extrapos.files import atomic_write, ensure_writable_dir, finite_json, sweep_temporaries_of

logger = logging.getLogger(__name__)

#: a field a saved result must not hold (an older result's missing field)
ABSENT = object()

MAX_NAME = 120  # with .json and a lock's prefix and suffix, well within a file name's 255 bytes
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")


def check_result_name(name: str) -> str:
    """A result name is one file name inside RUN/eval/: no path separators, no leading dot, at most 120
    characters."""
    if len(name) > MAX_NAME:
        raise UserError(
            f"result name of {len(name)} characters is too long (at most {MAX_NAME}); choose a shorter "
            "--name."
        )
    if not _NAME.fullmatch(name) or ".." in name:
        raise UserError(
            f"result name {name!r} must be a plain file name (letters, digits, . _ + = -), with no "
            "path separators; choose another --name."
        )
    return name


def request_name(parts: Sequence[str], request: Any) -> str:
    """A default result name: the readable ``parts`` (slugged, joined by "-", cut to fit ``MAX_NAME``) and a
    digest of the whole ``request`` dataclass, so an equal request keeps its name (its result is reused) and a
    different one never takes another's (issue 48: passkey's and RULER's names of a few fields collided)."""
    text = json.dumps(asdict(request), sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    readable = "-".join(slug(str(p)) for p in parts)[: MAX_NAME - len(digest) - 1].rstrip("-")
    return f"{readable}-{digest}"


def results_dir(run_dir: Path, folder: str = "eval") -> Path:
    """RUN/<folder> (``eval``; ``attention`` for the diagnostics), refused when it is a symlink or a file
    (results must land inside the run)."""
    out = Path(run_dir) / folder
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(
            f"{out} is a symlink or a file, not a directory of the run; remove it and evaluate again."
        )
    return out


def slug(text: str, keep: str = ".+_-", empty: str = "x") -> str:
    """``text`` as a piece of a result name: letters, digits and ``keep``, anything else an underscore, at
    most 60 characters (``empty`` when nothing is left). `extrapos eval` keeps no ``-`` (it joins its
    pieces with them) and names an empty piece ``eval``; the task evaluators keep ``-``."""
    return "".join(c if c.isalnum() or c in keep else "_" for c in text).strip("_")[:60] or empty


def jsonable(value: Any) -> Any:
    """``value`` as a saved result reads it back (tuples as lists, other objects as their text)."""
    return json.loads(json.dumps(value, default=str))


def scored_checkpoint(run: Any, step: int | None) -> tuple[Any, str]:
    """The checkpoint a result scores (``step``, default the latest intact one) and the sha256 of its
    weights; ``run`` a ``run.handle.Run`` (it looks each step up once) or a run directory."""
    from extrapos.run.handle import Run

    return Run.open(run).checkpoint(step)


@dataclass
class ResultSlot:
    """Where a result goes and what identifies it: the checkpoint it scores (its step and the digest of
    its weights, so a run trained further is scored again, never answered from an older result), the
    evaluation keys of the keyed results (``evaluate``, ``attention_stats``), and ``previous``: the saved
    result of this very evaluation, if any (then it is reused)."""

    out_path: Path
    previous: dict[str, Any] | None
    ckpt: Any
    digest: str
    key: str = ""
    request_key: str = ""
    lock: Any = None  # run.lock.ResultLock, held from the decision to score until the result is written

    @property
    def checkpoint(self) -> dict[str, Any]:
        """The checkpoint as a task result records it."""
        return {"step": self.ckpt.step, "weights_sha256": self.digest}

    def write(self, result: dict[str, Any], options: dict[str, Any] | None, what: str = "result") -> None:
        """Write ``result`` atomically; one holding a NaN or an infinity is refused in one sentence naming
        ``options`` and nothing is written (``files.finite_json``). Under torchrun every process holds the
        whole result and refuses it alike (so none waits at the barrier alone); rank 0 writes it, and every
        process waits until it is on disk before looking for it again."""
        from extrapos.run.runtime import barrier, process_group

        try:
            text = finite_json(result, options, what)
            if process_group()[0] == 0:
                atomic_write(self.out_path, text)
        finally:
            self.release()
        barrier()

    def release(self) -> None:
        """Let the next request of this name go on (it then reads what was written)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _holds(saved: dict[str, Any], fields: dict[str, Any]) -> bool:
    return all(saved.get(k, ABSENT) == v for k, v in fields.items())


def _read(path: Path) -> dict[str, Any] | None:
    """A saved result, or None when the file is damaged (then it is scored again and replaced)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def open_slot(
    run_dir: Path,
    name: str,
    ckpt: Any,
    digest: str,
    *,
    request: dict[str, Any],
    result: dict[str, Any],
    overwrite: bool,
    refusal: str,
    folder: str = "eval",
    writes: str = "evaluation results",
    older: Sequence[tuple[dict[str, Any], str | None]] = (),
    stale: Callable[[dict[str, Any]], str] | None = None,
    key: str = "",
    request_key: str = "",
) -> ResultSlot:
    """The slot of ``RUN/<folder>/<name>.json``: the saved result is reused when it holds the fields of
    ``result`` (this request on these weights); scored again when it holds one of ``older`` (a request an
    older extrapos wrote; its note printed when given); refused with ``{path} <refusal>`` when it does not
    hold ``request``; scored again otherwise (``stale``: the note printed then). ``overwrite`` replaces
    whatever is there. A slot to be written gets a writable directory now, before the work (``writes``
    names what goes there).

    A slot that will score holds the name's lock (``run.lock.ResultLock``) until its result is written: a
    second request of the same name waits for it, then reads the result again, so it is reused or
    refused, never written over (under torchrun rank 0 refuses at once instead of waiting)."""
    out_path = results_dir(run_dir, folder) / f"{check_result_name(name)}.json"
    slot = ResultSlot(out_path, None, ckpt, digest, key, request_key)
    saved = None if overwrite or not out_path.is_file() else _read(out_path)
    # a result is written whole (atomically), so what is there now decides without a lock: reused even in
    # a read-only run, another request refused before anything is written
    _decide(slot, saved, result, request, refusal, older, stale, notes=False)
    if slot.previous is not None:
        return slot
    ensure_writable_dir(out_path.parent, writes)
    slot.lock = _lock(out_path)
    if slot.lock is not None:  # no other writer of this name now: what a killed one left before its rename
        sweep_temporaries_of(out_path)
    try:
        saved = (
            None if overwrite or not out_path.is_file() else _read(out_path)
        )  # once a concurrent write is done
        _decide(slot, saved, result, request, refusal, older, stale)
    except BaseException:
        slot.release()
        raise
    if slot.previous is not None:
        slot.release()
    return slot


def _lock(out_path: Path) -> Any:
    """The result's lock, waited for in a single process; under torchrun rank 0 alone takes it, and
    refuses at once (the other ranks cannot wait with it), the others none."""
    from extrapos.run.lock import ResultLock
    from extrapos.run.runtime import process_group

    rank, world = process_group()
    if rank != 0:
        return None
    return ResultLock(out_path).acquire(wait=world == 1, say=logger.info)


def _decide(
    slot: ResultSlot,
    saved: dict[str, Any] | None,
    result: dict[str, Any],
    request: dict[str, Any],
    refusal: str,
    older: Sequence[tuple[dict[str, Any], str | None]],
    stale: Callable[[dict[str, Any]], str] | None,
    notes: bool = True,
) -> None:
    """Reuse ``saved`` (``slot.previous``), score again (printing the note of ``older`` or ``stale`` when
    ``notes``) or refuse with ``{path} <refusal>``."""
    out_path = slot.out_path
    if saved is not None:
        if _holds(saved, result):
            slot.previous = saved
            return
        again = next(((fields, note) for fields, note in older if _holds(saved, fields)), None)
        if again is not None:
            if again[1] and notes:
                logger.info(again[1])
        elif not _holds(saved, request):
            raise UserError(f"{out_path} {refusal}")
        elif stale is not None and notes:
            logger.info(stale(saved))


#: what a task result under a name that holds another request says
TASK_REFUSAL = "holds a different evaluation; pass another --name to keep both or --overwrite to replace it."


def task_slot(
    run: Any,
    name: str,
    request: dict[str, Any],
    step: int | None,
    overwrite: bool,
    older: Sequence[tuple[dict[str, Any], str | None]] = (),
    form: dict[str, Any] | None = None,
) -> ResultSlot:
    """The slot of a task result (passkey, RULER, synthetic tasks, lm-eval): it records its ``request`` and
    the ``checkpoint`` it scored, and is reused when both are the same (and it holds ``form``: how the result
    is made where that changed while its request did not, e.g. RULER's ranking draw); ``run`` a
    ``run.handle.Run``."""
    ckpt, digest = run.checkpoint(step)
    saved_request = {"request": jsonable(request)}
    checkpoint = {"checkpoint": {"step": ckpt.step, "weights_sha256": digest}}
    return open_slot(
        run.path,
        name,
        ckpt,
        digest,
        request=saved_request,
        result={**saved_request, **checkpoint, **(form or {})},
        overwrite=overwrite,
        refusal=TASK_REFUSAL,
        older=older,
    )
