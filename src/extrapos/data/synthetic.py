"""Synthetic length-generalization tasks as corpora: ``synthetic:passkey``, ``synthetic:kv-recall``,
``synthetic:copy``.

Each example is generated directly in a small fixed vocabulary (65 words, one token each), not as
text through a BPE: every token is under our control, so the answer positions are exact and the
task is the same at every length. The tasks, in the length-generalization literature's form
(Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization", §4):

* ``passkey``: random filler words, a needle ``<key> d d d d d`` at a uniformly random depth, then
  ``<query> d d d d d`` whose digits are the answer (Mohtashami & Jaggi 2023, §4.2, in tokens).
* ``kv-recall``: multi-query associative recall (Arora et al. 2023, "Zoology", §3.1; Ba et al. 2016):
  ``pairs`` blocks ``<key> k v`` hidden in filler, then ``queries`` blocks ``<query> k v`` asking
  distinct keys; the values after ``<query> k`` are the answer.
* ``copy``: ``<copy> x1 .. xm <sep> x1 .. xm`` (one filler word first when the length is even);
  the second copy is the answer.

Spec: ``synthetic:TASK[:key=value,...]`` with keys ``length`` (L_t, default 64), ``min_length``
(shortest training example), ``train`` / ``val`` / ``test`` (examples per split), ``seed``,
``digits`` (passkey), ``pairs`` and ``queries`` (kv-recall). An example "of length n" is n + 1
tokens: a model reads n of them (positions 0..n-1) and the last answer token is only a target.
Training examples have lengths drawn uniformly in [min_length, L_t]; validation and test examples
are exactly L_t long; ``eval_examples`` makes examples of any length k x L_t on the fly.

Every example comes from its own generator ``default_rng([seed, stream, ...])``, so the data are
deterministic by seed and independent of how many examples are asked for.

``prepare_synthetic`` (called by ``prepare_data`` for a ``synthetic:`` corpus, with tokenizer
``synthetic``) writes an ordinary prepared data directory, one example per document, plus one
boolean answer mask per split (``train.answer.npy``...). ``SyntheticSampler`` (``data.sampler =
"synthetic"``) pads each example to the sequence length and puts the loss on answer tokens only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from extrapos.data.batch import Batch
from extrapos.data.sampling import Sampler
from extrapos.data.shards import FORMAT, SPLITS, SplitWriter, TokenSplit, write_manifest
from extrapos.data.special_tokens import SPECIALS
from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.ruler_tasks import RulerShape
    from extrapos.data.tokenizer import HFTokenizer

PREFIX = "synthetic:"
TASKS = ("passkey", "kv-recall", "copy", "ruler")
# bump when a generator changes, to invalidate prepared data (2: ruler's vocabulary gained "=")
RECIPE = "extrapos-synthetic/2"

MARKERS = ["<key>", "<query>", "<copy>", "<sep>"]
DIGITS = [str(i) for i in range(10)]
KEYS = [f"k{i:02d}" for i in range(16)]
VALUES = [f"v{i:02d}" for i in range(16)]
FILLER = [f"f{i:02d}" for i in range(16)]
VOCAB = SPECIALS + MARKERS + DIGITS + KEYS + VALUES + FILLER
ID = {w: i for i, w in enumerate(VOCAB)}
EOT, PAD = ID["<|endoftext|>"], ID["<|pad|>"]
KEY, QUERY, COPY, SEP = (ID[m] for m in MARKERS)
DIGIT_IDS = np.array([ID[d] for d in DIGITS])
KEY_IDS = np.array([ID[k] for k in KEYS])
VALUE_IDS = np.array([ID[v] for v in VALUES])
FILLER_IDS = np.array([ID[f] for f in FILLER])
SYMBOL_IDS = np.concatenate([KEY_IDS, VALUE_IDS])  # the alphabet copied by the copy task
STREAMS = {"train": 0, "val": 1, "test": 2, "eval": 3}
#: the SyntheticTask fields only ``ruler`` reads
RULER_FIELDS = ("needles", "hops", "vt_digits", "var_letters", "common", "coded_letters", "uuid_hex")


@dataclass(frozen=True)
class SyntheticTask:
    """One synthetic task and its data sizes; ``parse("synthetic:kv-recall:pairs=8")`` reads a spec."""

    task: str
    length: int = 64
    min_length: int | None = None
    train: int = 20_000
    val: int = 256
    test: int = 256
    seed: int = 0
    digits: int = 5
    pairs: int = 4
    queries: int = 2
    # ruler only (None: RULER's default; ``extrapos.data.ruler_tasks.RulerShape``), kept out of the other
    # tasks' specs and cache keys
    needles: int | None = None
    hops: int | None = None
    vt_digits: int | None = None
    var_letters: int | None = None
    common: int | None = None
    coded_letters: int | None = None
    uuid_hex: int | None = None

    @classmethod
    def parse(cls, spec: str) -> SyntheticTask:
        spec = spec.strip()
        if not spec.startswith(PREFIX):
            raise UserError(f"'{spec}' is not a synthetic corpus spec; write synthetic:TASK[:key=value,...].")
        task, _, rest = spec[len(PREFIX) :].partition(":")
        values: dict[str, int] = {}
        names = {f.name for f in dataclasses.fields(cls)} - {"task"}
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in names:
                raise UserError(
                    f"cannot read '{item}' in '{spec}'; synthetic options are key=value with key one of "
                    f"{', '.join(sorted(names))}."
                )
            try:
                values[key] = int(value)
            except ValueError:
                raise UserError(f"synthetic option {key} must be an integer, got '{value}'.") from None
        return cls(task, **values).validate()

    def validate(self) -> SyntheticTask:
        if self.task not in TASKS:
            raise UserError(f"unknown synthetic task '{self.task}'; choose one of {', '.join(TASKS)}.")
        for name in ("length", "train", "val", "test", "digits", "pairs", "queries"):
            if getattr(self, name) < (0 if name in ("train", "val", "test") else 1):
                raise UserError(f"synthetic option {name} must be positive, got {getattr(self, name)}.")
        if self.task != "ruler" and any(getattr(self, k) is not None for k in RULER_FIELDS):
            raise UserError(
                f"synthetic:{self.task} takes none of {', '.join(RULER_FIELDS)}; they size ruler only."
            )
        if self.task == "ruler":
            self.ruler_shape  # noqa: B018 (checks the sizes)
        if self.pairs > len(KEYS):
            raise UserError(f"kv-recall has {len(KEYS)} distinct keys; use pairs <= {len(KEYS)}.")
        if self.queries > self.pairs:
            raise UserError(
                f"kv-recall asks distinct stored keys: queries ({self.queries}) must be <= pairs "
                f"({self.pairs})."
            )
        if self.length < self.shortest:
            raise UserError(
                f"synthetic:{self.task} needs examples of at least {self.shortest} tokens; set "
                f"length >= {self.shortest}."
            )
        if self.min_length is not None and not self.shortest <= self.min_length <= self.length:
            raise UserError(f"min_length must be in [{self.shortest}, {self.length}], got {self.min_length}.")
        return self

    @property
    def spec(self) -> str:
        """The canonical spec (every option explicit)."""
        fields = dataclasses.asdict(self)
        task = fields.pop("task")
        unused = {
            "passkey": ("pairs", "queries"),
            "kv-recall": ("digits",),
            "copy": ("digits", "pairs", "queries"),
            "ruler": ("pairs", "queries"),
        }
        return (
            PREFIX
            + task
            + ":"
            + ",".join(f"{k}={v}" for k, v in fields.items() if v is not None and k not in unused[task])
        )

    @property
    def shortest(self) -> int:
        """The shortest example length n this task can fill."""
        if self.task == "passkey":
            return 2 * (self.digits + 1)
        if self.task == "kv-recall":
            return 3 * (self.pairs + self.queries)
        if self.task == "ruler":  # every RULER task must fit (the end-of-text token after the answer)
            from extrapos.data.ruler_synthetic import shortest

            return shortest(self.ruler_shape) + 1
        return 3

    @property
    def train_min_length(self) -> int:
        return self.min_length if self.min_length is not None else self.shortest

    # ---- generation -------------------------------------------------------------------------------

    def example(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One example of length ``n``: (n + 1 token ids int64, n + 1 answer flags bool)."""
        if n < self.shortest:
            raise UserError(f"synthetic:{self.task} examples need at least {self.shortest} tokens, got {n}.")
        total = n + 1
        if self.task == "ruler":
            return self._ruler_example(total, rng)
        if self.task == "passkey":
            key = DIGIT_IDS[rng.integers(0, 10, self.digits)]
            hay = FILLER_IDS[rng.integers(0, len(FILLER_IDS), total - 2 * (self.digits + 1))]
            at = int(rng.integers(0, len(hay) + 1))
            ids = np.concatenate([hay[:at], [KEY], key, hay[at:], [QUERY], key])
            answer = np.zeros(total, dtype=bool)
            answer[-self.digits :] = True
        elif self.task == "kv-recall":
            keys = KEY_IDS[rng.permutation(len(KEY_IDS))[: self.pairs]]
            values = VALUE_IDS[rng.integers(0, len(VALUE_IDS), self.pairs)]
            n_fill = total - 3 * (self.pairs + self.queries)
            fill = FILLER_IDS[rng.integers(0, len(FILLER_IDS), n_fill)]
            cuts = np.sort(
                rng.integers(0, n_fill + 1, self.pairs)
            )  # where each pair block goes in the filler
            parts: list[np.ndarray | list[int]] = []
            prev = 0
            for c, k, v in zip(cuts, keys, values):
                parts += [fill[prev:c], [KEY, k, v]]
                prev = c
            parts.append(fill[prev:])
            asked = rng.permutation(self.pairs)[: self.queries]
            for q in asked:
                parts.append([QUERY, keys[q], values[q]])
            ids = np.concatenate(parts)
            answer = np.zeros(total, dtype=bool)
            answer[total - 3 * self.queries + 2 :: 3] = True
        else:  # copy
            m = (total - 2) // 2
            lead = total - 2 - 2 * m
            xs = SYMBOL_IDS[rng.integers(0, len(SYMBOL_IDS), m)]
            ids = np.concatenate([FILLER_IDS[rng.integers(0, len(FILLER_IDS), lead)], [COPY], xs, [SEP], xs])
            answer = np.zeros(total, dtype=bool)
            answer[-m:] = True
        return ids.astype(np.int64), answer

    @property
    def ruler_shape(self) -> RulerShape:
        """The RULER task sizes of this spec (``digits`` and the ruler-only fields; the short template)."""
        from extrapos.data.ruler_tasks import RulerShape

        given = {k: getattr(self, k) for k in RULER_FIELDS if getattr(self, k) is not None}
        return RulerShape(digits=self.digits, template="short", **given).check()

    def _ruler_example(self, total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A RULER task drawn uniformly (``ruler_synthetic``): its prompt, answer and end-of-text token,
        ``total`` tokens in all, the answer and end-of-text flagged."""
        from extrapos.data.ruler_synthetic import example

        return example(self.ruler_shape, total, rng)

    def split_examples(self, split: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """The examples of a prepared split: train lengths uniform in [min_length, L_t], val/test exactly
        L_t."""
        count = getattr(self, split)
        out = []
        for i in range(count):
            rng = np.random.default_rng([self.seed, STREAMS[split], i])
            n = int(rng.integers(self.train_min_length, self.length + 1)) if split == "train" else self.length
            out.append(self.example(n, rng))
        return out

    def eval_examples(self, n: int, count: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``count`` fresh examples of length exactly ``n`` (e.g. k x L_t): (count, n + 1) ids and answer
        flags."""
        seed = self.seed if seed is None else seed
        pairs = [self.example(n, np.random.default_rng([seed, STREAMS["eval"], n, i])) for i in range(count)]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def is_synthetic(spec: str) -> bool:
    return isinstance(spec, str) and spec.strip().startswith(PREFIX)


def build_tokenizer(task: str | None = None) -> HFTokenizer:
    """The fixed word-level tokenizer of the synthetic vocabulary (one token per space-separated word); the
    ``ruler`` task has its own (``ruler_prompts.synthetic_tokenizer``: RULER's words whole, the rest
    spelled)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers

    from extrapos.data.tokenizer import HFTokenizer

    if task == "ruler":
        from extrapos.data.ruler_prompts import synthetic_tokenizer

        return synthetic_tokenizer()
    backend = RustTokenizer(models.WordLevel(dict(ID), unk_token="<|mask|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(SPECIALS)
    return HFTokenizer(backend, source="synthetic")


# ---- a prepared data directory -------------------------------------------------------------------------


def answer_path(directory: Path, split: str) -> Path:
    return Path(directory) / f"{split}.answer.npy"


def prepare_synthetic(
    corpus: str, tokenizer: str, out: str | Path | None = None, progress: bool = True
) -> tuple[Path, bool]:
    """Write (or reuse) the prepared data directory of a ``synthetic:`` spec; returns ``(directory,
    reused)``."""
    from extrapos.data.cache import cache_root, publish, reusable

    if tokenizer.strip() != "synthetic":
        raise UserError(
            f"synthetic corpora use their own fixed vocabulary; set the tokenizer to 'synthetic' "
            f"(data.tokenizer = \"synthetic\" or --tokenizer synthetic), not '{tokenizer}'."
        )
    task = SyntheticTask.parse(corpus)
    fields = {k: v for k, v in dataclasses.asdict(task).items() if k not in RULER_FIELDS or v is not None}
    inputs = {"format": FORMAT, "recipe": RECIPE, "synthetic": fields}
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    target = (
        Path(out).expanduser() if out is not None else cache_root() / "data" / f"synthetic-{task.task}-{key}"
    )
    if reusable(target, key):
        return target, True
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        started = time.perf_counter()
        tok = build_tokenizer(task.task)
        tok.save(tmp)
        ruler = task.task == "ruler"
        words = VOCAB if not ruler else [tok.decode([i]) for i in range(tok.vocab_size)]
        word_bytes = np.array([len(w.encode()) + 1 for w in words])  # the text is space-separated words
        splits = {}
        for split in SPLITS:
            writer = SplitWriter(tmp, split, "uint16" if ruler else "uint8")  # ruler's vocabulary > 255
            examples = task.split_examples(split)
            for ids, _ in examples:
                writer.add(ids, int(word_bytes[ids].sum()))
            splits[split] = writer.close()
            masks = np.concatenate([a for _, a in examples]) if examples else np.zeros(0, dtype=bool)
            np.save(answer_path(tmp, split), masks)
        manifest = {
            "format": FORMAT,
            "key": key,
            "corpus": task.spec,
            "text_field": "text",
            "tokenizer": {
                "spec": "synthetic",
                "kind": tok.kind,
                "hash": tok.hash,
                "vocab_size": tok.vocab_size,
                "eot_id": tok.eot_id,
            },
            "dtype": "uint16" if ruler else "uint8",
            "documents_read": sum(s["num_docs"] for s in splits.values()),
            "splits": splits,
            "synthetic": dataclasses.asdict(task),
            "inputs": inputs,
            "seconds": round(time.perf_counter() - started, 2),
        }
        write_manifest(tmp, manifest)  # last: a directory without a manifest is never trusted
        return target, publish(tmp, target, key)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def task_of(data_dir: str | Path) -> SyntheticTask | None:
    """The synthetic task a prepared data directory holds (None for a text corpus)."""
    from extrapos.data.shards import read_manifest

    raw = read_manifest(data_dir).get("synthetic")
    return SyntheticTask(**raw).validate() if raw else None


class SyntheticSampler(Sampler):
    """One example per row, right-padded to ``seq_len``; the loss mask covers the answer tokens only.

    Items are the split's examples (documents) that fit in ``seq_len``; positions run 0..n-1 in
    every row and padding comes after the example, so causal attention never lets it change the
    example's own predictions.
    """

    def __init__(
        self,
        split: TokenSplit,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__(split, seq_len, batch_size, seed, rank, world_size)
        path = answer_path(split.directory, split.split)
        if not path.is_file():
            raise UserError(
                f"'{split.directory}' holds no answer masks; data.sampler = \"synthetic\" needs a "
                'synthetic corpus (data.corpus = "synthetic:passkey", data.tokenizer = "synthetic").'
            )
        self.answer = np.load(path, mmap_mode="r")
        if len(self.answer) != split.num_tokens:
            raise UserError(
                f"the answer masks of '{split.directory}' do not match its tokens; prepare the data again."
            )
        self._items = np.flatnonzero((split.doc_lengths >= 2) & (split.doc_lengths <= seq_len + 1))
        self._check_not_empty("example")

    @property
    def num_items(self) -> int:
        return len(self._items)

    def _build_batch(self, items: np.ndarray, epochs: np.ndarray) -> Batch:
        rows = len(items)
        tokens = np.full((rows, self.seq_len + 1), PAD, dtype=np.int64)
        answer = np.zeros((rows, self.seq_len + 1), dtype=bool)
        for r, d in enumerate(self._items[items].tolist()):
            a, b = int(self.split.offsets[d]), int(self.split.offsets[d + 1])
            tokens[r, : b - a] = self.split.tokens[a:b]
            answer[r, : b - a] = self.answer[a:b]
        tokens_t = torch.from_numpy(tokens)
        return Batch(
            tokens=tokens_t[:, :-1].contiguous(),
            targets=tokens_t[:, 1:].contiguous(),
            positions=torch.arange(self.seq_len).repeat(rows, 1),
            loss_mask=torch.from_numpy(answer[:, 1:].copy()),
        )
