"""Token shards on disk: one flat token file per split, document offsets, and a manifest.

Layout of a prepared data directory::

    manifest.json              corpus, tokenizer hash, filters, counts, dtype, stats (written last)
    tokenizer.json | .model | .tiktoken
    train.bin  val.bin  test.bin               all tokens of the split, documents back to back
    train.offsets.npy ...                      int64 (num_docs + 1,): document i = bin[off[i]:off[i+1]]

Documents are stored without separators: a document's tokens are exactly its text's tokens,
which keeps bytes-per-token exact and lets a sampler decide whether to add end-of-text tokens
(packed mode) or keep windows inside one document (the default). Reading is memory-mapped, so
any document is an O(1) slice and no split is ever copied into RAM.
"""

from __future__ import annotations

import array
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from extrapos.errors import UserError

SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
FORMAT = "extrapos-data/1"
PERCENTILES = (0, 10, 25, 50, 75, 90, 99, 100)


def tokens_path(directory: Path, split: str) -> Path:
    return directory / f"{split}.bin"


def offsets_path(directory: Path, split: str) -> Path:
    return directory / f"{split}.offsets.npy"


class SplitWriter:
    """Appends documents of one split to its token file as they come; ``close()`` writes the offsets.

    Tokens go straight to the file; per document it keeps two 8-byte counts (tokens, UTF-8 bytes),
    so a corpus of ten million documents costs 160 MB here, not its text."""

    def __init__(self, directory: Path, split: str, dtype: str):
        self.directory, self.split, self.dtype = Path(directory), split, np.dtype(dtype)
        self._file = open(tokens_path(self.directory, split), "wb")
        self._lengths = array.array("q")
        self.doc_bytes = array.array("q")
        self.num_bytes = 0

    def add(self, ids: Sequence[int] | np.ndarray, num_bytes: int) -> None:
        """One document's token ids (a list or an integer array) and the UTF-8 byte count of its text."""
        tokens = np.ascontiguousarray(ids, dtype=self.dtype)  # no copy when it is already such an array
        self._file.write(tokens.data.cast("B"))
        self._lengths.append(len(tokens))
        self.doc_bytes.append(num_bytes)
        self.num_bytes += num_bytes

    @property
    def num_docs(self) -> int:
        return len(self._lengths)

    @property
    def num_tokens(self) -> int:
        return int(sum(self._lengths))

    def close(self) -> dict:
        """Flush, write offsets, and return this split's manifest entry."""
        self._file.close()
        lengths = np.frombuffer(self._lengths, dtype=np.int64) if self._lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(offsets_path(self.directory, self.split), offsets)
        num_tokens = int(offsets[-1])
        return {
            "num_docs": len(lengths),
            "num_tokens": num_tokens,
            "num_bytes": self.num_bytes,
            "bytes_per_token": self.num_bytes / num_tokens if num_tokens else 0.0,
            "doc_tokens": length_stats(lengths),
        }


def rewrite_splits(
    directory: Path,
    dtype: str,
    layout: dict[str, list[tuple[str, int]]],
    doc_bytes: Mapping[str, Sequence[int]],
) -> dict[str, dict]:
    """Rewrite the closed splits of ``directory`` so split ``s`` holds the documents ``layout[s]``,
    each named ``(old split, index)``, in that order; return the new manifest entries.

    Used when documents change split after they were written (``splitting.rescue_moves``); the
    new files are written beside the old ones and renamed over them.
    """
    directory = Path(directory)
    scratch = directory / ".rewrite"
    scratch.mkdir()
    old = {}
    for split in SPLITS:
        offsets = np.load(offsets_path(directory, split))
        tokens = (
            np.memmap(tokens_path(directory, split), dtype=dtype, mode="r")
            if offsets[-1]
            else np.zeros(0, dtype=dtype)
        )
        old[split] = (offsets, tokens)
    entries = {}
    for split in SPLITS:
        writer = SplitWriter(scratch, split, dtype)
        for source, i in layout[split]:
            offsets, tokens = old[source]
            writer.add(tokens[offsets[i] : offsets[i + 1]], doc_bytes[source][i])
        entries[split] = writer.close()
    del old  # unmap before the files are replaced
    for split in SPLITS:
        tokens_path(scratch, split).replace(tokens_path(directory, split))
        offsets_path(scratch, split).replace(offsets_path(directory, split))
    scratch.rmdir()
    return entries


def length_stats(lengths: np.ndarray) -> dict:
    """Min / mean / percentiles / max of document lengths (empty dict for no documents)."""
    if len(lengths) == 0:
        return {}
    stats = {"mean": round(float(np.mean(lengths)), 1)}
    stats.update(
        {f"p{q}": int(v) for q, v in zip(PERCENTILES, np.percentile(lengths, PERCENTILES, method="lower"))}
    )
    return stats


def write_manifest(directory: Path, manifest: dict) -> None:
    (Path(directory) / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def read_manifest(directory: str | Path) -> dict:
    """The manifest of a prepared data directory; UserError when there is none."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise UserError(
            f"No prepared data at '{directory}'; run `extrapos data prepare --out {directory}` first."
        )
    path = directory / MANIFEST
    if not path.exists():
        raise UserError(
            f"'{directory}' is not a prepared data directory (no {MANIFEST}); "
            "run `extrapos data prepare` to make one."
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"The manifest '{path}' is damaged; prepare the data again.") from None
    if not isinstance(manifest, dict):
        raise UserError(f"The manifest '{path}' is damaged; prepare the data again.")
    if manifest.get("format") != FORMAT:
        raise UserError(
            f"'{directory}' was prepared in format {manifest.get('format')!r}, this version "
            f"reads {FORMAT!r}; prepare the data again."
        )
    if not _well_formed(manifest):
        raise UserError(
            f"The manifest '{path}' lacks its splits, dtype or tokenizer entries; prepare the data again."
        )
    return manifest


def _well_formed(manifest: dict) -> bool:
    """The entries readers use are there with the right types (a hand-edited or foreign manifest
    otherwise fails later as a KeyError)."""
    splits, tokenizer = manifest.get("splits"), manifest.get("tokenizer")
    counts_ok = (
        isinstance(splits, dict)
        and bool(splits)
        and all(
            isinstance(entry, dict)
            and all(isinstance(entry.get(k), int) and entry[k] >= 0 for k in ("num_docs", "num_tokens"))
            for entry in splits.values()
        )
    )
    return (
        counts_ok
        and _unsigned_dtype(manifest.get("dtype"))
        and isinstance(tokenizer, dict)
        and all(isinstance(tokenizer.get(k), int) for k in ("eot_id", "vocab_size"))
    )


def _unsigned_dtype(name: object) -> bool:
    """uint16 / uint32 for text, uint8 for small synthetic vocabularies; nothing else holds token ids."""
    try:
        return isinstance(name, str) and np.dtype(name).kind == "u"
    except TypeError:
        return False


def load_offsets(directory: str | Path, split: str, entry: dict) -> np.ndarray:
    """The document offsets of ``split``, checked against its manifest ``entry``; UserError when
    the file is missing, damaged or does not match."""
    directory = Path(directory).expanduser()
    path = offsets_path(directory, split)
    try:
        offsets = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        raise UserError(f"The offsets file '{path}' is missing or damaged; prepare the data again.") from None
    if (
        offsets.ndim != 1
        or offsets.dtype.kind not in "iu"
        or len(offsets) != entry["num_docs"] + 1
        or offsets[0] != 0
        or int(offsets[-1]) != entry["num_tokens"]
        or np.any(np.diff(offsets) < 0)
    ):
        raise UserError(
            f"The offsets of split '{split}' in '{directory}' do not match its manifest; "
            "prepare the data again."
        )
    return offsets


class TokenSplit:
    """One split of a prepared data directory, memory-mapped.

    ``tokens`` is the flat np.memmap of every token; ``offsets[i]:offsets[i+1]`` is document i.
    ``bytes_per_token`` (UTF-8 bytes of the text / tokens) converts nats per token into bits
    per byte, the tokenizer-independent metric.
    """

    def __init__(self, directory: str | Path, split: str):
        self.directory = Path(directory).expanduser()
        self.manifest = read_manifest(self.directory)
        splits = self.manifest["splits"]
        if split not in splits:
            raise UserError(
                f"Unknown split '{split}' in '{self.directory}'; choose one of {', '.join(splits)}."
            )
        self.split = split
        self.info = splits[split]
        self.dtype = np.dtype(self.manifest["dtype"])
        self.eot_id = int(self.manifest["tokenizer"]["eot_id"])
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        path = tokens_path(self.directory, split)
        expected = self.info["num_tokens"] * self.dtype.itemsize
        if not path.exists() or path.stat().st_size != expected:
            raise UserError(
                f"The token file '{path}' is missing or has the wrong size; prepare the data again."
            )
        # np.memmap cannot map an empty file; an empty split is a valid (if useless) split.
        self.tokens = (
            np.memmap(path, dtype=self.dtype, mode="r") if expected else np.zeros(0, dtype=self.dtype)
        )
        self.offsets = load_offsets(self.directory, split, self.info)
        self.doc_lengths = np.diff(self.offsets)

    @property
    def num_docs(self) -> int:
        return len(self.doc_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_bytes(self) -> int:
        return int(self.info["num_bytes"])

    @property
    def bytes_per_token(self) -> float:
        return float(self.info["bytes_per_token"])

    def doc(self, i: int) -> np.ndarray:
        """Document i's tokens: a view into the memmap (no copy)."""
        if not -self.num_docs <= i < self.num_docs:
            raise IndexError(f"document {i} out of range for {self.num_docs} documents")
        i %= self.num_docs
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def __len__(self) -> int:
        return self.num_docs

    def __repr__(self) -> str:
        return (
            f"TokenSplit({str(self.directory)!r}, {self.split!r}, docs={self.num_docs}, "
            f"tokens={self.num_tokens})"
        )


def open_split(data_dir: str | Path, split: str) -> TokenSplit:
    """Open ``split`` (train / val / test) of a prepared data directory for reading."""
    return TokenSplit(data_dir, split)
