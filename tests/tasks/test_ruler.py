"""RULER's 13 tasks (issue 36, item 1): every generator's answer is the one right answer a reader of the
context finds (10,000 draws per task, RULER's form and the ranking form alike), the ranking form's wrong
answers are made of in-context values so that copying scores chance, the recall metric is RULER's, the
prompts have their exact length and haystack, and the per-depth table bins the needles' depths."""

import re
from collections import Counter

import numpy as np
import pytest

from extrapos.data import ruler_words as W
from extrapos.data.ruler_prompts import Essay, RulerBuilder, synthetic_tokenizer
from extrapos.data.ruler_tasks import (
    SYNTHETIC_TASKS,
    TASK_NAMES,
    TASKS,
    RulerShape,
    generate,
)
from extrapos.errors import UserError
from extrapos.tasks.ruler_report import depth_table, format_depths

TOK = synthetic_tokenizer()
ESSAY = Essay(TOK, W.synthetic_essay(), "builtin")
SMALL = RulerShape(
    digits=2,
    needles=2,
    hops=2,
    vt_digits=2,
    var_letters=1,
    common=3,
    coded_letters=1,
    uuid_hex=4,
    template="short",
)
RETRIEVAL = [t for t in TASK_NAMES if t.startswith("niah")] + ["vt"]


# ---- an independent reader of the context ------------------------------------------------------------

NEEDLE = re.compile(r"One of the special magic (\w+) for (\S+) is: (\S+)\.")


def solve(task: str, context: str, question: str) -> list[str]:
    """Every right answer a reader of the context finds for the question, read with the task's own rule."""
    family = TASKS[task].family
    if family == "niah":
        found = NEEDLE.findall(context)
        asked = re.search(r"for (.+?) (?:mentioned|are|is)", question).group(1)
        keys = [k for k in re.split(r", and |, ", asked)]
        return [v for k in keys for _, key, v in found if key == k]
    if family == "vt":
        value = re.search(r"value (\d+)", question).group(1)
        assigned = dict(re.findall(r"VAR (\w+) = (\w+(?: \w+)?)\.", context))
        names = [n for n, v in assigned.items() if v == value]
        grew = True
        while grew:
            more = [
                n for n, v in assigned.items() if v.startswith("VAR ") and v[4:] in names and n not in names
            ]
            names += more
            grew = bool(more)
        return names
    if family == "cwe":
        counts = Counter(re.findall(r"\d+\. (\S+)", context))
        ranked = counts.most_common()
        k = int(re.search(r"top (\d+)", question).group(1))
        if len(ranked) > k and ranked[k - 1][1] == ranked[k][1]:
            return []  # ties: no single answer
        return [w for w, _ in ranked[:k]]
    counts = Counter(w for w in context.split() if w != "...")
    ranked = counts.most_common()
    if len(ranked) > 3 and ranked[2][1] == ranked[3][1]:
        return []
    return [w for w, _ in ranked[:3]]


def context_of(t) -> str:
    return " ".join(t.needles + t.units)


def values_of(answer: str, task: str) -> list[str]:
    family = TASKS[task].family
    if family == "cwe":
        return re.findall(r"\d+\. (\S+)", answer)
    return answer.split(", ") if family == "niah" else answer.split(" ")


# ---- the generators ----------------------------------------------------------------------------------


def test_thirteen_tasks_with_ruler_variants():
    assert len(TASK_NAMES) == 13 and set(SYNTHETIC_TASKS) == set(TASK_NAMES) - {"qa_1", "qa_2"}
    assert [TASKS[t].haystack for t in ("niah_single_1", "niah_single_2", "niah_multikey_2")] == [
        "noise",
        "essay",
        "needle",
    ]
    assert TASKS["niah_single_3"].value == "uuids" and TASKS["niah_multikey_3"].key == "uuids"
    s = RulerShape()
    assert (s.digits, s.uuid_hex, s.needles, s.hops, s.common, s.coded_letters) == (7, 32, 4, 4, 10, 6)
    rng = np.random.default_rng(0)
    vt = generate("vt", s, rng)
    assert len(vt.answers) == 5 and sum("VAR" in n for n in vt.needles) == 5  # 1 chain x 4 hops
    cwe = generate("cwe", s, rng, units=40, length=8192)
    assert len(cwe.answers) == 10 and Counter(re.findall(r"\d+\. (\S+)", cwe.units[0]))[cwe.answers[0]] == 30
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", W.uuid(rng))


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_no_draw_has_two_right_answers_in_10000(task):
    """10,000 draws (every other one in the ranking form, with 9 wrong answers): the reader finds exactly
    the generator's answers, and no wrong answer is a right one; every wrong answer's values are in the
    context (copying cannot tell them apart)."""
    rng = np.random.default_rng(7)
    shape = RulerShape() if TASKS[task].family in ("niah", "vt") else SMALL
    units = {"niah_multikey_2": 12, "niah_multikey_3": 12, "cwe": 20, "fwe": 300}.get(task, 0)
    length = 8192 if task == "cwe" else 4096
    ambiguous = 0
    for i in range(10_000):
        decoys = 9 if i % 2 else 0
        t = generate(task, shape, rng, units, length, decoys)
        context = context_of(t)
        right = solve(task, context, t.question)
        if sorted(right) != sorted(t.answers):
            ambiguous += 1
        for w in t.wrong:
            vals = values_of(w, task)
            assert sorted(vals) != sorted(t.answers) and all(v in context for v in vals)
        assert len(t.wrong) == decoys
    assert ambiguous == 0


def test_prompts_have_their_exact_length_haystack_and_depth():
    b = RulerBuilder(TOK, RulerShape(), ESSAY)
    rng = np.random.default_rng(1)
    for task in SYNTHETIC_TASKS:
        for length in (2048, 3001):
            p = b.build(task, length, rng)
            assert len(p.tokens) + len(p.target) == length + 1
            text = TOK.decode(p.tokens)
            for needle in p.text.needles + [u for u in p.text.units if u.startswith("One of")]:
                assert TOK.decode(TOK.encode(" " + needle)) in text  # each needle whole
            for a in p.text.answers:
                if TASKS[task].family == "niah":
                    assert text.count(b.reference(a)) == 1  # once, in its needle only
            if TASKS[task].family == "niah":
                assert 0 <= p.depth <= 1
            if task == "niah_single_1":
                assert text.count("The grass is green.") > 10
            if task == "niah_single_2":
                assert "The grass is green." not in text and text.count(".") > 50


@pytest.mark.parametrize("shape,length", [(RulerShape(), 2048), (SMALL, 256)], ids=["ruler", "short"])
def test_no_task_text_tokenizes_to_a_special_token(shape, length):
    """Every word and symbol the tasks write is in synthetic:ruler's vocabulary: no prompt, answer or
    wrong answer has a special token (``<|mask|>``, the unknown), in either template; "=" was missing,
    so every variable-tracking line read "VAR S <|mask|> 12" (issue 47)."""
    from extrapos.data.special_tokens import SPECIALS

    b = RulerBuilder(TOK, shape, ESSAY)
    rng = np.random.default_rng(3)
    for task in SYNTHETIC_TASKS:
        for _ in range(5):
            p = b.build(task, length, rng, decoys=3)
            texts = [TOK.decode(p.tokens), *p.text.answers, *p.text.wrong]
            for text in texts:
                specials = [i for i in TOK.encode(text) if i < len(SPECIALS)]
                assert not specials, (task, text[:200], [SPECIALS[i] for i in specials])


def test_a_short_length_is_one_sentence_naming_the_fix():
    b = RulerBuilder(TOK, RulerShape(), ESSAY)
    with pytest.raises(UserError, match="use longer lengths"):
        b.build("niah_multikey_1", 60, np.random.default_rng(0))
    with pytest.raises(UserError, match="must be provided"):
        b.build("qa_1", 600, np.random.default_rng(0))


# ---- the ranking form: copying scores chance ----------------------------------------------------------


def copy_rank(p, rng) -> int:
    """The rank a scorer gives the true answer when it prefers any value that occurs in the prompt (the
    count of the candidate's values found in the prompt's text, ties broken at random)."""
    text = TOK.decode(p.tokens)
    cands = [p.target, *p.wrong]
    scores = []
    for c in cands:
        vals = values_of(TOK.decode(c), p.task)
        scores.append(sum(v in text for v in vals) + 1e-3 * rng.random())
    return 1 + sum(s >= scores[0] for s in scores[1:])


@pytest.mark.parametrize("task", RETRIEVAL)
def test_copying_an_in_context_value_scores_chance_in_the_ranking_form(task):
    b = RulerBuilder(TOK, SMALL, ESSAY)
    rng = np.random.default_rng(3)
    prompts = [b.build(task, 256, rng, decoys=4) for _ in range(300)]
    hits = np.mean([copy_rank(p, rng) == 1 for p in prompts])
    # chance 1/5 over 300 examples: standard deviation 0.023
    assert 0.12 <= hits <= 0.28, hits
    # a scorer that reads the asked key's value(s) from the context ranks the true answer first every time
    for p in prompts:
        right = sorted(solve(task, context_of(p.text), p.text.question))
        assert sorted(values_of(TOK.decode(p.target).replace(" , ", ", "), task)) == right
        assert all(sorted(values_of(TOK.decode(w).replace(" , ", ", "), task)) != right for w in p.wrong)
    assert all(len(w) == len(p.target) for p in prompts for w in p.wrong)
    # RULER's own form holds no wrong answer to copy: a copier would be right every time there
    plain = [b.build(task, 256, rng) for _ in range(20)]
    assert all(not p.wrong for p in plain)


# ---- the per-depth table -------------------------------------------------------------------------------


def test_depth_table_bins_the_asked_needles_depth_per_length():
    cells = [
        {
            "task": "niah_single_1",
            "ev": 1,
            "length": 64,
            "recall": 0.5,
            "depths": [0.05, 0.1, 0.5, 1.0],
            "per_example": {"recall": [[1, 0, 1, 0], [1] * 4]},
        },
        {
            "task": "cwe",
            "ev": 1,
            "length": 64,
            "recall": 1.0,
            "depths": [None],
            "per_example": {"recall": [[1], [1]]},
        },
    ]
    rows = dict(depth_table({"results": cells}, "recall"))
    assert rows["0.0-0.2"] == [(0.5, 2)] and rows["0.4-0.6"] == [(1.0, 1)] and rows["0.8-1.0"] == [(0.0, 1)]
    assert rows["0.2-0.4"][0][1] == 0
    table = format_depths({"results": cells, "metric": "recall"})
    assert "| 0.0-0.2 | 0.50 (2) |" in table and "| 0.2-0.4 | – |" in table
