"""RULER's metric (Hsieh et al. 2024, §3 and Appendix B): string-match recall of the references in the
generated text, case-insensitive; and beside it our exact match (``exact``), which echoing cannot win.

* "all" (NIAH, variable tracking, common and frequent words): the fraction of the references found in the
  prediction, averaged over the examples;
* "part" (QA): 1 when any reference is found in the prediction, else 0, averaged.

A task's score is that average as a percentage rounded to two decimals (``task_score``); the per-example
values (``recall``) are what the intervals resample. A prediction is the greedy continuation decoded,
stripped and with control characters turned into line breaks, as RULER's evaluation post-processes it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's cleaning of a prediction: stripped, control characters (newlines, tabs...) made line
    breaks, stripped again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def recall(prediction: str, references: Sequence[str], kind: str) -> float:
    """One example's string-match recall: "all" (the fraction of ``references`` in ``prediction``) or
    "part" (whether any of them is)."""
    if kind not in ("all", "part"):
        raise ValueError(f"unknown RULER metric {kind!r}")
    found = [r.lower() in prediction.lower() for r in references]
    if kind == "part":
        return float(any(found))
    return sum(found) / len(found)


def exact(prediction: str, target: str) -> float:
    """1 when the prediction is the answer as the task writes it (``target``, the answer tokens a model
    is trained on) followed by nothing that extends it (the end, punctuation or a space), else 0;
    case-insensitive. Not RULER's metric: recall can be won without the answer at small sizes, by a
    prediction that echoes the prompt (every needle in it) or by any text holding the one-letter names
    of variable tracking and frequent words (issue 47); this one cannot."""
    p, t = prediction.strip().lower(), target.strip().lower()
    if not t or not p.startswith(t):
        return 0.0
    rest = p[len(t) :]
    return float(not rest or not rest[0].isalnum())


def task_score(predictions: Sequence[str], references: Sequence[Sequence[str]], kind: str) -> float:
    """A task's score over its examples, in percent, rounded to 2 decimals (as RULER reports it)."""
    values = [recall(p, r, kind) for p, r in zip(predictions, references)]
    return round(100 * sum(values) / len(values), 2)
