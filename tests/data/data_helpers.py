"""Helpers for the data tests: deterministic small documents and synthetic prepared splits."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

from extrapos.data.shards import FORMAT, SPLITS, SplitWriter, write_manifest

SENTENCES = [
    "The quick brown fox jumps over the lazy dog. ",
    "Positional encodings let a transformer know where each token sits. ",
    "Train short, test long: extrapolation is the question. ",
    "Numbers like 1234 and 56789 should tokenize too. ",
]


def text_of(i: int, repeat: int = 20) -> str:
    """A small deterministic document, different for each i."""
    return f"Document {i}. " + "".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(repeat))


def write_synthetic(directory: Path, docs: list[list[int]], eot_id: int = 0, vocab_size: int = 1000) -> Path:
    """A prepared-data directory whose train split holds exactly ``docs`` (val/test empty)."""
    directory.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split in SPLITS:
        writer = SplitWriter(directory, split, "uint16")
        for doc in docs if split == "train" else []:
            writer.add(doc, num_bytes=2 * len(doc))
        splits[split] = writer.close()
    write_manifest(
        directory,
        {
            "format": FORMAT,
            "dtype": "uint16",
            "splits": splits,
            "tokenizer": {"eot_id": eot_id, "vocab_size": vocab_size},
        },
    )
    return directory


def numbered_docs(lengths, start: int = 1) -> list[np.ndarray]:
    """Documents whose tokens are consecutive numbers, so any window shows where it came from."""
    docs, next_id = [], start
    for n in lengths:
        docs.append(np.arange(next_id, next_id + n))
        next_id += n
    return docs


def write_tiktoken_file(path, merges=(b"th", b"he", b"the", b" t", b" the", b"in", b"ing")):
    """A valid tiktoken BPE by hand: the 256 bytes, then merges, one 'base64 rank' line each."""
    tokens = [bytes([b]) for b in range(256)] + list(merges)
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % rank for rank, t in enumerate(tokens)))
    return path
