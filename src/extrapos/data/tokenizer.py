"""Tokenizers: train a byte-level BPE, or load a tokenizer.json, sentencepiece or tiktoken file.

Every kind is wrapped in the same small interface (``encode``, ``encode_batch``, ``decode``,
``vocab_size``, ``eot_id``, ``save``, ``hash``) and saved under a fixed file name, so
``load_tokenizer(dir)`` reloads whatever a data or run directory holds:

=====================  ======================  =========================================
kind                   spec                    saved as
=====================  ======================  =========================================
Hugging Face           ``bpe:N`` (trained),    ``tokenizer.json``
                       ``path/tokenizer.json``
sentencepiece          ``path/x.model``        ``tokenizer.model``
tiktoken               ``path/x.tiktoken``,    ``tokenizer.tiktoken`` (+ ``.json`` with the
                       ``gpt2`` (by name)      split pattern and special tokens)
=====================  ======================  =========================================

``gpt2`` names GPT-2's BPE, found locally or fetched once (see ``named_tokenizers``); a path
``./gpt2`` is a path. Bulk encoding (``encode_batch``, ``encode_arrays``) runs on every core, and a
byte-level BPE tokenizer.json is encoded by its exact tiktoken mirror when it has one
(``fast_bpe``): the same ids, several times faster than ``tokenizers`` (docs/data.md).

A tiktoken file holds only "base64(token) rank" lines; the pre-tokenization regex is not in it.
We pick it from the file name: ``cl100k`` or ``o200k`` in the name selects that encoding's
pattern and special-token ids, anything else gets GPT-2's pattern (r50k/p50k files) with
``<|endoftext|>`` right after the last rank, as GPT-2 numbers it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from extrapos.data.patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN
from extrapos.errors import UserError

if TYPE_CHECKING:
    import tiktoken
    from tokenizers import Tokenizer as RustTokenizer

EOT_TOKEN, PAD_TOKEN, MASK_TOKEN = "<|endoftext|>", "<|pad|>", "<|mask|>"
BPE_SPECIAL_TOKENS = [EOT_TOKEN, PAD_TOKEN, MASK_TOKEN]  # ids 0, 1, 2 in a trained bpe:N
# End-of-text names used by common tokenizers, tried in order when loading one.
EOT_CANDIDATES = [EOT_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]", "<|im_end|>"]
BYTE_ALPHABET = 256
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer.tiktoken")
# BPE training rescans every word that holds the pair it merges, so one word of n characters costs
# O(n) per merge and O(n^2) in all: a 200k-character line without spaces (base64, minified code)
# took 30 s, 400k over two minutes. Training sees runs of (non-)whitespace cut to at most this
# many characters; no word of ordinary text is that long, so the tokenizer trained on it is the same.
MAX_TRAINING_RUN = 256


def _threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _in_threads(encode_one: Callable[[str], np.ndarray], texts: list[str]) -> list[np.ndarray]:
    """``encode_one`` of every text, in order, on every core: tiktoken releases the GIL while it
    encodes. Texts go to the threads in runs (four per thread), not one future per text, which
    would cost as much as encoding a short document."""
    threads = _threads()
    if threads == 1 or len(texts) < 2:
        return [encode_one(t) for t in texts]
    step = -(-len(texts) // (4 * threads))
    runs = [texts[i : i + step] for i in range(0, len(texts), step)]
    with ThreadPoolExecutor(threads) as pool:
        return [ids for run in pool.map(lambda run: [encode_one(t) for t in run], runs) for ids in run]


def _numpy_encoder(
    encoding: tiktoken.Encoding, allowed_special: frozenset[str], dtype: str
) -> Callable[[str], np.ndarray]:
    """One text -> ids of ``dtype`` through tiktoken's buffer (no Python int per token), converted on
    the encoding thread; the special tokens of ``allowed_special`` are matched in the text, all
    others are text."""
    if hasattr(encoding, "encode_to_numpy"):
        return lambda text: encoding.encode_to_numpy(
            text, allowed_special=allowed_special, disallowed_special=()
        ).astype(dtype, copy=False)
    return lambda text: np.asarray(
        encoding.encode(text, allowed_special=allowed_special, disallowed_special=()), dtype=dtype
    )


class Tokenizer:
    """The interface every tokenizer kind offers. ``hash`` identifies the vocabulary and rules."""

    kind: str
    vocab_size: int
    eot_id: int
    _hash: str | None  # the hash, computed on first use (None again when the vocabulary grows)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_arrays(self, texts: list[str], dtype: str = "uint32") -> list[np.ndarray]:
        """The ids of ``encode_batch`` as arrays of ``dtype`` (which must hold every id, see
        ``token_dtype``): the bulk path of ``data prepare``."""
        return [np.asarray(ids, dtype=dtype) for ids in self.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def save(self, directory: str | Path) -> Path:
        """Write what ``load_tokenizer(directory)`` needs; return the main file."""
        raise NotImplementedError

    def token_id(self, name: str) -> int | None:
        """The id of a whole (special) token, or None when the vocabulary has no such token."""
        raise NotImplementedError

    def add_special_tokens(self, names: list[str]) -> None:
        """Append the missing tokens of ``names`` to the vocabulary (an encoder's [CLS], [MASK], ...);
        tokens already present keep their ids, so adding twice changes nothing."""
        raise UserError(
            f"extrapos cannot add special tokens to a {self.kind} tokenizer; use bpe:N or a "
            "tokenizer.json that has them."
        )

    def _canonical_bytes(self) -> bytes:
        raise NotImplementedError

    @property
    def hash(self) -> str:
        """Stable across processes and machines: sha256 of the saved content (first 16 hex)."""
        digest = getattr(self, "_hash", None)  # unset until the first call
        if digest is None:
            digest = self._hash = hashlib.sha256(
                self.kind.encode() + b"\0" + self._canonical_bytes()
            ).hexdigest()[:16]
        return digest

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eot_id={self.eot_id}, hash={self.hash})"


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer`` (our trained byte-level BPE, or any tokenizer.json).

    Bulk encoding goes through the tokenizer's exact tiktoken mirror when it has one (built on first
    use; ``fast_bpe``), else through ``tokenizers``; ``encoder`` says which."""

    kind = "hf"

    def __init__(self, tokenizer: RustTokenizer, source: str = ""):
        self.backend = tokenizer
        self._mirror: tuple[Any, str] | None = None  # (tiktoken.Encoding or None, why not), on first use
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        eot = next((vocab[name] for name in EOT_CANDIDATES if name in vocab), None)
        if eot is None:
            raise UserError(
                f"The tokenizer {source} has no end-of-text token (looked for "
                f"{', '.join(EOT_CANDIDATES)}); add one to its special tokens."
            )
        self.eot_id = eot

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def mirror(self) -> Any:
        """The exact tiktoken mirror (``fast_bpe.tiktoken_mirror``), or None when there is none."""
        return self._mirror_and_reason()[0]

    def _mirror_and_reason(self) -> tuple[Any, str]:
        if self._mirror is None:
            from extrapos.data.fast_bpe import tiktoken_mirror

            self._mirror = tiktoken_mirror(self.backend)
        return self._mirror

    @property
    def encoder(self) -> str:
        """What bulk encoding runs on: ``tiktoken`` (the exact mirror) or ``tokenizers (why)``."""
        mirror, why = self._mirror_and_reason()
        return "tiktoken" if mirror is not None else f"tokenizers ({why})"

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.mirror() is not None:
            return [ids.tolist() for ids in self.encode_arrays(texts)]
        # Rust side, multithreaded over the batch (RAYON_NUM_THREADS / all cores).
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def encode_arrays(self, texts: list[str], dtype: str = "uint32") -> list[np.ndarray]:
        mirror = self.mirror()
        if mirror is None:
            return super().encode_arrays(texts, dtype)
        return _in_threads(_numpy_encoder(mirror, mirror.special_tokens_set, dtype), list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_id(self, name: str) -> int | None:
        return self.backend.token_to_id(name)

    def add_special_tokens(self, names: list[str]) -> None:
        missing = [n for n in names if self.backend.token_to_id(n) is None]
        if missing:
            self.backend.add_special_tokens(missing)  # appended after the last id, in this order
            self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
            self._hash = None
            self._mirror = None

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.backend.to_str(), encoding="utf-8")
        return path

    def _canonical_bytes(self) -> bytes:
        return self.backend.to_str().encode()


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece ``.model`` (Llama-1/2, T5 style); kept as the serialized model bytes."""

    kind = "sentencepiece"

    def __init__(self, model_bytes: bytes, source: str = ""):
        try:
            import sentencepiece as spm
        except ImportError:
            raise UserError(
                "Loading a sentencepiece .model needs sentencepiece; run `pip install 'extrapos[hf]'`."
            ) from None
        self.model_bytes = model_bytes
        self.backend = spm.SentencePieceProcessor()
        try:
            self.backend.LoadFromSerializedProto(model_bytes)
        except Exception:  # sentencepiece raises RuntimeError/OSError with C++ text
            raise UserError(f"'{source}' is not a valid sentencepiece model.") from None
        self.vocab_size = self.backend.get_piece_size()
        eot = self.backend.eos_id()
        if eot < 0:
            eot = next(
                (
                    self.backend.piece_to_id(n)
                    for n in EOT_CANDIDATES
                    if self.backend.piece_to_id(n) != self.backend.unk_id()
                ),
                -1,
            )
        if eot < 0:
            raise UserError(f"The sentencepiece model '{source}' has no end-of-text (eos) piece.")
        self.eot_id = eot

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.backend.encode(list(texts), out_type=int, num_threads=_threads())

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode([int(i) for i in ids])

    def token_id(self, name: str) -> int | None:
        piece = self.backend.piece_to_id(name)  # the unknown piece's id for a name it does not know
        return piece if self.backend.id_to_piece(piece) == name else None

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "tokenizer.model"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model_bytes)
        return path

    def _canonical_bytes(self) -> bytes:
        return self.model_bytes


class TiktokenTokenizer(Tokenizer):
    """A tiktoken BPE: byte-level ranks + a split regex + special tokens (see the module docstring)."""

    kind = "tiktoken"

    def __init__(self, ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int], name: str):
        try:
            import tiktoken
        except ImportError:
            raise UserError("Loading a .tiktoken file needs tiktoken; run `pip install tiktoken`.") from None
        self.ranks, self.pattern, self.special_tokens = ranks, pattern, special_tokens
        self.backend = tiktoken.Encoding(
            name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_tokens
        )
        self.vocab_size = self.backend.n_vocab
        self.eot_id = special_tokens[EOT_TOKEN]

    @classmethod
    def from_file(cls, path: Path) -> TiktokenTokenizer:
        sidecar = path.with_name(path.name + ".json")
        if not sidecar.exists():
            return cls.from_bytes(path.read_bytes(), path.name, str(path))
        ranks = read_tiktoken_ranks(path)
        try:
            meta = json.loads(sidecar.read_bytes())
            return cls(ranks, str(meta["pattern"]), dict(meta["special_tokens"]), path.stem)
        except (ValueError, KeyError, TypeError):  # also JSONDecodeError, UnicodeDecodeError
            raise UserError(
                f"The tiktoken sidecar '{sidecar}' is damaged (it needs 'pattern' and "
                "'special_tokens'); restore it or delete it to use the defaults."
            ) from None

    @classmethod
    def from_bytes(cls, data: bytes, file_name: str, source: str) -> TiktokenTokenizer:
        """A tiktoken file's content without a sidecar: the pattern and end-of-text id follow from
        the file's name (see the module docstring)."""
        ranks = parse_tiktoken_ranks(data, source)
        path = Path(file_name)
        name = path.name.lower()
        top = max(ranks.values()) + 1
        if "o200k" in name:
            pattern, specials = O200K_PATTERN, {EOT_TOKEN: 199999}
        elif "cl100k" in name:
            pattern, specials = CL100K_PATTERN, {EOT_TOKEN: 100257}
        else:
            pattern, specials = GPT2_PATTERN, {EOT_TOKEN: top}
        if specials[EOT_TOKEN] < top:  # a file named like cl100k but holding another vocabulary
            specials = {EOT_TOKEN: top}
        return cls(ranks, pattern, specials, path.stem)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.backend.encode_ordinary_batch(list(texts), num_threads=_threads())

    def encode_arrays(self, texts: list[str], dtype: str = "uint32") -> list[np.ndarray]:
        return _in_threads(_numpy_encoder(self.backend, frozenset(), dtype), list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode([int(i) for i in ids], errors="replace")

    def token_id(self, name: str) -> int | None:
        return self.special_tokens.get(name)

    def add_special_tokens(self, names: list[str]) -> None:
        import tiktoken

        missing = [n for n in names if n not in self.special_tokens]
        if missing:
            top = max(max(self.ranks.values()), *self.special_tokens.values()) + 1
            self.special_tokens = {**self.special_tokens, **{n: top + i for i, n in enumerate(missing)}}
            self.backend = tiktoken.Encoding(
                name=self.backend.name,
                pat_str=self.pattern,
                mergeable_ranks=self.ranks,
                special_tokens=self.special_tokens,
            )
            self.vocab_size = self.backend.n_vocab
            self._hash = None

    def _rank_lines(self) -> bytes:
        """The ranks as a tiktoken file; computed once (saving and hashing both need it, and GPT-2's
        50,000 lines take a tenth of a second)."""
        if getattr(self, "_lines", None) is None:
            self._lines = b"".join(
                base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                for token, rank in sorted(self.ranks.items(), key=lambda kv: kv[1])
            )
        return self._lines

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "tokenizer.tiktoken"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._rank_lines())
        meta = {"pattern": self.pattern, "special_tokens": self.special_tokens}
        path.with_name(path.name + ".json").write_text(json.dumps(meta, indent=2))
        return path

    def _canonical_bytes(self) -> bytes:
        meta = json.dumps({"pattern": self.pattern, "special_tokens": self.special_tokens}, sort_keys=True)
        return self._rank_lines() + meta.encode()


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse ``base64(token) rank`` lines (the format of tiktoken's published files)."""
    return parse_tiktoken_ranks(path.read_bytes(), str(path))


def parse_tiktoken_ranks(data: bytes, path: str) -> dict[bytes, int]:
    """The ranks of a tiktoken file's content; ``path`` names it in messages."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:  # also binascii.Error, a ValueError subclass
            raise UserError(
                f"Line {number} of '{path}' is not 'base64-token rank'; is it a tiktoken file?"
            ) from None
    if not ranks:
        raise UserError(f"The tiktoken file '{path}' holds no tokens.")
    return ranks


# --- building and loading -----------------------------------------------------------------------


def parse_bpe_spec(spec: str) -> int:
    """``bpe:8192`` -> 8192 (the target vocabulary size, special tokens included)."""
    size = spec.split(":", 1)[1]
    if not size.isdigit():
        raise UserError(f"Cannot read the vocabulary size in '{spec}'; write e.g. bpe:8192.")
    n = int(size)
    minimum = BYTE_ALPHABET + len(BPE_SPECIAL_TOKENS)
    if n < minimum:
        raise UserError(
            f"A byte-level BPE needs a vocabulary of at least {minimum} (256 bytes + "
            f"{len(BPE_SPECIAL_TOKENS)} special tokens); got {spec}."
        )
    return n


def capped_runs(texts: Iterable[str], max_run: int = MAX_TRAINING_RUN) -> Iterator[str]:
    """The texts, each cut inside its runs of non-whitespace (or whitespace) longer than ``max_run``
    characters into pieces whose runs are at most ``max_run`` long; a text without such runs is
    yielded unchanged. Cuts fall inside a run, never next to its first character, so every other
    pre-token of the text is the same in the pieces as in the whole."""
    pattern = re.compile(rf"\S{{{max_run + 1},}}|\s{{{max_run + 1},}}")
    for text in texts:
        start = 0
        for run in pattern.finditer(text):
            for cut in range(run.start() + max_run, run.end(), max_run):
                yield text[start:cut]
                start = cut
        yield text[start:]


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """Train a GPT-2 style byte-level BPE (Radford et al. 2019): no unknown tokens, lossless decoding.

    Special tokens come first (end-of-text 0, padding 1, mask 2). Training is deterministic for
    the same texts in the same order, so a cache keyed by corpus and spec stays valid. Training
    reads the texts through ``capped_runs``, which keeps it linear in the input.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(capped_runs(texts), trainer=trainer)
    return HFTokenizer(tok, source=f"bpe:{vocab_size}")


def is_trained_spec(spec: str) -> bool:
    """True for specs that need a corpus to train on (``bpe:N``)."""
    return spec.strip().startswith("bpe:")


def build_tokenizer(
    spec: str, corpus_docs: Iterable[str] | Iterable[tuple[str, str]] | None = None
) -> Tokenizer:
    """A tokenizer from a spec: ``bpe:N`` trains on ``corpus_docs`` (texts or (id, text) pairs);
    a name (``gpt2``) or a path to tokenizer.json / .model / .tiktoken (or a directory holding
    one) loads it."""
    spec = (spec or "").strip()
    if is_trained_spec(spec):
        size = parse_bpe_spec(spec)
        if corpus_docs is None:
            raise UserError(f"The tokenizer {spec} is trained on a corpus; none was given.")
        texts = (d if isinstance(d, str) else d[1] for d in corpus_docs)
        return train_bpe(texts, size)
    return load_tokenizer(spec)


def load_tokenizer(path_or_dir: str | Path) -> Tokenizer:
    """Reload a tokenizer from a file, or from a data / run directory that holds one; a name of
    ``NAMED_TOKENIZERS`` (``gpt2``, given as a string) loads that tokenizer wherever it is found
    (``named_tokenizers``)."""
    from extrapos.data.named_tokenizers import NAMED_TOKENIZERS, named_file

    if isinstance(path_or_dir, str) and path_or_dir.strip() in NAMED_TOKENIZERS:
        data, file, source = named_file(path_or_dir.strip())
        return TiktokenTokenizer.from_bytes(data, file, source=source)
    path = Path(path_or_dir).expanduser()
    if str(path_or_dir).strip() == "" or not path.exists():
        hint = (
            ""
            if any(c in str(path_or_dir) for c in "/.")
            else f"; use bpe:N, {', '.join(NAMED_TOKENIZERS)} or a path to tokenizer.json, .model or "
            ".tiktoken"
        )
        raise UserError(f"Unknown tokenizer '{path_or_dir}': no such file or directory{hint}.")
    if path.is_dir():
        found = next((path / name for name in TOKENIZER_FILES if (path / name).exists()), None)
        if found is None:
            raise UserError(f"The directory '{path}' holds no tokenizer ({', '.join(TOKENIZER_FILES)}).")
        path = found
    try:
        return _load_file(path)
    except OSError as e:  # unreadable (permissions), vanished, or a directory named like a file
        raise UserError(
            f"Cannot read the tokenizer '{path}' ({e.strerror or e}); check the path and its permissions."
        ) from None


def _load_file(path: Path) -> Tokenizer:
    name = path.name.lower()
    if name.endswith(".json"):
        from tokenizers import Tokenizer as RustTokenizer

        data = path.read_bytes()  # read here, so an unreadable file is an OSError, not a parse error
        try:
            backend = RustTokenizer.from_str(data.decode("utf-8"))
        except Exception:  # tokenizers raises a bare Exception with serde's message
            raise UserError(f"'{path}' is not a Hugging Face tokenizer.json file.") from None
        return HFTokenizer(backend, source=str(path))
    if name.endswith(".model"):
        return SentencePieceTokenizer(path.read_bytes(), source=str(path))
    if name.endswith(".tiktoken"):
        return TiktokenTokenizer.from_file(path)
    raise UserError(
        f"Unknown tokenizer file '{path}'; use a tokenizer.json, a sentencepiece .model "
        "or a .tiktoken file, or bpe:N to train one."
    )


def token_dtype(vocab_size: int) -> str:
    """uint16 while every id fits (vocab <= 65536), else uint32: half the disk and page cache."""
    return "uint16" if vocab_size <= 2**16 else "uint32"
