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

import numpy as np
import torch

from extrapos.data.batch import Batch
from extrapos.data.sampling import Sampler
from extrapos.data.shards import FORMAT, SPLITS, SplitWriter, TokenSplit, write_manifest
from extrapos.errors import UserError

PREFIX = "synthetic:"
TASKS = ("passkey", "kv-recall", "copy", "ruler")
RECIPE = "extrapos-synthetic/1"  # bump when a generator changes, to invalidate prepared data

SPECIALS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]
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
            "ruler": (),
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
        if self.task == "ruler":  # every RULER task must fit: its needles (or list), question and answer
            return max(
                ruler_min_words(t, self.pairs, self.queries, self.digits)
                + len(
                    ruler_content(
                        t, np.random.default_rng(0), 64, self.pairs, self.queries, self.digits
                    ).answer
                )
                - 1
                for t in RULER_TASKS
            )
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
            parts, prev = [], 0
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

    def _ruler_example(self, total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A RULER task drawn uniformly, its prompt in the word vocabulary with the filler haystack, then its
        answer; ``total`` tokens in all, the answer flagged."""
        task = RULER_TASKS[int(rng.integers(0, len(RULER_TASKS)))]
        answer_len = len(
            ruler_content(task, np.random.default_rng(0), 64, self.pairs, self.queries, self.digits).answer
        )
        _, prompt, answer, _ = assemble_ruler(
            task,
            total - answer_len,
            rng,
            ruler_word_ids,
            ruler_filler_hay,
            ruler_filler_boundary,
            pairs=self.pairs,
            queries=self.queries,
            digits=self.digits,
        )
        flags = np.zeros(total, dtype=bool)
        flags[-len(answer) :] = True
        return np.asarray(prompt + answer, dtype=np.int64), flags

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


def build_tokenizer(task: str | None = None):
    """The fixed word-level tokenizer of the synthetic vocabulary (one token per space-separated word); the
    ``ruler`` task has its own (``RULER_VOCAB``: the words of its templates, pools and filler)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers

    from extrapos.data.tokenizer import HFTokenizer

    vocab = RULER_ID if task == "ruler" else ID
    backend = RustTokenizer(models.WordLevel(dict(vocab), unk_token="<|mask|>"))
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
    inputs = {"format": FORMAT, "recipe": RECIPE, "synthetic": dataclasses.asdict(task)}
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
        words = RULER_VOCAB if task.task == "ruler" else VOCAB
        word_bytes = np.array([len(w.encode()) + 1 for w in words])  # the text is space-separated words
        splits = {}
        for split in SPLITS:
            writer = SplitWriter(tmp, split, "uint8")
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
            "dtype": "uint8",
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


# ---- RULER-style tasks (Hsieh et al. 2024) ---------------------------------------------------------------
#
# The content of the seven RULER tasks as words: which sentences ("needles") go into the haystack, which
# question ends the prompt and which words answer it. The words are joined by spaces, so a run's own
# tokenizer turns them into a prompt (``extrapos.tasks.ruler``: haystack = filler text or held-out corpus)
# and the fixed word-level vocabulary below turns them into training examples (``synthetic:ruler``): the
# same generator makes both. Keys, values and listed words are drawn from small pools of words that are
# one token each in the word-level vocabulary, so every candidate answer has the answer's token length.

RULER_TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
#: keys of the needles, names of the variables, and the listed words of cwe / fwe
RULER_WORDS = (
    "apple river candle forest silver button garden rocket pillow marble violin lemon castle anchor "
    "feather bridge tiger window copper meadow puzzle lantern saddle harbor pepper glacier thunder wagon "
    "orchid falcon compass velvet"
).split()
RULER_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NUMBER = ["the", "magic", "number", "for"]
RULER_SENTENCES = (
    "The magic number for is are and numbers . ? What Which variables equal VAR = They most common frequent "
    "words in the list : Answer"
).split()
RULER_VOCAB = SPECIALS + sorted(set(RULER_WORDS + DIGITS + RULER_SENTENCES + RULER_FILLER.split()))
RULER_ID = {w: i for i, w in enumerate(RULER_VOCAB)}
#: how many of the listed words the cwe and fwe questions ask for (RULER asks for 10 and 3)
RULER_TOP = 3
#: variable-tracking chains: each assigns a value, then passes it on ``RULER_HOPS`` times
RULER_HOPS = 2


@dataclass
class RulerContent:
    """One RULER example as words: ``needles`` (sentences hidden in the haystack in this order), or
    ``listing`` (cwe / fwe: the words that make up the whole context), then ``question``; ``answer``
    continues the question. ``distractors`` are wrong answers found in the context (the other keys'
    values, the other chain's variables): ranked first among the candidates. ``kind`` and ``size`` say
    how a random alternative answer is drawn (``size`` values of ``digits`` digits, or ``size`` distinct
    pool words)."""

    task: str
    needles: list[list[str]]
    listing: list[str] | None
    question: list[str]
    answer: list[str]
    distractors: list[list[str]]
    kind: str  # "values" or "words"
    size: int
    digits: int

    def alternative(self, rng: np.random.Generator) -> list[str]:
        """A random answer of the same shape: exchangeable with the true one under a model that ignores the
        context, so such a model ranks the true answer first 1 / candidates of the time."""
        if self.kind == "values":
            return [w for _ in range(self.size) for w in _value(rng, self.digits)]
        return [RULER_WORDS[i] for i in rng.permutation(len(RULER_WORDS))[: self.size]]


def _value(rng: np.random.Generator, digits: int) -> list[str]:
    return [DIGITS[i] for i in rng.integers(0, 10, digits)]


def _needle(key: str, value: list[str]) -> list[str]:
    return ["The", "magic", "number", "for", key, "is", *value, "."]


def ruler_content(
    task: str, rng: np.random.Generator, words: int = 0, pairs: int = 4, queries: int = 2, digits: int = 4
) -> RulerContent:
    """The words of one example of ``task`` (one of ``RULER_TASKS``). ``pairs``: needles of niah_multikey and
    niah_multiquery, values of niah_multivalue; ``queries``: keys asked by niah_multiquery; ``digits``: per
    value; ``words``: how many words cwe / fwe list (the context they fill)."""
    keys = [RULER_WORDS[i] for i in rng.permutation(len(RULER_WORDS))]
    if task in ("niah_single", "niah_multikey"):
        n = 1 if task == "niah_single" else pairs
        values = [_value(rng, digits) for _ in range(n)]
        needles = [_needle(k, v) for k, v in zip(keys, values)]
        asked = int(rng.integers(0, n))
        order = rng.permutation(n)
        return RulerContent(
            task,
            [needles[i] for i in order],
            None,
            [
                "What",
                "is",
                "the",
                "magic",
                "number",
                "for",
                keys[asked],
                "?",
                "The",
                *NUMBER[1:],
                keys[asked],
                "is",
            ],
            values[asked],
            [v for i, v in enumerate(values) if i != asked],
            "values",
            1,
            digits,
        )
    if task == "niah_multivalue":
        values = [_value(rng, digits) for _ in range(pairs)]
        k = keys[0]
        q = [
            "What",
            "are",
            "the",
            "magic",
            "numbers",
            "for",
            k,
            "?",
            "The",
            "magic",
            "numbers",
            "for",
            k,
            "are",
        ]
        return RulerContent(
            task,
            [_needle(k, v) for v in values],
            None,
            q,
            [w for v in values for w in v],
            [],
            "values",
            pairs,
            digits,
        )
    if task == "niah_multiquery":
        values = [_value(rng, digits) for _ in range(pairs)]
        needles = [_needle(k, v) for k, v in zip(keys, values)]
        asked = rng.permutation(pairs)[:queries].tolist()
        names = [w for i, j in enumerate(asked) for w in ([keys[j]] if i == 0 else ["and", keys[j]])]
        q = [
            "What",
            "are",
            "the",
            "magic",
            "numbers",
            "for",
            *names,
            "?",
            "The",
            "magic",
            "numbers",
            "for",
            *names,
            "are",
        ]
        return RulerContent(
            task, needles, None, q, [w for j in asked for w in values[j]], [], "values", queries, digits
        )
    if task == "vt":
        # two chains: VAR a = 1234 . VAR b = a . VAR c = b . ; the question asks for the first chain's names
        chains, values = [], []
        for c in range(2):
            names = keys[c * (RULER_HOPS + 1) : (c + 1) * (RULER_HOPS + 1)]
            values.append(_value(rng, digits))
            steps = [["VAR", names[0], "=", *values[-1], "."]]
            steps += [["VAR", names[i], "=", names[i - 1], "."] for i in range(1, len(names))]
            chains.append((names, steps))
        # interleave the chains' steps, each chain's in its own order
        take = rng.permutation([0] * len(chains[0][1]) + [1] * len(chains[1][1]))
        pos, needles = [0, 0], []
        for c in take:
            needles.append(chains[c][1][pos[c]])
            pos[c] += 1
        q = ["Which", "variables", "equal", *values[0], "?", "They", "are"]
        return RulerContent(
            task, needles, None, q, chains[0][0], [chains[1][0]], "words", RULER_HOPS + 1, digits
        )
    if task in ("cwe", "fwe"):
        listing, answer = (_common_words if task == "cwe" else _frequent_words)(rng, words, keys)
        what = "common" if task == "cwe" else "frequent"
        q = [
            "What",
            "are",
            "the",
            DIGITS[RULER_TOP],
            "most",
            what,
            "words",
            "in",
            "the",
            "list",
            "?",
            "They",
            "are",
        ]
        return RulerContent(task, [], listing, q, answer, [], "words", RULER_TOP, digits)
    raise UserError(f"unknown RULER task {task!r}; choose from {', '.join(RULER_TASKS)}.")


def _common_words(rng: np.random.Generator, n: int, pool: list[str]) -> tuple[list[str], list[str]]:
    """cwe (RULER's common words extraction): ``RULER_TOP`` words appear ``c`` times each, every other pool
    word at most ``c - 1`` times, ``n`` words in all, shuffled; the answer lists the common words in the order
    they first appear. ``c`` is three times the rare words' share (RULER: 30 to 3), more when the rare words
    could not fill the list otherwise."""
    common, rare = pool[:RULER_TOP], pool[RULER_TOP:]
    R = len(rare)
    c = max(3 * max(1, n // (R + 3 * RULER_TOP)), -(-(n + R) // (RULER_TOP + R)))
    counts = {w: c for w in common}
    room = n - RULER_TOP * c
    for i, w in enumerate(rare):  # the rare words fill the rest, evenly, each below c
        counts[w] = room // R + (1 if i < room % R else 0)
    listing = [w for w, k in counts.items() for _ in range(k)]
    listing = [listing[i] for i in rng.permutation(len(listing))]
    return listing, sorted(common, key=listing.index)


def _zipf_counts(n: int, size: int) -> np.ndarray:
    """Counts of ``size`` words in a list of ``n``, following Zipf's law with exponent 2 (RULER's alpha)."""
    weights = 1.0 / np.arange(1, size + 1) ** 2
    counts = np.floor(n * weights / weights.sum()).astype(int)
    counts[0] += n - counts.sum()  # exactly n words
    return counts


def _frequent_words(rng: np.random.Generator, n: int, pool: list[str]) -> tuple[list[str], list[str]]:
    """fwe (RULER's frequent words extraction): ``n`` words with Zipf counts over the pool, shuffled; the
    answer is the ``RULER_TOP`` most frequent words, most frequent first."""
    counts = _zipf_counts(n, len(pool))
    listing = [pool[i] for i in range(len(pool)) for _ in range(counts[i])]
    listing = [listing[i] for i in rng.permutation(len(listing))]
    return listing, pool[:RULER_TOP]


def ruler_min_listing(task: str) -> int:
    """The fewest words a cwe / fwe list needs: every rare word once beside the common ones (cwe), the asked
    words' counts strictly above the next word's, which appears (fwe), so the answer is the only right one."""
    if task == "cwe":
        return 3 * RULER_TOP + len(RULER_WORDS) - RULER_TOP
    n = RULER_TOP + 1
    while True:
        counts = _zipf_counts(n, len(RULER_WORDS))[: RULER_TOP + 1]
        if counts[-1] >= 1 and np.all(np.diff(counts) < 0):  # the next word is there, and below them
            return n
        n += 1


def ruler_min_words(task: str, pairs: int = 4, queries: int = 2, digits: int = 4) -> int:
    """The fewest words an example of ``task`` holds: its needles and question (cwe / fwe: a list long enough
    that the asked words stand out, then the question)."""
    if task in ("cwe", "fwe"):
        return ruler_min_listing(task) + len(ruler_content(task, np.random.default_rng(0), 64).question)
    c = ruler_content(task, np.random.default_rng(0), 0, pairs, queries, digits)
    return sum(len(s) for s in c.needles) + len(c.question)


def assemble_ruler(
    task: str,
    length: int,
    rng: np.random.Generator,
    encode,
    hay,
    boundary,
    word_tokens: int = 1,
    pairs: int = 4,
    queries: int = 2,
    digits: int = 4,
) -> tuple[RulerContent, list[int], list[int], list[int]]:
    """One prompt of exactly ``length`` tokens: ``(content, prompt, answer tokens, needle starts)``.

    ``encode(words)``: token ids of words joined by spaces; ``hay(n, rng)``: n haystack tokens;
    ``boundary(hay, target)``: the insertion point between sentences (words) nearest to ``target``;
    ``word_tokens``: the most tokens a pool word takes. Needles go at uniformly random depths, in their
    order; a cwe / fwe list fills the prompt (haystack tokens before it make up what a word cannot).
    """
    if task in ("cwe", "fwe"):
        question = encode(ruler_content(task, np.random.default_rng(0), 64).question)
        budget = length - len(question)
        words = budget // word_tokens
        least = ruler_min_listing(task)
        if words < least:
            raise UserError(
                f"a {task} prompt of {length} tokens cannot hold a list of {least} words and the question "
                f"({least * word_tokens + len(question)} tokens); use longer lengths."
            )
        content = ruler_content(task, rng, words, pairs, queries, digits)
        listing = encode(content.listing)  # at most words x word_tokens <= budget tokens
        prompt = hay(budget - len(listing), rng) + listing + question
        return content, prompt, encode(content.answer), []
    content = ruler_content(task, rng, 0, pairs, queries, digits)
    needles = [encode(n) for n in content.needles]
    question = encode(content.question)
    hay_len = length - sum(map(len, needles)) - len(question)
    if hay_len < 0:
        raise UserError(
            f"a {task} prompt of {length} tokens cannot hold its needles and question "
            f"({length - hay_len} tokens); use longer lengths."
        )
    hay_tokens = hay(hay_len, rng)
    points = sorted(boundary(hay_tokens, int(round(t))) for t in np.sort(rng.random(len(needles))) * hay_len)
    prompt, starts, prev = [], [], 0
    for at, needle in zip(points, needles):
        prompt += hay_tokens[prev:at]
        starts.append(len(prompt))
        prompt += needle
        prev = at
    prompt += hay_tokens[prev:] + question
    return content, prompt, encode(content.answer), starts


def ruler_word_ids(words: list[str]) -> list[int]:
    """Token ids of words in the RULER word-level vocabulary (one token per word)."""
    return [RULER_ID[w] for w in words]


_RULER_FILLER_IDS = ruler_word_ids(RULER_FILLER.split())
#: where a sentence of the filler starts (offsets into one copy)
_RULER_FILLER_STARTS = [0] + [i + 1 for i, w in enumerate(RULER_FILLER.split()) if w.endswith(".")][:-1]


def ruler_filler_hay(n: int, rng: np.random.Generator) -> list[int]:
    """n tokens of the filler, repeated (the passkey haystack of Mohtashami & Jaggi 2023, in words)."""
    reps = n // len(_RULER_FILLER_IDS) + 1
    return (_RULER_FILLER_IDS * reps)[:n]


def ruler_filler_boundary(hay: list[int], target: int) -> int:
    """The start of the filler sentence nearest to ``target`` (0 always qualifies, ``len(hay)`` only as the
    target itself)."""
    F = len(_RULER_FILLER_IDS)
    base = target - target % F
    points = [b + s for b in (base - F, base, base + F) for s in _RULER_FILLER_STARTS]
    points = [p for p in points if 0 <= p < len(hay)] + [0] + ([len(hay)] if target >= len(hay) else [])
    return min(points, key=lambda p: (abs(p - target), p))
