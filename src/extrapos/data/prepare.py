"""The preparation pipeline: corpus -> (trained) tokenizer -> filtered, split token shards.

Why it is shaped this way:

- Tokenize once, read many times: every later command memory-maps the result.
- Split by document, by a hash of the document id (salted by ``seed``): a document never leaks
  between train and test, and its split does not depend on which other documents exist, so
  adding files or changing filters never moves a document to another split, except to give an
  otherwise empty split one document. ``--split-rule within`` holds out the tail of every
  document instead, for corpora of a few long documents (see ``splitting``).
- A trained ``bpe:N`` sees only train-split documents, so held-out text is truly unseen.
- Atomic: everything is written into a hidden staging directory next to the target and
  renamed into place only when complete (the manifest is the last file written). A crash,
  Ctrl-C, SIGTERM or bad input leaves no directory a later command would trust, an existing
  prepared directory is never touched, and what a SIGKILL leaves is swept by the next prepare
  (see ``staging``).
- Fast and bounded: batches of documents are encoded on every core (tiktoken; a trained ``bpe:N``
  through its exact tiktoken mirror, see ``fast_bpe``) while the next batch is read, and written to
  the split files as they come, so memory does not grow with the corpus (docs/data.md).
- Idempotent: the inputs (corpus fingerprint, tokenizer, filters) hash to a key stored in the
  manifest; preparing again with the same inputs reuses the directory. Without ``--out`` the
  directory lives in a cache keyed the same way, so commands can name a corpus, not a path.
"""

from __future__ import annotations

import array
import collections
import errno
import glob
import hashlib
import itertools
import json
import logging
import re
import sys
import tempfile
import time
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extrapos import __version__
from extrapos.console import STDERR
from extrapos.data.cache import cache_root
from extrapos.data.cache import publish as _publish  # by name here: a fault test patches prepare:_publish
from extrapos.data.cache import reusable as _reusable
from extrapos.data.corpora import BUILTIN_CORPORA, Corpus, looks_like_path, open_corpus
from extrapos.data.shards import (
    FORMAT,
    SPLITS,
    SplitWriter,
    rewrite_splits,
    write_manifest,
)
from extrapos.data.splitting import (
    DEFAULT_GAP_TOKENS,
    parse_split_rule,
    rescue_moves,
    split_of,
    unit_of,
    within_spans,
)
from extrapos.data.staging import MARKER, staged, sweep_stale
from extrapos.data.tokenizer import (
    Tokenizer,
    is_trained_spec,
    load_tokenizer,
    parse_bpe_spec,
    token_dtype,
    train_bpe,
)
from extrapos.errors import UserError
from extrapos.plugins import corpus_names

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
# bpe:N on a streamed hub corpus would otherwise read the whole stream before tokenizing it.
BPE_TRAINING_BYTES = 256 * 2**20
# Bump when train_bpe changes, to invalidate cached results (/2: long runs cut before training).
BPE_RECIPE = "byte-level-bpe/2"
# A batch is what one call encodes on every core while the next is read: ~0.1 s of work, enough
# that the threads' start costs nothing, small enough that the two held in memory are a few MB.
ENCODE_BATCH_DOCS = 1024
ENCODE_BATCH_CHARS = 2 * 2**20
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_split_fractions(value: str | Sequence[float]) -> tuple[float, float, float]:
    """``"0.9,0.05,0.05"`` or a 3-sequence -> validated (train, val, test) fractions summing to 1."""
    try:
        parts = [float(x) for x in (value.split(",") if isinstance(value, str) else value)]
    except ValueError:
        raise UserError(
            f"Cannot read split fractions '{value}'; write three numbers like 0.9,0.05,0.05."
        ) from None
    if len(parts) != 3 or any(not 0 <= p <= 1 for p in parts) or abs(sum(parts) - 1) > 1e-6:
        raise UserError(
            f"Split fractions must be three numbers in [0, 1] summing to 1 (train,val,test); got {value}."
        )
    return parts[0], parts[1], parts[2]


def _cached(corpus: str, tokenizer: str, key: str) -> Path:
    """The cache directory of these inputs: one already prepared under this key whichever way the corpus
    or the tokenizer was spelled (``gpt2`` and the path of its rank file are one vocabulary, one key),
    else ``<corpus>-<tokenizer>-<key>``."""
    root = cache_root() / "data"
    spelled = root / f"{_slug(corpus)}-{_slug(tokenizer)}-{key}"
    if spelled.is_dir() or not root.is_dir():
        return spelled
    same = sorted(d for d in root.glob(f"*-{key}") if d.is_dir() and not d.is_symlink())
    return same[0] if same else spelled


def prepare_data(
    corpus: str, tokenizer: str, out: str | Path | None = None, *, progress: bool = True, **options: Any
) -> Path:
    """Tokenize ``corpus`` with ``tokenizer`` into train/val/test shards; return the directory.

    ``options`` are ``prepare``'s; with ``progress`` this also says on stderr whether the directory
    was prepared now or reused.
    """
    path, reused = prepare(corpus, tokenizer, out, progress=progress, **options)
    if progress:
        logger.info(
            f"{'Reusing' if reused else 'Prepared'} data in {path}"
            f"{' (same corpus, tokenizer and filters)' if reused else ''}.",
            extra=STDERR,
        )
    return path


def prepare(
    corpus: str,
    tokenizer: str,
    out: str | Path | None = None,
    *,
    min_doc_tokens: int = 0,
    max_tokens: int | None = None,
    max_docs: int | None = None,
    split_fractions: Sequence[float] | str = DEFAULT_SPLIT_FRACTIONS,
    text_field: str = "text",
    seed: int = 0,
    progress: bool = True,
    split_rule: str = "document",
    split_gap: int = DEFAULT_GAP_TOKENS,
) -> tuple[Path, bool]:
    """Tokenize ``corpus`` with ``tokenizer`` into train/val/test shards; return the directory.

    ``min_doc_tokens`` drops shorter documents (ExPE keeps documents of >= 4000 tokens);
    ``max_tokens`` stops once the kept documents (all splits) hold that many tokens, keeping the
    document that crosses it whole; ``max_docs`` reads only the first N documents of the corpus;
    ``seed`` salts the document hash that decides the split. ``split_rule`` is ``document`` (whole
    documents by hash) or ``within`` (tail spans of every document, ``split_gap`` tokens apart);
    see ``splitting``. With ``out=None`` the result goes to (or is reused from) the cache.
    Returns ``(directory, reused)``; raises UserError for every mistake a user can make. A split
    with a non-zero fraction left empty is said in one warning line on stderr and in the
    manifest's ``warnings``.
    """
    if corpus.strip().startswith("synthetic:"):  # generated token-level tasks: see data/synthetic.py
        from extrapos.data.synthetic import prepare_synthetic

        return prepare_synthetic(corpus, tokenizer, out, progress=progress)
    fractions = parse_split_fractions(split_fractions)
    split_rule = parse_split_rule(split_rule)
    if split_gap < 0:
        raise UserError(f"--split-gap must be >= 0 tokens, got {split_gap}.")
    if min_doc_tokens < 0:
        raise UserError(f"--min-doc-tokens must be >= 0, got {min_doc_tokens}.")
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {max_tokens}.")
    source = open_corpus(corpus, text_field, max_docs)
    if is_trained_spec(tokenizer):
        tokenizer_identity = {
            "spec": tokenizer.strip(),
            "vocab": parse_bpe_spec(tokenizer),
            "recipe": BPE_RECIPE,
            "max_training_bytes": BPE_TRAINING_BYTES,
        }
        loaded = None
    else:
        loaded = load_tokenizer(tokenizer)
        tokenizer_identity = {"hash": loaded.hash}

    inputs = {
        "format": FORMAT,
        "corpus": _normalized_corpus_spec(corpus),
        "corpus_fingerprint": source.fingerprint,
        "text_field": text_field,
        "max_docs": max_docs,
        "tokenizer": tokenizer_identity,
        "min_doc_tokens": min_doc_tokens,
        "max_tokens": max_tokens,
        "split_fractions": list(fractions),
        "seed": seed,
        "split_rule": split_rule,
        "split_gap": split_gap if split_rule == "within" else None,
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    target = Path(out).expanduser() if out is not None else _cached(corpus, tokenizer, key)
    try:
        if _reusable(target, key):
            return target, True
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(
            target.parent, f".{glob.escape(target.name)}{MARKER}*" if out is not None else f".*{MARKER}*"
        )
        with staged(target) as tmp:
            started = time.perf_counter()
            rule = {"rule": split_rule, **({"gap_tokens": split_gap} if split_rule == "within" else {})}
            tok = loaded or _train_tokenizer(source, tokenizer, fractions, seed, rule, progress)
            tok.save(tmp)
            manifest = _write_splits(
                tmp, source, tok, fractions, seed, rule, min_doc_tokens, max_tokens, progress
            )
            for warning in manifest["warnings"]:
                logger.warning(f"extrapos: warning: {warning}", extra=STDERR)
            manifest.update(
                {
                    "format": FORMAT,
                    "key": key,
                    "corpus": corpus,
                    "text_field": text_field,
                    "tokenizer": {
                        "spec": tokenizer,
                        "kind": tok.kind,
                        "hash": tok.hash,
                        "vocab_size": tok.vocab_size,
                        "eot_id": tok.eot_id,
                    },
                    "filters": {
                        "min_doc_tokens": min_doc_tokens,
                        "max_tokens": max_tokens,
                        "max_docs": max_docs,
                        "split_fractions": list(fractions),
                        "seed": seed,
                    },
                    "split_rule": {**rule, **manifest.pop("split_rule_details")},
                    "inputs": inputs,
                    "seconds": round(time.perf_counter() - started, 2),
                    "extrapos_version": __version__,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
            )
            manifest = _ordered(manifest)
            write_manifest(tmp, manifest)  # last: a directory without a manifest is never trusted
            return target, _publish(tmp, target, key)
    except OSError as e:
        raise write_failure(e, target, out is None) from None


def write_failure(error: OSError, target: Path, in_cache: bool) -> UserError:
    """One sentence for a file-system error while writing prepared data, naming the way out."""
    where = "set EXTRAPOS_CACHE to another directory" if in_cache else "choose another --out"
    place = f"'{error.filename}'" if error.filename else f"'{target}'"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"No space left on the device while writing {place}; free some space or {where}.")
    if error.errno == errno.EFBIG:
        return UserError(
            f"A file grew past the file-size limit while writing {place} (see `ulimit -f`); "
            f"raise the limit or {where}."
        )
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UserError(f"Cannot write {place} ({error.strerror}); make it writable or {where}.")
    return UserError(
        f"Writing {place} failed ({error.strerror or error}); check the disk and the path, or {where}."
    )


def _ordered(manifest: dict) -> dict:
    first = [
        "format",
        "key",
        "corpus",
        "text_field",
        "tokenizer",
        "filters",
        "split_rule",
        "dtype",
        "documents_read",
        "documents_too_short",
        "stopped_at_max_tokens",
        "replaced_bytes",
        "splits",
        "warnings",
    ]
    return {
        **{k: manifest[k] for k in first if k in manifest},
        **{k: v for k, v in manifest.items() if k not in first},
    }


def _train_tokenizer(
    source: Corpus, spec: str, fractions: Sequence[float], seed: int, rule: dict, progress: bool
) -> Tokenizer:
    """Train ``bpe:N`` on the train-split text (at most BPE_TRAINING_BYTES of it): the train
    documents under the ``document`` rule, the first ``train fraction`` of every document's
    characters under ``within`` (its train head, as near as characters tell before tokenizing)."""
    from tqdm import tqdm

    bar = tqdm(
        desc=f"training {spec}",
        unit="doc",
        total=source.size_hint,
        disable=None if progress else True,  # None: shown only on a terminal
        file=sys.stderr,
        leave=False,
    )
    seen = 0

    def training_texts() -> Iterator[str]:
        nonlocal seen
        budget = BPE_TRAINING_BYTES
        for doc_id, text in source:
            seen += 1
            bar.update(1)
            if rule["rule"] == "within":
                text = text[: int(len(text) * fractions[0])]
                if not text:
                    continue
            elif split_of(doc_id, fractions, seed) != "train":
                continue
            yield text
            budget -= len(text)
            if budget <= 0:
                break

    texts = training_texts()
    first = next(texts, None)
    try:
        if first is None:
            if seen == 0:
                raise UserError(f"The corpus '{source.spec}' holds no documents.")
            raise UserError(
                f"None of the {seen} documents of '{source.spec}' falls in the train split to "
                f"train {spec} on; add documents or raise the train fraction."
            )
        return train_bpe(itertools.chain([first], texts), parse_bpe_spec(spec))
    finally:
        bar.close()


def _batches(docs: Iterator[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    """Groups of documents to encode at once: big enough to keep every core busy, bounded in RAM."""
    batch, chars = [], 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc[1])
        if len(batch) >= ENCODE_BATCH_DOCS or chars >= ENCODE_BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _encoded(
    source: Corpus, tok: Tokenizer, dtype: str
) -> Generator[tuple[list[str], list[int], int, list], None, None]:
    """The corpus in batches, each as (document ids, UTF-8 byte counts, replaced characters, token
    id arrays), in corpus order. While a worker thread encodes one batch on every core
    (``Tokenizer.encode_arrays``), this thread reads and cleans the next, so reading a corpus (JSON
    lines, a hub stream) overlaps tokenizing it; at most two batches are held at a time."""
    pending: collections.deque = collections.deque()
    with ThreadPoolExecutor(1, thread_name_prefix="extrapos-encode") as pool:
        try:
            for batch in _batches(iter(source)):
                cleaned = [_utf8_size(text) for _, text in batch]
                job = pool.submit(tok.encode_arrays, [c[0] for c in cleaned], dtype)
                pending.append(
                    ([d for d, _ in batch], [c[1] for c in cleaned], sum(c[2] for c in cleaned), job)
                )
                if len(pending) == 2:
                    *head, job = pending.popleft()
                    yield *head, job.result()
            while pending:
                *head, job = pending.popleft()
                yield *head, job.result()
        finally:  # stopped early (--max-tokens, an error): drop what is queued
            for *_, job in pending:
                job.cancel()


class _DocumentIds:
    """The ids of one split's documents in order, in an unnamed temporary file (millions of ids
    would otherwise sit in memory until the end), read back only for the few a rescue moves."""

    def __init__(self, directory: Path):
        self._file = tempfile.TemporaryFile(dir=directory)

    def append(self, doc_id: str) -> None:
        self._file.write(json.dumps(doc_id).encode() + b"\n")

    def lookup(self, indices: set[int]) -> dict[int, str]:
        self._file.seek(0)
        return {i: json.loads(line) for i, line in enumerate(self._file) if i in indices}

    def close(self) -> None:
        self._file.close()


def _utf8_size(text: str) -> tuple[str, int, int]:
    """(text, UTF-8 byte count, replaced characters): lone surrogates (from JSON escapes) cannot be
    encoded or tokenized, so they are replaced by U+FFFD and counted like undecodable bytes."""
    try:
        return text, len(text.encode("utf-8")), 0
    except UnicodeEncodeError:
        text, count = LONE_SURROGATE.subn("\ufffd", text)
        return text, len(text.encode("utf-8")), count


def _write_splits(
    directory: Path,
    source: Corpus,
    tok: Tokenizer,
    fractions: Sequence[float],
    seed: int,
    rule: dict,
    min_doc_tokens: int,
    max_tokens: int | None,
    progress: bool,
) -> dict:
    """Tokenize the corpus into the split files of ``directory`` as it is read; the manifest's
    counts, statistics and warnings."""
    # document rule: each document's hash and id, to rescue an empty split at the end
    names = {split: _DocumentIds(directory) for split in SPLITS}
    try:
        return _tokenize_into(
            directory, source, tok, fractions, seed, rule, min_doc_tokens, max_tokens, progress, names
        )
    finally:
        for ids_file in names.values():
            ids_file.close()


def _tokenize_into(
    directory: Path,
    source: Corpus,
    tok: Tokenizer,
    fractions: Sequence[float],
    seed: int,
    rule: dict,
    min_doc_tokens: int,
    max_tokens: int | None,
    progress: bool,
    names: dict[str, _DocumentIds],
) -> dict:
    from tqdm import tqdm

    dtype = token_dtype(tok.vocab_size)
    writers = {split: SplitWriter(directory, split, dtype) for split in SPLITS}
    units = {split: array.array("d") for split in SPLITS}
    read = too_short = kept_tokens = replaced = whole = text_bytes = 0
    over_budget = False
    bar = tqdm(
        desc="tokenizing",
        unit="tok",
        unit_scale=True,
        disable=None if progress else True,  # None: shown only on a terminal
        file=sys.stderr,
        leave=False,
        mininterval=0.5,
    )
    started = time.perf_counter()
    batches = _encoded(source, tok, dtype)
    try:
        for doc_ids, sizes, replaced_here, encoded in batches:
            replaced += replaced_here
            for doc_id, num_bytes, ids in zip(doc_ids, sizes, encoded):
                read += 1
                text_bytes += num_bytes
                if len(ids) < max(min_doc_tokens, 1):
                    too_short += 1
                    continue
                if rule["rule"] == "within":
                    whole += _add_spans(writers, tok, ids, num_bytes, fractions, rule["gap_tokens"])
                else:
                    split = split_of(doc_id, fractions, seed)
                    writers[split].add(ids, num_bytes)
                    units[split].append(unit_of(doc_id, seed))
                    names[split].append(doc_id)
                kept_tokens += len(ids)
                if max_tokens is not None and kept_tokens >= max_tokens:
                    over_budget = True
                    break
            bar.update(sum(len(ids) for ids in encoded))
            bar.set_postfix(docs=f"{read:,}", refresh=False)
            if over_budget:
                break
        if not bar.disable:
            seconds = time.perf_counter() - started
            logger.info(
                f"tokenized {read:,} documents ({kept_tokens:,} tokens kept) in {seconds:.1f} s: "
                f"{bar.n / max(seconds, 1e-9) / 1e6:.2f} M tokens/s with {_encoder_of(tok)}",
                extra=STDERR,
            )
    finally:
        batches.close()  # now, not when the generator is collected: stops the encoding thread
        bar.close()
        splits = {split: writer.close() for split, writer in writers.items()}
    if read == 0:
        raise UserError(f"The corpus '{source.spec}' holds no documents.")
    if kept_tokens == 0 and min_doc_tokens <= 1 and text_bytes:  # the text is there: the tokenizer drops it
        raise UserError(
            f"the tokenizer yields no tokens for any of the {read:,} documents of '{source.spec}' "
            f"({text_bytes:,} bytes of text), so there is nothing to train on; use a tokenizer that covers "
            "this text (bpe:N trains one on it)."
        )
    if kept_tokens == 0 and min_doc_tokens <= 1:
        raise UserError(f"Every document of '{source.spec}' is empty ({read} read); add text to the corpus.")
    if kept_tokens == 0:
        raise UserError(
            f"No document of '{source.spec}' is left after filtering ({read} read, all shorter "
            f"than {max(min_doc_tokens, 1)} tokens); lower --min-doc-tokens."
        )
    details: dict = {}
    if rule["rule"] == "document":
        moves, _ = rescue_moves(units, fractions)
        if moves:
            layout = {
                split: [(split, i) for i in range(len(units[split])) if (split, i) not in moves]
                for split in SPLITS
            }
            for (source_split, i), to in sorted(moves.items()):
                layout[to].append((source_split, i))
            splits = rewrite_splits(directory, dtype, layout, {s: w.doc_bytes for s, w in writers.items()})
        moved = {s: names[s].lookup({i for (m, i) in moves if m == s}) for s in SPLITS}
        details["moved"] = {moved[s][i]: to for (s, i), to in sorted(moves.items())}
    else:
        details["documents_whole_in_train"] = whole
    return {
        "dtype": dtype,
        "documents_read": read,
        "documents_too_short": too_short,
        "stopped_at_max_tokens": over_budget,
        "replaced_bytes": source.replaced_bytes + replaced,
        "splits": splits,
        "split_rule_details": details,
        "warnings": _empty_split_warnings(splits, fractions, rule, read - too_short),
    }


def _add_spans(
    writers: dict[str, SplitWriter],
    tok: Tokenizer,
    ids: np.ndarray,
    num_bytes: int,
    fractions: Sequence[float],
    gap: int,
) -> int:
    """Write one document's spans under the ``within`` rule; 1 when it was too short to cut (it
    then goes whole to train), else 0. A span's byte count is that of its decoded text."""
    spans = within_spans(len(ids), fractions, gap)
    if spans is None:
        writers["train"].add(ids, num_bytes)
        return 1
    for split, (start, end) in spans.items():
        if end > start:
            span = ids[start:end]
            writers[split].add(span, len(tok.decode(span.tolist()).encode("utf-8")))
    return 0


def _encoder_of(tok: Tokenizer) -> str:
    """What encodes the text: a tokenizer.json's tiktoken mirror, or the tokenizer's own library."""
    return getattr(tok, "encoder", tok.kind)


def _empty_split_warnings(splits: dict, fractions: Sequence[float], rule: dict, kept: int) -> list[str]:
    """One sentence per split that has a non-zero fraction and no document."""
    empty = [s for s, f in zip(SPLITS, fractions) if f > 0 and splits[s]["num_docs"] == 0]
    if not empty:
        return []
    fix = (
        "pass --split-rule within to hold out the tail of every document"
        if rule["rule"] == "document"
        else "lower --split-gap or --min-doc-tokens"
    )
    return [
        f"The {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty ({kept} document"
        f"{'s' if kept != 1 else ''} kept, too few or too short to give every split one); add documents "
        f"or {fix}."
    ]


def _normalized_corpus_spec(spec: str) -> str:
    """Absolute paths for local corpora, so ./data and /home/me/data share one cache entry."""
    spec = spec.strip()
    if spec in BUILTIN_CORPORA or spec.startswith("hf:"):
        return spec
    if not looks_like_path(spec) and spec in corpus_names():  # a plug-in's corpus, named by a word
        return spec
    return str(Path(spec).expanduser().absolute())


def _slug(spec: str) -> str:
    """A short readable name for cache directories: 'hf:Salesforce/wikitext:x' -> 'wikitext-x'."""
    spec = spec.strip().rstrip("/")
    if spec.startswith("hf:"):
        spec = spec[3:].split("/")[-1]
    elif "/" in spec or "\\" in spec:
        spec = Path(spec).name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-.")[:40] or "corpus"
