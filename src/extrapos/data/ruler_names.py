"""The names of RULER's 13 tasks (Hsieh et al., 2024, Table 2), apart from their generators so that the
command line can list them in `--help` without importing numpy (``ruler_tasks`` checks that its task
table has exactly these names, in this order)."""

from __future__ import annotations

TASK_NAMES = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
)
#: the tasks that need no provided data (QA reads SQuAD / HotpotQA files)
SYNTHETIC_TASKS = tuple(t for t in TASK_NAMES if not t.startswith("qa_"))
