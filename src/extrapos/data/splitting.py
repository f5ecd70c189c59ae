"""Split rules: which tokens of the corpus are train, val and test, and the checks on the result.

Two rules (``--split-rule``), recorded in the manifest under ``split_rule``:

- ``document`` (default): a document goes whole to one split, by a hash of its id salted by the
  seed, so it never leaks between splits and its split does not depend on which other documents
  exist. With few documents the hash can leave a split empty (10 novels at 0.9/0.05/0.05 put all
  ten in train 59% of the time), so when a split with a non-zero fraction got no document and
  there are enough documents, the document whose hash lies nearest that split's interval is moved
  to it from the split with the most documents (recorded in the manifest's ``split_rule.moved``;
  then, and only then, a document's split depends on the others). A ``bpe:N`` tokenizer is
  trained before the move, so it has seen a moved document's text; the model never has.
- ``within``: every document is cut by its tokens into a train head, then ``gap`` tokens
  dropped, a val span, ``gap`` dropped, and a test tail, the spans in proportion to the
  fractions. Corpora of a few long documents (books, code repositories) get held-out text of
  every length that way; the gap keeps a held-out span from continuing a train span mid-sentence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from extrapos.errors import UserError

SPLITS = ("train", "val", "test")
SPLIT_RULES = ("document", "within")
DEFAULT_GAP_TOKENS = 64


def parse_split_rule(rule: str) -> str:
    rule = (rule or "").strip()
    if rule not in SPLIT_RULES:
        raise UserError(f"Unknown split rule '{rule}'; use --split-rule document or --split-rule within.")
    return rule


def unit_of(doc_id: str, seed: int = 0) -> float:
    """A uniform number in [0, 1) from a hash of (seed, id)."""
    digest = hashlib.blake2b(f"{seed}\0{doc_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def interval_of(split: str, fractions: Sequence[float]) -> tuple[float, float]:
    """The sub-interval of [0, 1) whose hashes fall in ``split``."""
    start = sum(fractions[: SPLITS.index(split)])
    return start, start + fractions[SPLITS.index(split)]


def split_of(doc_id: str, fractions: Sequence[float], seed: int = 0) -> str:
    """The split of a document under the ``document`` rule, before any move."""
    u = unit_of(doc_id, seed)
    if u < fractions[0]:
        return "train"
    if u < fractions[0] + fractions[1]:
        return "val"
    return "test"


def rescue_moves(
    units: Mapping[str, Sequence[float]], fractions: Sequence[float]
) -> tuple[dict[tuple[str, int], str], list[str]]:
    """Documents to move so every split with a non-zero fraction holds one, and the splits left empty.

    ``units[split]`` holds the hash of each document of that split in order. Returns
    ``({(from_split, index): to_split}, still_empty)``; a donor always keeps one document.
    """
    counts = {s: len(units[s]) for s in SPLITS}
    taken: set[tuple[str, int]] = set()
    moves: dict[tuple[str, int], str] = {}
    still_empty = []
    for split, fraction in zip(SPLITS, fractions):
        if fraction <= 0 or counts[split] > 0:
            continue
        donor = max(SPLITS, key=lambda s: counts[s])
        if counts[donor] < 2:
            still_empty.append(split)
            continue
        lo, hi = interval_of(split, fractions)
        distance = [max(lo - u, u - hi, 0.0) for u in units[donor]]
        index = min((i for i in range(len(distance)) if (donor, i) not in taken), key=lambda i: distance[i])
        taken.add((donor, index))
        moves[(donor, index)] = split
        counts[donor] -= 1
        counts[split] += 1
    return moves, still_empty


def within_spans(num_tokens: int, fractions: Sequence[float], gap: int) -> dict[str, tuple[int, int]] | None:
    """``{split: (start, end)}`` token spans of one document under the ``within`` rule.

    Splits with a non-zero fraction get ``round(fraction * usable)`` tokens (at least one) in
    train, val, test order with ``gap`` tokens dropped between two of them, ``usable`` being the
    document minus its gaps; train (or the last split, when train has no fraction) takes the
    rounding remainder. None when the document is too short to give each such split a token.
    """
    nonzero = [s for s, f in zip(SPLITS, fractions) if f > 0]
    usable = num_tokens - gap * (len(nonzero) - 1)
    if usable < len(nonzero):
        return None
    sizes = {s: max(1, round(f * usable)) if f > 0 else 0 for s, f in zip(SPLITS, fractions)}
    absorber = "train" if "train" in nonzero else nonzero[-1]
    sizes[absorber] = usable - sum(n for s, n in sizes.items() if s != absorber)
    if sizes[absorber] < 1:
        return None
    spans, start = {}, 0
    for split in SPLITS:
        if sizes[split] and split != nonzero[0]:
            start += gap
        spans[split] = (start, start + sizes[split])
        start += sizes[split]
    return spans


def check_heldout(data_dir: str | Path, split: str, min_tokens: int) -> None:
    """Raise UserError unless some document of ``split`` in ``data_dir`` has ``min_tokens`` tokens.

    Training and comparison call this before they start, so a sweep never trains for an hour and
    then finds nothing to evaluate the longest length on. The sentence gives every split's size
    and the fix.
    """
    import numpy as np

    from extrapos.data.shards import offsets_path, read_manifest

    directory = Path(data_dir).expanduser()
    manifest = read_manifest(directory)
    splits = manifest.get("splits", {})
    if split not in splits:
        raise UserError(f"Unknown split '{split}' in '{directory}'; choose one of {', '.join(splits)}.")
    path = offsets_path(directory, split)
    try:
        longest = int(np.diff(np.load(path)).max(initial=0))
    except (OSError, ValueError):
        raise UserError(f"The offsets '{path}' are missing or damaged; prepare the data again.") from None
    if longest >= min_tokens:
        return
    sizes = ", ".join(
        f"{name} {s['num_docs']:,} docs / {s['num_tokens']:,} tokens" for name, s in splits.items()
    )
    rule = manifest.get("split_rule", {}).get("rule", "document")
    fix = (
        "prepare it with --split-rule within (held-out tails of every document)"
        if rule == "document"
        else "prepare it with larger held-out --split-fractions or longer documents"
    )
    raise UserError(
        f"No {split} document of '{directory}' has the {min_tokens:,} tokens the longest length needs "
        f"(the longest has {longest:,}; {sizes}); {fix}, or ask for shorter lengths."
    )
