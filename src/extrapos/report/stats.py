"""How sure a table is: bootstrap intervals over documents, paired differences, and seeds (numpy only).

The unit of resampling is the held-out *document*, never the token: tokens of one document share
its topic, speaker and style, so their losses are correlated and a token bootstrap would give
intervals that are far too narrow (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*,
ch. 8: resample the independent units of a structured sample). A cell's statistic is the table's
own number, the mean token loss ``sum of token losses / number of tokens`` over the resampled
documents (a ratio estimator, so a long document weighs by its tokens, as in the table).

* **One seed**: percentile interval of that ratio over ``resamples`` document resamples
  (Efron & Tibshirani 1993, §13.3).
* **Paired difference** (a row minus the baseline): every row scores the same documents, so each
  resample draws one set of documents and applies it to both rows; the document-to-document
  variation both rows share cancels, which is what makes small differences measurable.
* **Seeds** (several training runs of a row): a crossed two-level bootstrap. Every seed scores the
  same documents, so documents and seeds are crossed, not nested: each replicate draws documents
  (one draw, applied to every seed) and, independently, ``S`` seeds with replacement, and averages
  the drawn seeds' per-seed statistics (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat.
  1(2): the rows and the columns of a crossed design resampled independently). A bootstrap of
  ``S`` values underestimates their variance by ``(S - 1) / S``; the seed deviations are rescaled
  by ``sqrt(S / (S - 1))`` to undo it (Davison & Hinkley 1997, *Bootstrap Methods*, §3.8 on
  hierarchical data). With three seeds the seed part of the interval rests on three numbers and is coarse
  (a t-interval with 2 degrees of freedom is usually wider): the report also prints the
  across-seed standard deviation, the direct measure of training noise, and, below 5 seeds, Student's
  t-interval over the per-seed values (``t_interval``), which takes the seed count at its word.

The generators are seeded (``BOOTSTRAP_SEED``), documents and seeds from two separate streams, so a
report re-rendered from the same results is byte-identical, and a row whose seeds all agree gets
exactly the single-seed interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

BOOTSTRAP_SEED = 14
#: Student's t 97.5% quantile by degrees of freedom, for the t-interval over 2-9 seeds (no scipy here)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
#: below this many seeds a table prints the t-interval over the seeds beside the crossed bootstrap's
FEW_SEEDS = 5
LEVEL = 0.95
RESAMPLES = 2000
_CHUNK = 500  # replicates drawn at a time: bounds memory at _CHUNK x documents floats
# Fewest documents a console interval is printed for: resampling n documents gives at most
# C(2n - 1, n) distinct means (1 for one document, 35 for four), so below five the 2.5 / 97.5
# percentiles are a handful of values near the extremes, not a 95% interval.
MIN_DOCUMENTS = 5


@dataclass(frozen=True)
class Interval:
    estimate: float  # the statistic on the data itself (mean over seeds of per-seed values)
    low: float
    high: float
    seeds: int = 1
    seed_sd: float | None = None  # sample standard deviation of the per-seed values (None with one seed)
    documents: int = 0

    def contains(self, value: float = 0.0) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True)
class Samples:
    """Per-document loss sums and token counts of one cell, one row per seed: arrays (seeds, documents)."""

    doc_index: tuple[int, ...]
    sums: np.ndarray
    counts: np.ndarray


def loss_interval(
    sums: ArrayLike,
    counts: ArrayLike,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """Interval of the mean token loss; ``sums``/``counts`` are (documents,) or (seeds, documents)."""
    s, c = _as_2d(sums), _as_2d(counts)
    return _bootstrap([(1.0, s, c)], level, resamples, seed)


def paired_difference(
    sums: ArrayLike,
    counts: ArrayLike,
    ref_sums: ArrayLike,
    ref_counts: ArrayLike,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """Interval of (row - reference) mean token loss over the same documents (and the same seeds, paired)."""
    a, ca, b, cb = _as_2d(sums), _as_2d(counts), _as_2d(ref_sums), _as_2d(ref_counts)
    if a.shape != b.shape:
        raise ValueError(f"paired rows need the same seeds and documents, got {a.shape} and {b.shape}")
    return _bootstrap([(1.0, a, ca), (-1.0, b, cb)], level, resamples, seed)


def _as_2d(x: ArrayLike) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return a[None, :] if a.ndim == 1 else a


def _per_seed(parts: list[tuple[float, np.ndarray, np.ndarray]], weights: np.ndarray) -> np.ndarray:
    """(replicates, seeds): the statistic of each seed under document weights (replicates, documents)."""
    out: np.ndarray | float = 0.0
    for sign, s, c in parts:
        out = out + sign * (weights @ s.T) / (weights @ c.T)
    assert isinstance(out, np.ndarray)  # parts holds one term at least (the caller reads parts[0])
    return out


def _bootstrap(
    parts: list[tuple[float, np.ndarray, np.ndarray]], level: float, resamples: int, seed: int
) -> Interval:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    n_seeds, n_docs = parts[0][1].shape
    if n_docs == 0:
        raise ValueError("no documents to resample")
    point = _per_seed(parts, np.ones((1, n_docs)))[0]
    doc_rng = np.random.default_rng([seed, 0])
    seed_rng = np.random.default_rng([seed, 1])
    inflate = math.sqrt(n_seeds / (n_seeds - 1)) if n_seeds > 1 else 0.0
    replicates = []
    for start in range(0, resamples, _CHUNK):
        b = min(_CHUNK, resamples - start)
        weights = doc_rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=b).astype(np.float64)
        per_seed = _per_seed(parts, weights)
        centre = per_seed.mean(axis=1)
        if n_seeds > 1:
            drawn = seed_rng.integers(0, n_seeds, size=(b, n_seeds))
            deviations = np.take_along_axis(per_seed - centre[:, None], drawn, axis=1).mean(axis=1)
            centre = centre + inflate * deviations
        replicates.append(centre)
    low, high = np.quantile(np.concatenate(replicates), [(1 - level) / 2, (1 + level) / 2])
    return Interval(
        float(point.mean()),
        float(low),
        float(high),
        n_seeds,
        float(point.std(ddof=1)) if n_seeds > 1 else None,
        n_docs,
    )


# ---- saved evaluation results ------------------------------------------------------------------------


def cell_samples(result: dict[str, Any], ev: int) -> Samples | None:
    """The per-document data of one length of a result (a plain one, or one combined over seeds).

    None when a part was saved before evaluations recorded per-document losses, or when the seeds
    did not score the same documents (then no interval can be formed honestly).
    """
    parts = result.get("seeds") or [result]
    docs, sums, counts = None, [], []
    for part in parts:
        row = next((r for r in part.get("results", []) if r.get("ev") == ev), None)
        if row is None or "doc_loss_sums" not in row or "doc_index" not in row:
            return None
        index = tuple(row["doc_index"])
        if docs is not None and (index != docs or row["doc_tokens"] != counts[0].tolist()):
            return None
        docs = index
        sums.append(np.asarray(row["doc_loss_sums"], dtype=np.float64))
        counts.append(np.asarray(row["doc_tokens"], dtype=np.float64))
    if not docs:
        return None
    return Samples(docs, np.stack(sums), np.stack(counts))


def length_interval(result: dict[str, Any], ev: int) -> tuple[Interval | None, str]:
    """The 95% interval of one length's mean token loss (``loss_interval`` over the documents that
    ``cell_samples`` reads), or None and the reason in words: too few documents, or none recorded."""
    samples = cell_samples(result, ev)
    if samples is None:
        return None, "no per-document losses recorded (a result of an older extrapos)"
    n = len(samples.doc_index)
    if n < MIN_DOCUMENTS:
        return None, f"too few documents for an interval ({n}; it needs {MIN_DOCUMENTS})"
    interval = loss_interval(samples.sums, samples.counts)
    return interval, f"[{interval.low:.4f}, {interval.high:.4f}]"


def length_difference(result: dict[str, Any], ev: int, ref_ev: int) -> tuple[Interval | None, str]:
    """The paired 95% interval of one length's loss minus the reference length's (``ref_ev``, usually 1x),
    within one result: every length scores the same target tokens, so one resample of the documents
    (and seeds) is applied to both lengths and the document-to-document spread they share cancels. This is
    the number a reader judges ("does the loss rise past L_t?"); the per-length intervals are far wider
    than it. None and the reason in words when the two lengths did not score the same targets, when
    per-document losses were not recorded, or when there are too few documents."""
    if ev == ref_ev:
        return None, "reference"
    mine, ref = cell_samples(result, ev), cell_samples(result, ref_ev)
    if mine is None or ref is None:
        return None, "no per-document losses recorded"
    digests = {
        r.get("targets")
        for r in result.get("results", [])
        if r.get("ev") in (ev, ref_ev) and r.get("targets")
    }
    if (
        len(digests) > 1
        or mine.doc_index != ref.doc_index
        or mine.sums.shape != ref.sums.shape
        or not (mine.counts == ref.counts).all()
    ):
        return None, "different target tokens (not paired)"
    n = len(mine.doc_index)
    if n < MIN_DOCUMENTS:
        return None, f"too few documents ({n})"
    d = paired_difference(mine.sums, mine.counts, ref.sums, ref.counts)
    return d, f"{d.estimate:+.4f} [{d.low:+.4f}, {d.high:+.4f}]" + (
        " within noise" if d.contains(0.0) else ""
    )


def protocol_of(result: dict[str, Any]) -> tuple[str, str | None, str]:
    """(protocol, boundary, selection) of a saved evaluation, read from its request: ``documents`` (spans
    inside documents) or ``stream`` (documents joined, ``boundary`` cross or mask), and which targets were
    chosen. A result saved before these fields existed scored the documents protocol's spans from the first
    documents (``selection`` "first")."""
    req = result.get("request") or {}
    return req.get("protocol", "documents"), req.get("boundary"), req.get("selection", "first")


def protocol_id(result: dict[str, Any]) -> str:
    """A short name of a result's protocol (a CSV column, a plot folder): documents, documents-first,
    stream-cross, stream-mask."""
    protocol, boundary, selection = protocol_of(result)
    if protocol == "stream":
        return f"stream-{boundary}"
    return "documents" if selection == "spread" else f"documents-{selection}"


PROTOCOL_NAMES = {
    "documents": "documents (each window inside one held-out document, spans spread over the documents)",
    "documents-first": (
        "documents, spans from the first held-out documents (results saved before targets were spread)"
    ),
    "stream-cross": "stream, context crossing documents (held-out documents joined with end-of-text)",
    "stream-mask": "stream, document-masked (a target sees only its own document)",
}


def protocol_name(result: dict[str, Any]) -> str:
    """A result's protocol in words, as reports and facts name it."""
    short = protocol_id(result)
    return PROTOCOL_NAMES.get(short, short)


def same_targets(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two results scored the same held-out data the same way (then their documents can be paired):
    a masked-LM result and a next-token one never are, nor MLM results of different mask seeds, nor results
    of different protocols or target selections."""
    return (
        a.get("data_dir") == b.get("data_dir")
        and a.get("split") == b.get("split")
        and a.get("objective", "lm") == b.get("objective", "lm")
        and a.get("mask_seed") == b.get("mask_seed")
        and protocol_of(a) == protocol_of(b)
    )


def t_interval(values: list[float]) -> tuple[float, float] | None:
    """Student's t 95% interval for the mean of ``values`` (2-9 of them: one per training seed), None
    outside that range. It treats the seeds as the only noise, the reading a sentence about S seeds makes."""
    if len(values) - 1 not in T_975:
        return None
    half = T_975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))
    mean = statistics.fmean(values)
    return mean - half, mean + half
