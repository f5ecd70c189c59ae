"""RULER's metric (Hsieh et al. 2024, §3 and Appendix B): string-match recall of the references in the
generated text, case-insensitive.

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


def task_score(predictions: Sequence[str], references: Sequence[Sequence[str]], kind: str) -> float:
    """A task's score over its examples, in percent, rounded to 2 decimals (as RULER reports it)."""
    values = [recall(p, r, kind) for p, r in zip(predictions, references)]
    return round(100 * sum(values) / len(values), 2)
