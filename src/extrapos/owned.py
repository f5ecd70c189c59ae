"""Where a writer may write: it creates or replaces only files it owns (issue 37, the write discipline).

Every writer that takes a path from the user (``doctor --json``, ``bench --out``, ``report --out``,
``extend``/``train``/``import``/``export``/``compare``/``data prepare`` ``--out``) goes through here before
any work:

* **Never inside a run's own tree.** A run directory's files belong to the run: checkpoint pruning
  deletes ``checkpoints/step-*`` folders, a resume replaces ``config.toml``, ``metrics.jsonl`` and
  ``summary.json``, evaluations replace ``eval/*.json``. An output placed there (``extend RUN --out
  RUN/checkpoints/step-22``, ``doctor --json RUN/config.toml``) is deleted or replaces one of them, so it
  is refused; a run's results go through its result slots (``evaluate.slot``), which are not paths.
* **A file is replaced only when it is the writer's own**: a file it wrote before, recognised by what it
  holds (a doctor report, a bench table), never a user's file of the same name.

A directory a writer builds whole (a run, an export) must not exist yet (``files.fresh_output_dir``); one it
fills file by file (a compare, a report) carries its maker's marker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from extrapos.errors import UserError

#: what marks a directory as a run, beside its config.toml (a bare config.toml is a user's config)
RUN_MARKS = ("checkpoints", "summary.json", "source.json", "metrics.jsonl", "parent.json")


def _absolute(path: Path) -> Path:
    """``path`` made absolute with the links of its existing part resolved (what a write would reach)."""
    return Path(os.path.realpath(path))


def is_run_dir(path: Path) -> bool:
    """A run directory: a config.toml beside a checkpoint folder, a summary, a log or an import record."""
    return (path / "config.toml").is_file() and any((path / mark).exists() for mark in RUN_MARKS)


def enclosing_run(path: str | Path) -> Path | None:
    """The run directory that holds ``path`` (one of its parents, resolved), or None."""
    here = _absolute(Path(path))
    return next((d for d in here.parents if is_run_dir(d)), None)


def refuse_inside_run(path: str | Path, flag: str) -> None:
    """Refuse an output ``path`` inside a run's own tree (the run would delete or replace it)."""
    run = enclosing_run(path)
    if run is not None:
        raise UserError(
            f"{flag} {path} is inside the run {run}, whose checkpoint pruning, resumes and evaluations "
            "delete or replace what is there; choose a path outside the run."
        )


def json_with_keys(*keys: str) -> Callable[[Path], bool]:
    """A recogniser: the file is a JSON object holding every one of ``keys``."""

    def recognise(path: Path) -> bool:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(k in data for k in keys)

    return recognise


def check_owned_file(path: str | Path, flag: str, owner: str, recognise: Callable[[Path], bool]) -> Path:
    """Before any work: ``path`` may be written by ``owner`` (e.g. "extrapos doctor") when it is outside
    every run's tree and is either new or a file ``recognise`` says ``owner`` wrote before."""
    path = Path(path)
    refuse_inside_run(path, flag)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UserError(f"{flag} {path} is a link or a directory, not a file; give a new file name.")
    if path.exists() and not recognise(path):
        raise UserError(
            f"{flag} {path} already exists and is not a file {owner} wrote, so it is kept; choose a new "
            "file name or remove it first."
        )
    return path


def check_marked_dir(
    out: Path, flag: str, marker: str, owner: str, older: Callable[[set[str]], bool] = lambda _: False
) -> None:
    """Before any work: a directory ``owner`` fills file by file may be written when it is outside every
    run's tree and new, empty, holding ``marker`` (``owner`` made it) or, by ``older``, only what an older
    ``owner`` without the marker wrote."""
    refuse_inside_run(out, flag)
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"{flag} {out} is a file, not a directory; choose a new or empty directory.")
    entries = {p.name for p in out.iterdir()}
    if entries and marker not in entries and not older(entries):
        raise UserError(
            f"{flag} {out} is not empty and was not made by {owner} (it has no {marker}); choose a new or "
            "empty directory so that none of its files is replaced."
        )
