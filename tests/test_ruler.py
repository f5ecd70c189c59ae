"""RULER tasks (issue 26, item 1): every generator puts its answer in the context exactly as the task says
(and nowhere else), a stand-in model that reads the answer from the context scores 1.0 and one that ignores
the context scores chance, the intervals are the bootstrap of the examples, and the synthetic:ruler
training examples come from the same generator."""

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from extrapos.data import load_tokenizer, open_split
from extrapos.data.synthetic import (
    RULER_TASKS,
    RULER_TOP,
    RULER_WORDS,
    SyntheticTask,
    build_tokenizer,
)
from extrapos.errors import UserError
from extrapos.report import stats
from extrapos.tasks.ruler import RulerBuilder, cell_interval, format_ruler, score_prompts

WORDS = build_tokenizer("ruler")
DIGITS = 4


def words_of(tok, ids) -> list[str]:
    return tok.decode(list(ids)).split()


def needles(words: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(key, value) of every "The magic number for KEY is D D D D ." in the words."""
    out = []
    for i in range(len(words) - 5):
        if words[i : i + 4] == ["The", "magic", "number", "for"] and words[i + 5] == "is":
            out.append((words[i + 4], tuple(words[i + 6 : i + 6 + DIGITS])))
    return out


def solve(words: list[str]) -> list[str]:
    """The answer a reader of the prompt's words gives: an independent reading of each task's rule."""
    q = max(i for i, w in enumerate(words) if w in ("What", "Which"))
    context, question = words[:q], words[q:]
    if question[0] == "Which":  # vt: follow the assignments from the asked value
        value = tuple(question[3 : 3 + DIGITS])
        assigned = {}
        for i, w in enumerate(context):
            if w == "VAR":
                end = context.index(".", i)
                assigned[context[i + 1]] = tuple(context[i + 3 : end])
        found = [n for n, v in assigned.items() if v == value]
        for n, v in assigned.items():
            if len(v) == 1 and v[0] in found:
                found.append(n)
        return found
    if "common" in question or "frequent" in question:
        listed = [w for w in context if w in RULER_WORDS]
        counts = Counter(listed)
        top = sorted(counts, key=lambda w: -counts[w])[:RULER_TOP]
        return sorted(top, key=listed.index) if "common" in question else top
    asked = [w for w in question[question.index("for") + 1 : question.index("?")] if w != "and"]
    pairs = needles(context)
    if question[1] == "are" and len(asked) == 1:  # multi-value: every value of the key, in order
        return [d for k, v in pairs if k == asked[0] for d in v]
    return [d for a in asked for k, v in pairs if k == a for d in v]


class Reader(nn.Module):
    """A stand-in model that reads the answer from the context: at the question's last word ("is" / "are")
    and after it, it predicts the next word of ``solve(prompt)``; elsewhere uniform. ``constant``: the same
    random logits everywhere, whatever the context (a model that ignores it)."""

    def __init__(self, tok, constant: bool = False):
        super().__init__()
        self.tok, self.constant = tok, constant
        self.bias = nn.Parameter(torch.randn(tok.vocab_size, generator=torch.Generator().manual_seed(0)))

    def new_cache(self):
        return {"tokens": None}

    def hidden_states(self, tokens, positions, cache=None):
        B, T = tokens.shape
        out = (
            self.bias.detach().expand(B, T, -1).clone()
            if self.constant
            else torch.zeros(B, T, self.tok.vocab_size)
        )
        if cache is not None:
            full = tokens if cache["tokens"] is None else torch.cat([cache["tokens"], tokens], 1)
            cache["tokens"] = full
        else:
            full = tokens
        if self.constant:
            return out
        offset = full.shape[1] - T
        for b in range(B):
            words = words_of(self.tok, full[b].tolist())
            end = max(i for i, w in enumerate(words) if w in ("is", "are"))
            answer = [self.tok.encode(" " + w)[0] for w in solve(words[: end + 1])]
            for i, a in enumerate(answer):
                t = end + i - offset
                if 0 <= t < T:
                    out[b, t, a] = 20.0
        return out

    def logits(self, h):
        return h

    def forward(self, tokens, positions, cache=None):
        return self.hidden_states(tokens, positions, cache)


# ---- the generators ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", RULER_TASKS)
def test_each_task_puts_its_answer_in_the_context_as_specified(task):
    b = RulerBuilder(WORDS, digits=DIGITS)
    rng = np.random.default_rng(1)
    for length in (b.min_length(task), 200, 513):
        p = b.build(task, length, rng)
        assert len(p.tokens) + len(p.answer) == length + 1
        words = words_of(WORDS, p.tokens)
        assert words_of(WORDS, p.answer) == p.content.answer == solve(words)
        context = words[: max(i for i, w in enumerate(words) if w in ("What", "Which"))]
        found = needles(context)
        if task.startswith("niah"):
            keys = [k for k, _ in found]
            if task == "niah_multivalue":
                assert len(set(keys)) == 1 and len(found) == 4
            else:
                assert len(set(keys)) == len(keys) == (1 if task == "niah_single" else 4)  # distinct keys
            values = Counter(" ".join(v) for _, v in found)
            joined = " ".join(context)
            for v in values:  # each value once, and only inside its needle
                assert joined.count(v) == values[v] == 1
            if task == "niah_multikey":  # the other keys' values are the distractors
                assert sorted(" ".join(d) for d in p.content.distractors) == sorted(
                    v for v in values if v != " ".join(p.content.answer)
                )
        if task == "vt":
            assert sum(w == "VAR" for w in context) == 6 and len(p.content.answer) == 3
            assert not set(p.content.answer) & set(p.content.distractors[0])
        if task in ("cwe", "fwe"):
            counts = Counter(w for w in context if w in RULER_WORDS)
            top = [counts[w] for w in p.content.answer]
            rest = [c for w, c in counts.items() if w not in p.content.answer]
            assert min(top) > max(rest)  # the asked words stand out
            if task == "fwe":
                assert top == sorted(top, reverse=True) and len(set(top)) == RULER_TOP
        if task != "cwe" and task != "fwe":
            assert [p.tokens[s] for s in p.needle_starts] == [
                WORDS.encode(n[0])[0] for n in p.content.needles
            ]


def test_candidates_are_distinct_wrong_answers_of_the_answer_length():
    b = RulerBuilder(WORDS, digits=DIGITS)
    rng = np.random.default_rng(0)
    for task in RULER_TASKS:
        p = b.build(task, 300, rng)
        c = b.candidates(p, 10, rng)
        assert c[0] == p.answer and len({tuple(x) for x in c}) == 10
        assert all(len(x) == len(p.answer) for x in c)
        assert all(sorted(x) != sorted(p.answer) for x in c[1:])
        if task == "niah_multikey":  # the in-context distractors come first
            assert [words_of(WORDS, x) for x in c[1:4]] == p.content.distractors


def test_corpus_haystack_keeps_the_needles_whole_and_the_values_unique(tiny_data):
    tok = load_tokenizer(tiny_data)
    hay = np.asarray(open_split(tiny_data, "test").tokens)
    b = RulerBuilder(tok, hay, digits=DIGITS)
    rng = np.random.default_rng(2)
    for task in ("niah_single", "niah_multikey", "niah_multiquery", "vt"):
        p = b.build(task, 400, rng)
        text = tok.decode(p.tokens)
        for needle in p.content.needles:
            assert " ".join(needle) in text  # each needle whole, between words of the corpus
        for start in p.needle_starts:
            assert start == 0 or b.hay.starts_word(p.tokens[start])
        if task != "vt":
            assert text.count(" ".join(p.content.answer[:DIGITS])) == 1


def test_synthetic_ruler_examples_come_from_the_same_generator():
    t = SyntheticTask.parse("synthetic:ruler:length=128,digits=4")
    tok = build_tokenizer("ruler")
    seen = set()
    for i in range(40):
        ids, answer = t.example(128, np.random.default_rng([0, i]))
        assert len(ids) == 129 and answer[-1] and answer.sum() >= 3
        words = words_of(tok, ids[~answer].tolist())
        assert words_of(tok, ids[answer].tolist()) == solve(words)
        seen.add(words[-1])
    assert seen == {"is", "are"}
    with pytest.raises(UserError, match="min_length"):
        SyntheticTask.parse("synthetic:ruler:length=128,min_length=20")


# ---- scoring ---------------------------------------------------------------------------------------------


def _prompts(b, task, n, length, seed=0):
    rng = np.random.default_rng(seed)
    return [b.build(task, length, rng) for _ in range(n)]


@pytest.mark.parametrize("task", RULER_TASKS)
def test_a_model_that_reads_the_context_scores_one(task):
    b = RulerBuilder(WORDS, digits=DIGITS)
    r = score_prompts(Reader(WORDS), b, _prompts(b, task, 3, 160), "both", 6, np.random.default_rng(0))
    assert r["rank_accuracy"] == 1.0 and r["mean_rank"] == 1.0 and r["exact_match"] == 1.0


def test_a_model_that_ignores_the_context_scores_chance():
    b = RulerBuilder(WORDS, digits=DIGITS)
    model = Reader(WORDS, constant=True)
    hits = []
    for task in RULER_TASKS:
        r = score_prompts(model, b, _prompts(b, task, 40, 100, seed=3), "both", 5, np.random.default_rng(1))
        hits += r["per_example"]["rank_accuracy"][0]
        assert r["exact_match"] == 0.0 and r["chance"] == 0.2
    # chance 0.2 over 280 examples: standard deviation 0.024
    assert 0.13 <= np.mean(hits) <= 0.27


def test_cell_interval_is_the_bootstrap_of_the_examples():
    cell = {"rank_accuracy": 0.5, "per_example": {"rank_accuracy": [[1, 0] * 20, [1] * 40]}}
    iv = cell_interval(cell, "rank_accuracy")
    assert iv == stats.loss_interval([1, 0] * 20, [1] * 40)
    assert iv.estimate == 0.5 and iv.low < 0.5 < iv.high
    assert 0.2 < iv.high - iv.low < 0.4  # normal approximation: 2 x 1.96 x sqrt(0.25 / 40) = 0.31
    perfect = cell_interval({"per_example": {"rank_accuracy": [[1] * 9, [1] * 9]}}, "rank_accuracy")
    assert (perfect.low, perfect.high) == (1.0, 1.0)
    assert cell_interval({"per_example": {}}, "exact_match") is None


def test_grid_shows_each_task_and_length_with_its_interval():
    cells = [
        {
            "task": t,
            "ev": k,
            "length": 64 * k,
            "rank_accuracy": 1.0 / k,
            "per_example": {"rank_accuracy": [[1] * (4 // k) + [0] * (4 - 4 // k), [1] * 4]},
        }
        for t in ("niah_single", "cwe")
        for k in (1, 2)
    ]
    result = {
        "request": {"mode": "rank", "trials": 4, "haystack": "filler", "candidates": 10},
        "encoding": "rope",
        "train_length": 64,
        "metric": "rank_accuracy",
        "results": cells,
    }
    grid = format_ruler(result)
    assert "| niah_single | 1.00 [1.00, 1.00] | 0.50 [" in grid and "| cwe |" in grid
    assert "| **mean** | 1.00 | 0.50 |" in grid and "(chance: 0.10)" in grid
