"""lm-eval imported and its own tasks indexed once, in the fault matrix's fork server (``Server.preload``).

``extrapos lm-eval`` builds a ``TaskManager`` of the harness's bundled tasks beside ``--include-path``'s: it
parses the harness's 14,000-odd task YAMLs, about 15 s of a two-core machine, in every case. The index is a
pure function of those read-only files, so it is built here once, before the first fork, and each child's
``TaskIndex.build`` takes a copy of it for that folder (an ``--include-path`` folder is still indexed in the
child, as the command does). Nothing the command writes changes: the index is only read.
"""

from __future__ import annotations

from pathlib import Path

import lm_eval.tasks.manager as manager
from lm_eval.tasks._index import TaskIndex

import extrapos.integrations.lm_eval  # noqa: F401  (registers the model; imports lm_eval, datasets)

DEFAULTS = Path(manager.__file__).parent  # the folder TaskManager indexes for include_defaults
_real_build = TaskIndex.build
_defaults = _real_build([DEFAULTS])


def _build(paths, *, resolve_includes=True):
    index: dict = {}
    for root in paths:
        if Path(root) == DEFAULTS and resolve_includes:
            index.update(_defaults)
        else:
            index.update(_real_build([root], resolve_includes=resolve_includes))
    return index


TaskIndex.build = staticmethod(_build)  # type: ignore[method-assign]
