"""Which held-out tokens an evaluation scores: the documents protocol's spans (spread over the documents
or taken from the first ones), a digest of the targets, and the per-document sums the intervals need."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Literal, overload

import numpy as np
import torch

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.shards import TokenSplit


@overload
def collect_spans(
    split: TokenSplit,
    span_len: int,
    max_tokens: int,
    with_documents: Literal[False] = False,
    selection: str = "spread",
) -> tuple[np.ndarray, int, int]: ...


@overload
def collect_spans(
    split: TokenSplit,
    span_len: int,
    max_tokens: int,
    with_documents: Literal[True],
    selection: str = "spread",
) -> tuple[np.ndarray, int, int, np.ndarray]: ...


def collect_spans(
    split: TokenSplit, span_len: int, max_tokens: int, with_documents: bool = False, selection: str = "spread"
) -> tuple[np.ndarray, int, int] | tuple[np.ndarray, int, int, np.ndarray]:
    """Non-overlapping spans of ``span_len + 1`` tokens from documents long enough, up to a target budget
    of ``max(1, max_tokens // span_len)`` spans.

    ``selection`` "spread" reaches as many documents as the budget allows (``spread_counts``): each
    document's first span before any document's second, and evenly spaced documents when the budget holds
    fewer spans than there are documents. "first" fills the budget from the first documents, as every
    evaluation did before (a few long documents gave all the spans, so the intervals were wide).
    Returns (spans (n, span_len + 1) int64 in document order, documents used, documents skipped as too
    short), and with ``with_documents`` a fourth item: the split index of each span's document, (n,) int64.
    """
    lengths = np.asarray(split.doc_lengths)
    long_enough = np.flatnonzero(lengths >= span_len + 1)
    skipped = int(len(lengths) - len(long_enough))
    if len(long_enough) == 0:
        longest = int(lengths.max()) if len(lengths) else 0
        raise UserError(
            f"no held-out document has the {span_len + 1} tokens the longest length needs (the longest has "
            f"{longest}); use lengths whose longest window is at most {max(longest - 1, 0)} tokens, "
            "--protocol stream (documents joined), or another corpus."
        )
    budget = max(1, max_tokens // span_len)
    counts = (lengths[long_enough] - 1) // span_len  # spans each document holds
    if selection == "first":
        before = np.cumsum(counts) - counts
        take = np.clip(budget - before, 0, counts)
    else:
        take = spread_counts(counts, budget)
    spans, owners = [], []
    for d, n in zip(long_enough[take > 0].tolist(), take[take > 0].tolist()):
        doc = np.asarray(split.doc(d))
        for s in range(n):
            spans.append(doc[s * span_len : s * span_len + span_len + 1].astype(np.int64))
            owners.append(d)
    out = (np.stack(spans), int((take > 0).sum()), skipped)
    return (*out, np.asarray(owners, dtype=np.int64)) if with_documents else out


def spread_counts(counts: np.ndarray, budget: int) -> np.ndarray:
    """How many of its ``counts[d]`` items to take from each document for ``budget`` items in all, reaching
    as many documents as possible: round r takes the r-th item of every document that has one while the
    budget lasts; the round the budget runs out in takes evenly spaced documents (the i-th of m drawn from n
    is ``i * n // m``), so a small budget samples the whole split, not its first documents."""
    counts = np.asarray(counts, dtype=np.int64)
    take = np.zeros_like(counts)
    left, r = int(budget), 0
    while left > 0:
        have = np.flatnonzero(counts > r)
        if len(have) == 0:
            break
        if len(have) > left:
            have = have[(np.arange(left) * len(have)) // left]
        take[have] += 1
        left -= len(have)
        r += 1
    return take


def targets_digest(targets: np.ndarray, owners: np.ndarray) -> str:
    """A digest of the scored target tokens and the documents they belong to, recorded in every row: reports
    pair two cells only when they scored the same targets (e.g. never two lengths of a sweep that evaluates
    each length alone, whose spans differ)."""
    h = hashlib.sha256(np.ascontiguousarray(targets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(owners, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def per_document(losses: torch.Tensor, owners: np.ndarray) -> dict[str, list]:
    """Per-document loss sums (float64) and scored token counts of (n_spans, span_len) losses, in document
    order; ``owners`` gives each span's document (n_spans,) or each target's (n_spans, span_len), as a
    stream block's targets may belong to several documents."""
    owners = np.asarray(owners)
    if owners.ndim == 1:
        owners = np.repeat(owners[:, None], losses.shape[1], axis=1)
    docs, which = np.unique(owners.ravel(), return_inverse=True)
    sums = losses.double().reshape(-1).numpy()
    return {
        "doc_index": docs.tolist(),
        "doc_loss_sums": np.bincount(which, weights=sums, minlength=len(docs)).tolist(),
        "doc_tokens": np.bincount(which, minlength=len(docs)).tolist(),
    }
