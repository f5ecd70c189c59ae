"""Three copier baselines of RULER's ranking form: reference "models" that run no network and pick a
candidate by a shallow rule over the prompt's tokens (issue 47).

The ranking form (``extrapos.tasks.ruler``, ``--mode rank``) asks a model to rank the true answer above
``candidates - 1`` wrong ones made of values that occur in the prompt, so that a model which merely copies an
in-context value is right only by chance, 1 / candidates. A copier tests that claim: it knows where and how
often each candidate's values occur in the prompt, nothing else.

* ``recency``: the candidate whose values occur last (the mean over its values of their last occurrence),
  closest to the question: a model attending to the most recent value;
* ``primacy``: the candidate whose values occur first (the mean of their first occurrences);
* ``counting``: the candidate whose values occur most often (their occurrences summed): a model preferring
  frequent tokens. For cwe and fwe counting is the task's skill (``SKILL``), not a leak.

An occurrence is the value's tokens (encoded as the prompt encodes it, after a space) as a run of the
prompt's tokens; a value that does not occur counts as the earliest (recency), the latest (primacy) and
never (counting). Ties are broken by a seeded draw, so a copier that cannot tell the candidates apart is
right 1 / candidates of the time. Torch-free: the report and the tests run them on prompts alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from extrapos.data.ruler_tasks import answer_values

if TYPE_CHECKING:
    from extrapos.data.ruler_prompts import RulerPrompt

COPIERS = ("recency", "primacy", "counting")
#: the copier that is a task's own skill (the most frequent words are cwe's and fwe's answers)
SKILL = {"cwe": "counting", "fwe": "counting"}


def occurrences(tokens: Sequence[int] | np.ndarray, value: Sequence[int]) -> list[int]:
    """The start positions at which ``value``'s tokens occur as a run of ``tokens``."""
    seq, n = np.asarray(tokens), len(value)
    if n == 0 or n > len(seq):
        return []
    starts = np.flatnonzero(seq[: len(seq) - n + 1] == value[0])
    for k in range(1, n):  # keep the starts whose k-th token matches too
        starts = starts[seq[starts + k] == value[k]]
    return [int(i) for i in starts]


def candidate_scores(prompt: RulerPrompt, encode: Callable[[str], list[int]]) -> dict[str, np.ndarray]:
    """Each copier's score of each candidate, the true answer first (the highest score is picked)."""
    tokens = np.asarray(prompt.tokens)
    if len(prompt.wrong_text) != len(prompt.wrong):
        raise ValueError("a copier needs the wrong answers' texts (RulerPrompt.wrong_text: RulerBuilder's)")
    texts = [prompt.text.target, *prompt.wrong_text]
    cache: dict[str, tuple[float, float, int]] = {}
    scores = {c: np.zeros(len(texts)) for c in COPIERS}
    for j, text in enumerate(texts):
        stats = []
        for value in answer_values(prompt.task, text):
            if value not in cache:
                at = occurrences(tokens, encode(value))
                cache[value] = (
                    (float(min(at)), float(max(at)), len(at)) if at else (float(len(tokens)), -1.0, 0)
                )
            stats.append(cache[value])
        first, last, count = (np.asarray(s, dtype=np.float64) for s in zip(*stats))
        scores["recency"][j] = last.mean()
        scores["primacy"][j] = -first.mean()
        scores["counting"][j] = count.sum()
    return scores


def choices(
    prompt: RulerPrompt, encode: Callable[[str], list[int]], rng: np.random.Generator
) -> dict[str, int]:
    """The candidate each copier picks (0: the true answer), ties broken by a draw from ``rng``."""
    out = {}
    for copier, s in candidate_scores(prompt, encode).items():
        best = np.flatnonzero(s == s.max())
        out[copier] = int(best[int(rng.integers(len(best)))])
    return out


def copier_hits(
    prompts: Sequence[RulerPrompt], encode: Callable[[str], list[int]], rng: np.random.Generator
) -> dict[str, list[int]]:
    """Per copier, per prompt: 1 where it picks the true answer."""
    hits: dict[str, list[int]] = {c: [] for c in COPIERS}
    for p in prompts:
        for copier, j in choices(p, encode, rng).items():
            hits[copier].append(int(j == 0))
    return hits


def copier_accuracy(
    prompts: Sequence[RulerPrompt], encode: Callable[[str], list[int]], rng: np.random.Generator
) -> dict[str, float]:
    """Each copier's accuracy over ``prompts`` (the ranking form's, with their wrong answers)."""
    return {c: float(np.mean(h)) if h else float("nan") for c, h in copier_hits(prompts, encode, rng).items()}


def copier_mean(cells: Sequence[dict[str, Any]], copier: str) -> float:
    """A copier's mean accuracy over result cells (one length's tasks) that hold it, leaving out the tasks
    whose skill it is (counting on cwe and fwe); nan when none is left."""
    values = [c["copiers"][copier] for c in cells if "copiers" in c and SKILL.get(c["task"]) != copier]
    return float(np.mean(values)) if values else float("nan")


__all__ = [
    "COPIERS",
    "SKILL",
    "candidate_scores",
    "choices",
    "copier_accuracy",
    "copier_hits",
    "copier_mean",
    "occurrences",
]
