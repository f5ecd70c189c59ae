"""Plug-ins from other packages: encodings, corpora and tasks a researcher ships in their own package.

A package declares them as entry points in its ``pyproject.toml``; ``pip install`` (or ``pip install -e``)
writes them into its dist-info, and extrapos reads them the first time it lists encodings or opens a
corpus by name::

    [project.entry-points."extrapos.encodings"]
    my-encodings = "mypkg.encodings"        # a module whose import calls extrapos.positions.register(...)

    [project.entry-points."extrapos.corpora"]
    my-corpus = "mypkg.corpus:documents"    # a function () -> iterable of (id, text) documents

    [project.entry-points."extrapos.tasks"]
    my-task = "mypkg.task:MyTask"           # a Task subclass (tasks/task.py): command, column, report

An encoding plug-in is a module (or a function) that registers its encodings the way a built-in file of
``positions/`` does; the entry point's name is only a label. A corpus plug-in's name is the corpus
name (``data.corpus = "my-corpus"``); its function yields ``(id, text)`` documents in a fixed order, ids
stable across machines (the train/val/test split hashes them). Prepared data is cached under the
corpus name and the plug-in package's version: a new version prepares anew.

A plug-in that fails to load (an import error, a name that is already taken) is named in one warning
and skipped; the built-ins and the other plug-ins load as before. ``examples/extrapos-toy-plugin`` is
a complete plug-in package; docs/plugins.md walks through it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

ENCODINGS = "extrapos.encodings"
CORPORA = "extrapos.corpora"
TASKS = "extrapos.tasks"  # a Task subclass or instance (tasks/task.py), read by the task registry


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """The installed entry points of ``group``, sorted by name (a stable order on every machine)."""
    return sorted(metadata.entry_points(group=group), key=lambda ep: ep.name)


def describe(ep: metadata.EntryPoint) -> str:
    """``name = value`` (and the distribution that declares it, when known), for messages."""
    dist = getattr(ep, "dist", None)
    owner = f" of {dist.metadata['Name']} {dist.version}" if dist is not None else ""
    return f"{ep.name!r} ({ep.value}){owner}"


def warn_broken(kind: str, ep: metadata.EntryPoint, error: BaseException) -> None:
    warnings.warn(
        f"extrapos skipped the {kind} plug-in {describe(ep)}: {type(error).__name__}: {error}. The built-in "
        f"{kind}s are unaffected; fix that package or uninstall it.",
        stacklevel=3,
    )


def load_encodings() -> list[str]:
    """Import every ``extrapos.encodings`` entry point (a module registers on import; a function is
    called); returns the labels of those that loaded. Called once, after the built-in encodings."""
    loaded = []
    for ep in entry_points(ENCODINGS):
        try:
            target = ep.load()
            if callable(target):
                target()
        except Exception as e:  # any plug-in failure is reported and skipped, never raised
            warn_broken("encoding", ep, e)
            continue
        loaded.append(ep.name)
    return loaded


def corpus_plugin(name: str) -> tuple[Callable[[], Iterable[tuple[str, str]]], str] | None:
    """The documents function of the corpus plug-in called ``name`` and a version string for the cache
    key, or None when no installed package declares it."""
    for ep in entry_points(CORPORA):
        if ep.name != name:
            continue
        dist = getattr(ep, "dist", None)
        version = f"{dist.metadata['Name']}=={dist.version}" if dist is not None else ep.value
        try:
            function: Any = ep.load()
        except Exception as e:
            from extrapos.errors import UserError

            raise UserError(
                f"The corpus plug-in {describe(ep)} could not be loaded ({type(e).__name__}: {e}); fix or "
                "reinstall that package."
            ) from e
        if not callable(function):
            from extrapos.errors import UserError

            raise UserError(
                f"The corpus plug-in {describe(ep)} names {type(function).__name__}, not a function; point "
                "its entry point at a function that returns (id, text) documents."
            )
        return function, version
    return None


def corpus_names() -> list[str]:
    """The names of the installed corpus plug-ins."""
    return [ep.name for ep in entry_points(CORPORA)]
