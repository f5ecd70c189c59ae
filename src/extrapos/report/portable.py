"""Results that mean the same in any clone: the paths a saved result names (its run, the data it scored,
the runs of its parts and seeds) written relative to the folder the result is saved in, or to the data
cache, never as this machine's absolute paths (issue 47: committed results.json files named
/work/runs/... and /root/.cache/... of the machine that ran them).

A path inside the result's folder becomes relative to it (``runs/rope``); one inside the data cache
becomes ``$EXTRAPOS_CACHE/<rest>`` (the cache is wherever that variable points, docs/data.md); any other
becomes relative to the folder as well (``../other/runs/rope``), which holds while the two trees move
together. Only the keys below are rewritten; numbers and every other field are left as they are.

``portable_tree`` applies the same rule to every string of a JSON document that is an absolute path, under
any key and at any depth: the committed readings that are not comparison results (``extrapos attention``,
``extrapos ruler``, lm-eval, gpu-run) name their run, tokenizer or install under keys of their own, and a
test (tests/report/test_portable.py) refuses an absolute path in any committed JSON under docs/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

#: the fields of a result that hold a path (``run`` may be a list: one run per seed)
PATH_KEYS = ("run", "data_dir")
#: the fields that nest whole results (an extension's parts, a row's seeds)
NESTED_KEYS = ("parts", "seeds")
CACHE = "$EXTRAPOS_CACHE"


def portable_path(value: str, folder: Path, cache: Path) -> str:
    """``value`` as the module docstring says; a relative path (already portable) is kept."""
    path = Path(value)
    if not path.is_absolute():
        return value
    for root, prefix in ((folder, None), (cache, CACHE)):
        try:
            rest = path.resolve().relative_to(root.resolve())
        except ValueError:
            continue
        return rest.as_posix() if prefix is None else f"{prefix}/{rest.as_posix()}"
    return Path(os.path.relpath(path.resolve(), folder.resolve())).as_posix()


def is_absolute_path(value: Any) -> bool:
    """A string that names this machine's file system from its root (``/tmp/x``, not ``/`` alone, a URL
    or ``$EXTRAPOS_CACHE/...``)."""
    return isinstance(value, str) and re.match(r"/[\w.~-]", value) is not None


def portable_tree(doc: Any, folder: Path, cache: Path) -> Any:
    """A copy of the JSON document ``doc`` with every absolute path in it made portable (module docstring);
    numbers, other strings and the order of keys are left as they are."""
    if isinstance(doc, dict):
        return {k: portable_tree(v, folder, cache) for k, v in doc.items()}
    if isinstance(doc, list):
        return [portable_tree(v, folder, cache) for v in doc]
    return portable_path(doc, folder, cache) if is_absolute_path(doc) else doc


def portable(result: Any, folder: Path, cache: Path | None = None) -> Any:
    """A copy of ``result`` (a saved result, or a list of them) with its paths made portable."""
    if cache is None:
        from extrapos.data.cache import cache_root

        cache = cache_root()
    if isinstance(result, list):
        return [portable(r, folder, cache) for r in result]
    if not isinstance(result, dict):
        return result
    out = dict(result)
    for key in PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str):
            out[key] = portable_path(value, folder, cache)
        elif isinstance(value, list):
            out[key] = [portable_path(v, folder, cache) if isinstance(v, str) else v for v in value]
    for key in NESTED_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [portable(r, folder, cache) for r in out[key]]
    return out
