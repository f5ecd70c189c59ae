"""toy-counting: 400 generated documents that count in words, long enough to train a tiny model on."""

from __future__ import annotations

from collections.abc import Iterator

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def documents() -> Iterator[tuple[str, str]]:
    """(id, text) in a fixed order; the ids are stable, so extrapos' train/val/test split is too."""
    for n in range(400):
        start = 7 * n
        text = " ".join(" ".join(WORDS[int(d)] for d in str(i)) + "." for i in range(start, start + 60))
        yield f"count-{n:03d}", text
