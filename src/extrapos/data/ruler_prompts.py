"""RULER examples as tokens of an exact length (Hsieh et al. 2024, §3), for any tokenizer: the text of
``extrapos.data.ruler_tasks`` put into its haystack and encoded piece by piece.

A prompt is the prefix, the context and the question (with the answer prefix), each piece encoded after a
space; the target is the answer's tokens, and ``len(prompt) + len(target) = length + 1``, so at 1x the
target's last token is predicted at position L_t - 1, as in training. The context is

* a haystack of tokens cut to the exact length, the needles inserted between its parts: the noise paragraph
  repeated (needles at random paragraph starts, as RULER's noise haystack) or an essay-like text (needles at
  sentence starts, at depths drawn from RULER's 40 evenly spaced ones);
* or units (the needle haystack's needles, cwe's list, fwe's text, qa's documents): as many as fit, found by
  a search like RULER's, the rest of the length made up by noise before them.

The reported depth is where the (first) asked needle sits, as a fraction of the context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from extrapos.data import ruler_words as W
from extrapos.data.ruler_tasks import DEPTHS, TASKS, RulerShape, RulerText, generate, least_units
from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.tokenizer import HFTokenizer, Tokenizer

#: redraws of an example whose haystack happens to hold an answer (or too few ranked answers fit)
_TRIES = 20
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class RulerPrompt:
    """One example in tokens: the prompt, the target (the answer's tokens), its text, the asked needle's
    depth in [0, 1] (None when the task has no needle), the ranking form's wrong targets and their texts."""

    task: str
    tokens: list[int]
    target: list[int]
    text: RulerText
    depth: float | None = None
    wrong: list[list[int]] = field(default_factory=list)
    wrong_text: list[str] = field(default_factory=list)


class Essay:
    """An essay-like haystack in tokens, cut into windows at sentence starts: the text is split into
    sentences and each is encoded after a space, so every sentence start is a token boundary."""

    def __init__(self, tokenizer: Any, text: str, source: str):
        sentences = [s for s in _SENTENCE_END.split(" ".join(text.split())) if s]
        if not sentences:
            raise UserError(f"the essay haystack {source} holds no text; pass another --essay.")
        pieces = tokenizer.encode_batch([" " + s for s in sentences])
        self.tokens = np.asarray([t for p in pieces for t in p], dtype=np.int64)
        self.starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
        self.source = source

    def window(self, n: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """``n`` tokens from a random sentence start (wrapping around) and the sentence starts in them."""
        total = len(self.tokens)
        first = int(rng.integers(len(self.starts)))
        begin = int(self.starts[first])
        idx = (begin + np.arange(n)) % total
        # the sentence starts from the window's on (0 among them), repeated while the window wraps around
        rel = np.concatenate([self.starts[first:] - begin, self.starts[:first] - begin + total])
        every = (rel[None, :] + total * np.arange(n // total + 1)[:, None]).ravel()
        return self.tokens[idx].tolist(), [int(s) for s in np.unique(every[every < n])]


class RulerBuilder:
    """Builds RULER examples for one tokenizer: ``shape`` sizes the tasks, ``essay`` is the essay-like
    haystack (an ``Essay``), ``qa`` maps "squad" / "hotpotqa" to loaded data (``ruler_qa.load_qa``)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        shape: RulerShape,
        essay: Essay | None = None,
        qa: dict[str, Any] | None = None,
    ):
        self.tok, self.shape, self.essay, self.qa = tokenizer, shape.check(), essay, qa or {}
        self.noise = self.encode(W.NOISE)
        self._units: dict[tuple[str, int, int], int] = {}
        self._length: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(" " + text) if text else []

    def same_length(self, a: str, b: str) -> bool:
        """Whether two values take the same number of tokens (the ranking form compares equal lengths)."""
        for s in (a, b):
            if s not in self._length:
                self._length[s] = len(self.encode(s))
        return self._length[a] == self._length[b]

    def reference(self, answer: str) -> str:
        """An answer as the tokenizer writes it back (what the metric looks for in decoded text)."""
        return self.tok.decode(self.encode(answer)).strip()

    # ---- one example ---------------------------------------------------------------------------------

    def build(self, task: str, length: int, rng: np.random.Generator, decoys: int = 0) -> RulerPrompt:
        """An example of ``task`` whose prompt and target take ``length + 1`` tokens; ``decoys``: the
        ranking form with that many wrong targets of the target's token length."""
        spec = TASKS[task]
        if spec.family == "qa" and spec.dataset not in self.qa:
            generate(task, self.shape, rng)  # raises: the data must be provided
        for _ in range(_TRIES):
            seed = int(rng.integers(2**63))
            p = (
                self._units_prompt(task, length, seed, decoys)
                if spec.haystack in ("needle", "list", "documents")
                else self._hay_prompt(task, length, seed, decoys)
            )
            if p is not None:
                return p
        raise UserError(
            f"could not build a {task} example of {length} tokens with one right answer and "
            f"{decoys} wrong ones of its token length; use another --essay or fewer --candidates."
        )

    def _text(self, task: str, seed: int, units: int, length: int, decoys: int) -> RulerText:
        spec = TASKS[task]
        return generate(
            task, self.shape, np.random.default_rng(seed), units, length, decoys, self.same_length,
            self.qa.get(spec.dataset),
        )  # fmt: skip

    def _finish(
        self,
        task: str,
        text: RulerText,
        tokens: list[int],
        target: list[int],
        depth: float | None,
        decoys: int,
    ) -> RulerPrompt | None:
        wrong = [
            (w, x)
            for w, x in ((self.encode(x), x) for x in text.wrong)
            if len(w) == len(target) or TASKS[task].family == "qa"
        ][:decoys]
        if len(wrong) < decoys:
            return None
        return RulerPrompt(task, tokens, target, text, depth, [w for w, _ in wrong], [x for _, x in wrong])

    def _hay_prompt(self, task: str, length: int, seed: int, decoys: int) -> RulerPrompt | None:
        text = self._text(task, seed, 0, length, decoys)
        rng = np.random.default_rng([seed, 1])
        prefix, question, target = (
            self.encode(text.prefix),
            self.encode(text.question),
            self.encode(text.target),
        )
        needles = [self.encode(n) for n in text.needles]
        hay_len = length + 1 - len(target) - len(prefix) - len(question) - sum(map(len, needles))
        if hay_len < 0:
            raise UserError(
                f"a {task} example of {length} tokens cannot hold its needles, question and answer "
                f"({length - hay_len} tokens); use longer lengths or smaller sizes."
            )
        if text.haystack == "essay":
            if self.essay is None:
                raise UserError(f"{task} needs an essay haystack; pass --essay.")
            hay, starts = self.essay.window(hay_len, rng)
            # RULER's depths: distinct ones of its 40 while they last, as sentence indices
            drawn = rng.choice(DEPTHS, len(needles), replace=len(needles) > len(DEPTHS))
            points = sorted(self._at(starts, hay_len, int(d) / 100) for d in drawn)
            if self._holds_answer(text, hay):
                return None
        else:
            hay = (self.noise * (hay_len // max(1, len(self.noise)) + 1))[:hay_len]
            starts = list(range(0, hay_len, max(1, len(self.noise))))
            points = (
                sorted(starts[int(i)] for i in rng.integers(0, len(starts), len(needles)))
                if starts
                else [0] * len(needles)
            )
        context, prev, at = [], 0, []
        for point, needle in zip(points, needles):
            context += hay[prev:point]
            at.append(len(context))
            context += needle
            prev = point
        context += hay[prev:]
        depth = None
        if text.asked is not None and needles:
            depth = points[text.asked] / hay_len if hay_len else 0.0
        return self._finish(task, text, prefix + context + question, target, depth, decoys)

    @staticmethod
    def _at(starts: list[int], hay_len: int, depth: float) -> int:
        """RULER's insertion point of a depth: the start of sentence int(depth x sentences)."""
        i = int(len(starts) * depth)
        return starts[i] if i < len(starts) else hay_len

    def _holds_answer(self, text: RulerText, hay: list[int]) -> bool:
        """Whether the haystack holds an answer or a key by chance (a second place to read it from)."""
        written = self.tok.decode(hay)
        return any(self.reference(a) in written for a in text.answers)

    def _fits(
        self, task: str, seed: int, units: int, length: int, decoys: int
    ) -> tuple[RulerText, list[list[int]], list[int], int]:
        text = self._text(task, seed, units, length, decoys)
        pieces = [
            self.encode(text.prefix),
            [t for u in text.units for t in self.encode(u)],
            self.encode(text.question),
        ]
        target = self.encode(text.target)
        room = length + 1 - len(target) - sum(map(len, pieces))
        return text, pieces, target, room

    def _units_prompt(self, task: str, length: int, seed: int, decoys: int) -> RulerPrompt | None:
        least = max(1, least_units(task, self.shape, length))
        key = (task, length, decoys)
        units = self._units.get(key)
        if units is None:  # RULER's search: the most units that fit, found once per task and length
            units = self._units[key] = self._most_units(task, length, seed, decoys, least)
        while True:
            text, pieces, target, room = self._fits(task, seed, units, length, decoys)
            if room >= 0 or units <= least:
                break
            units = max(least, units - max(1, units // 20))
        if room < 0:
            raise UserError(
                f"a {task} example of {length} tokens cannot hold its smallest context ({length - room} "
                "tokens); use longer lengths or smaller sizes."
            )
        pad = (self.noise * (room // max(1, len(self.noise)) + 1))[:room]
        prefix, body, question = pieces
        depth = None
        if text.asked is not None:
            depth = (room + len([t for u in text.units[: text.asked] for t in self.encode(u)])) / max(
                1, room + len(body)
            )
        return self._finish(task, text, prefix + pad + body + question, target, depth, decoys)

    def _most_units(self, task: str, length: int, seed: int, decoys: int, least: int) -> int:
        if self._fits(task, seed, least, length, decoys)[3] < 0:
            return least
        low, high = least, least * 2
        while self._fits(task, seed, high, length, decoys)[3] >= 0:
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            if self._fits(task, seed, mid, length, decoys)[3] >= 0:
                low = mid
            else:
                high = mid
        return low

    def min_length(self, task: str, decoys: int = 0) -> int:
        """The shortest length an example of ``task`` fits in (found by trying: a doubling, then a
        bisection)."""

        def fits(n: int) -> bool:
            try:
                self.build(task, n, np.random.default_rng(0), decoys)
                return True
            except UserError:
                return False

        low, high = 8, 16
        while not fits(high):
            if high > 1 << 22:
                raise UserError(f"no {task} example fits in {high} tokens; use smaller sizes.")
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if fits(mid) else (mid, high)
        return high


def synthetic_tokenizer() -> HFTokenizer:
    """The tokenizer of ``synthetic:ruler``: the RULER templates', pools' and fixed texts' words whole, and
    any other string (numbers, UUIDs, variables, coded words) spelled a character per token (WordPiece's
    "##" continuations), so every task's text has tokens."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from extrapos.data.special_tokens import SPECIALS
    from extrapos.data.tokenizer import HFTokenizer

    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    # every symbol the tasks write: vt's "VAR X = 12" read "VAR X <|mask|> 12" without "=" (issue 47); a
    # test tokenizes every task's text and finds no special token in it
    punct = list(".,:;?!'\"()-=")
    vocab = SPECIALS + W.fixed_words() + [c for c in chars + punct if c not in W.fixed_words()]
    vocab += ["##" + c for c in chars]
    vocab = list(dict.fromkeys(vocab))
    backend = RustTokenizer(
        models.WordPiece(
            {w: i for i, w in enumerate(vocab)}, unk_token="<|mask|>", max_input_chars_per_word=100
        )
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens(SPECIALS)
    return HFTokenizer(backend, source="synthetic")
