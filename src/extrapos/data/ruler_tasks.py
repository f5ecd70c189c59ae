"""RULER's 13 tasks as text (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", §3, Table 2 and Appendix B), one generator shared by `extrapos ruler` and the
``synthetic:ruler`` training corpus.

* retrieval (NIAH): ``niah_single_1/2/3`` (one needle: noise haystack with number values, essay haystack with
  numbers, essay with UUIDs), ``niah_multikey_1/2/3`` (4 needles in an essay; a haystack made of needles
  with word keys and number values; the same with UUID keys and values), ``niah_multivalue`` (one key, 4
  values), ``niah_multiquery`` (4 keys asked at once); keys are "adjective-noun" words;
* multi-hop tracing: ``vt`` (one chain of 4 hops, ``VAR X = 12345`` then ``VAR Y = VAR X``..., in noise);
* aggregation: ``cwe`` (the 10 most common words of a numbered list: counts 30 / 3, or 6 / 1 below 4096
  tokens, after one solved example), ``fwe`` (the 3 most frequent coded words of a Zipf(2) text whose
  vocabulary is the length / 50 words, the most frequent of which is '...', the noise);
* question answering: ``qa_1`` (SQuAD), ``qa_2`` (HotpotQA): the gold documents among distractors
  (``extrapos.data.ruler_qa`` reads the published JSON).

``generate`` returns a ``RulerText``: the prompt's pieces (prefix, the needles or the context units, the
question with its answer prefix), the references RULER's metric matches and the answer as a continuation.
Whitespace is single spaces (RULER's ``remove_newline_tab`` option). Every draw is checked to have one right
answer (distinct keys, distinct values, counts that single out the asked words) and redrawn otherwise.

``decoys`` > 0 asks for the candidate-ranking form the small models need: ``decoys`` wrong answers, each
made of values that occur in the prompt (extra needles under other keys, other vt chains' names, the list's
other words, other questions' answers), so a model that copies an in-context value ranks the true answer
first only by chance: the values the candidates differ by occur alike (as often, as early, as late), and
the true answer is any member of the candidates' design (``extrapos.tasks.ruler_copiers`` checks it;
issue 47). ``decoys`` = 0 (RULER's own form) draws as it did before the ranking form was redrawn.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from extrapos.data import ruler_words as W
from extrapos.data.ruler_names import SYNTHETIC_TASKS, TASK_NAMES
from extrapos.errors import UserError


@dataclass(frozen=True)
class TaskSpec:
    """One RULER task: its family, haystack, key and value types and which count is ``needles``."""

    family: str  # niah, vt, cwe, fwe, qa
    haystack: str  # noise, essay, needle, list, documents
    key: str = "words"
    value: str = "numbers"
    many: str = ""  # niah: "keys", "values" or "queries" take RulerShape.needles
    dataset: str = ""


TASKS: dict[str, TaskSpec] = {
    "niah_single_1": TaskSpec("niah", "noise"),
    "niah_single_2": TaskSpec("niah", "essay"),
    "niah_single_3": TaskSpec("niah", "essay", value="uuids"),
    "niah_multikey_1": TaskSpec("niah", "essay", many="keys"),
    "niah_multikey_2": TaskSpec("niah", "needle"),
    "niah_multikey_3": TaskSpec("niah", "needle", key="uuids", value="uuids"),
    "niah_multivalue": TaskSpec("niah", "essay", many="values"),
    "niah_multiquery": TaskSpec("niah", "essay", many="queries"),
    "vt": TaskSpec("vt", "noise"),
    "cwe": TaskSpec("cwe", "list"),
    "fwe": TaskSpec("fwe", "list"),
    "qa_1": TaskSpec("qa", "documents", dataset="squad"),
    "qa_2": TaskSpec("qa", "documents", dataset="hotpotqa"),
}
if tuple(TASKS) != TASK_NAMES:  # the names the CLI lists without importing this module
    raise AssertionError(f"ruler_names.TASK_NAMES {TASK_NAMES} differs from the task table {tuple(TASKS)}")
#: the tasks a model is trained on by ``synthetic:ruler`` (QA needs data that must be provided)
if SYNTHETIC_TASKS != tuple(t for t, s in TASKS.items() if s.family != "qa"):
    raise AssertionError("ruler_names.SYNTHETIC_TASKS differs from the task table's data-free tasks")
#: RULER's needle depths (percent): 40 evenly spaced, drawn without replacement for the essay haystack
DEPTHS = np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)
#: RULER's token budgets for the answer (tokens_to_generate)
GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}
#: RULER's metric per family: string-match recall over all references, or the best over any one (QA)
METRIC = {"niah": "all", "vt": "all", "cwe": "all", "fwe": "all", "qa": "part"}


@dataclass(frozen=True)
class RulerShape:
    """The sizes of the tasks, RULER's defaults unless made smaller for small models: ``digits`` of a
    number value (7), ``uuid_hex`` hex digits of a UUID (32: a real one), ``needles`` for the multi-key,
    multi-value and multi-query needles (4), vt's ``hops`` (4), ``vt_digits`` of its value (5) and
    ``var_letters`` per variable (5), cwe's ``common`` words asked (10), fwe's ``coded_letters`` per word
    (6); ``template``: RULER's prompts ("ruler") or only their answer prefix ("short")."""

    digits: int = 7
    uuid_hex: int = 32
    needles: int = 4
    hops: int = 4
    vt_digits: int = 5
    var_letters: int = 5
    common: int = 10
    coded_letters: int = 6
    template: str = "ruler"

    def check(self) -> RulerShape:
        limits = {
            "digits": (1, 18),
            "uuid_hex": (4, 32),
            "needles": (1, 16),
            "hops": (1, 16),
            "vt_digits": (1, 18),
            "var_letters": (1, 12),
            "common": (1, 50),
            "coded_letters": (1, 12),
        }
        for name, (low, high) in limits.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise UserError(f"RULER {name} must be an integer in [{low}, {high}], got {v!r}.")
        if self.template not in ("ruler", "short"):
            raise UserError(f"the RULER template must be ruler or short, got {self.template!r}.")
        return self


@dataclass
class RulerText:
    """One example as text. ``haystack`` "noise" / "essay": ``needles`` go into a haystack of that kind at
    depths (``asked``: the needle whose depth is reported); "units": the context is ``units`` in order
    (``asked`` indexes the asked needle among them, or None). The prompt is ``prefix``, the context, then
    ``question`` (ending with the answer prefix); ``target`` continues it; ``answers`` are the references
    of ``metric`` ("all" / "part"); ``wrong``: wrong targets made of in-context values (ranking form)."""

    task: str
    prefix: str
    question: str
    haystack: str
    needles: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    asked: int | None = None
    answers: list[str] = field(default_factory=list)
    target: str = ""
    metric: str = "all"
    wrong: list[str] = field(default_factory=list)


SameLength = Callable[[str, str], bool]


def _always(a: str, b: str) -> bool:
    return True


def _template(family: str, shape: RulerShape) -> tuple[str, str, str]:
    return W.TEMPLATES[family][shape.template]


def _joined(items: list[str]) -> str:
    """RULER's list of asked keys: "a", "a, and b", "a, b, and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def _value(kind: str, rng: np.random.Generator, shape: RulerShape) -> str:
    if kind == "numbers":
        return W.number(rng, shape.digits)
    if kind == "uuids":
        return W.uuid(rng, shape.uuid_hex)
    return W.pair_word(rng)


def _distinct(kind: str, rng: np.random.Generator, shape: RulerShape, n: int, taken: set[str]) -> list[str]:
    """``n`` values of ``kind`` none of which is in ``taken`` (which grows by them)."""
    out: list[str] = []
    for _ in range(100 * n + 100):
        if len(out) == n:
            return out
        v = _value(kind, rng, shape)
        if v not in taken:
            taken.add(v)
            out.append(v)
    raise UserError(
        f"could not draw {n} distinct {kind}; use longer values (--digits / --uuid-hex) or fewer needles."
    )


def _substitutions(answers: list[str], pool: list[str], same: SameLength) -> list[tuple[int, str]]:
    """Every (slot, value) by which one answer can be replaced by a value of ``pool`` of its token length."""
    return [(p, v) for p in range(len(answers)) for v in pool if v not in answers and same(answers[p], v)]


def _wrong_answers(
    answers: list[str], pool: list[str], n: int, rng: np.random.Generator, same: SameLength
) -> list[list[str]]:
    """Up to ``n`` wrong answers, each the answers with one value replaced by a value of ``pool`` (in the
    prompt, of the replaced one's token length), then relabelled so that the true answer is a uniformly
    random member of the candidates' design (issue 47). Without the relabelling the true answer is the
    design's centre, the one candidate that shares a value with every other: a scorer that weighs each value
    by a prompt statistic (where it occurs last, first, how often) ranks the centre first less often than
    1 / candidates (multi-value 0.21, multi-query 0.20 for 0.25 at 3,000 draws). A value of the pool and
    the answer it swaps with occur alike in the prompt, so the swap keeps the prompt's law and the true
    answer is any member of the design with the same probability."""
    options = _substitutions(answers, pool, same)
    picked = [options[int(i)] for i in rng.permutation(len(options))[:n]]
    star = [answers[:p] + [v] + answers[p + 1 :] for p, v in picked]
    centre = int(rng.integers(len(star) + 1))  # 0: the true answer stays the centre
    if centre == 0:
        return star
    p, v = picked[centre - 1]
    swap = {answers[p]: v, v: answers[p]}
    return [c for c in ([swap.get(x, x) for x in c] for c in [answers, *star]) if c != answers]


def _spread(listed: list[str], candidates: list[str], rng: np.random.Generator) -> list[str]:
    """The ranking form's order of a counted list (cwe, fwe): each candidate word once, in a random order,
    first; once, in another random order, last; every other copy shuffled between. Where a word first and
    last occurs is then the same for a frequent word and a rare one, so only counting (the task's skill)
    tells the answer: in RULER's shuffled list a common word's last occurrence is the latest of its 6
    (a recency scorer picked cwe's answer 0.65 of the time, fwe's 0.57, for 0.25)."""
    rest = Counter(listed)
    rest.subtract(candidates * 2)
    if min(rest[w] for w in candidates) < 0:
        raise AssertionError("a ranked list word occurs fewer than twice")
    middle = [w for w, c in rest.items() for _ in range(c)]
    head = [candidates[int(i)] for i in rng.permutation(len(candidates))]
    tail = [candidates[int(i)] for i in rng.permutation(len(candidates))]
    return head + [middle[int(i)] for i in rng.permutation(len(middle))] + tail


# ---- the families ---------------------------------------------------------------------------------------


def _niah(
    task: str,
    spec: TaskSpec,
    shape: RulerShape,
    rng: np.random.Generator,
    units: int,
    decoys: int,
    same: SameLength,
) -> RulerText:
    k = shape.needles if spec.many in ("keys", "queries") else 1
    v = shape.needles if spec.many == "values" else 1
    q = shape.needles if spec.many == "queries" else 1
    kind = spec.value
    taken_keys: set[str] = set()
    taken_values: set[str] = set()
    keys = _distinct(spec.key, rng, shape, k, taken_keys)
    values = [_distinct(kind, rng, shape, v, taken_values) for _ in keys]
    asked = sorted(int(i) for i in rng.permutation(k)[:q])
    answers = [x for i in asked for x in values[i]]
    typ = kind
    needle = [(key, x) for key, vs in zip(keys, values) for x in vs]
    others = [x for i in range(k) if i not in asked for x in values[i]]
    hay_needles: list[tuple[str, str]] = []
    if spec.haystack == "needle":  # the haystack is needles with other keys and values (RULER's multikey_2/3)
        hay_keys = _distinct(spec.key, rng, shape, units, taken_keys)
        hay_needles = list(zip(hay_keys, _distinct(kind, rng, shape, units, taken_values)))
        others += [x for _, x in hay_needles]
    extra: list[tuple[str, str]] = []
    if decoys:  # the ranking form: more needles under other keys until every wrong answer is in the prompt
        while len(_substitutions(answers, others, same)) < decoys and len(extra) < decoys + 8:
            # a value of the token length of the answer it replaces (drawn again until it is)
            like = answers[len(extra) % len(answers)]
            for _ in range(200):
                x = _distinct(kind, rng, shape, 1, taken_values)[0]
                if same(like, x):
                    break
            else:
                break  # too few: the builder draws the example again
            extra.append((_distinct(spec.key, rng, shape, 1, taken_keys)[0], x))
            others.append(x)
    text = [W.NEEDLE.format(type=typ, key=a, value=b) for a, b in needle + extra]
    order = [int(i) for i in rng.permutation(len(text))]
    first_asked = order.index(needle.index((keys[asked[0]], values[asked[0]][0])))
    pre, ques, ans = _template("niah", shape)
    fill = {"type": typ, "query": _joined([keys[i] for i in asked])}
    pre, ques, ans = (p.format(**fill) for p in (pre, ques, ans))
    if v * q == 1:
        pre, ques, ans = singular(pre), singular(ques), singular(ans)
    question = " ".join(x for x in (ques, ans) if x)
    out = RulerText(task, pre, question, spec.haystack, answers=answers, target=", ".join(answers))
    placed = [text[i] for i in order]
    if spec.haystack == "needle":
        hay = [W.NEEDLE.format(type=typ, key=a, value=b) for a, b in hay_needles]
        slots = sorted(int(i) for i in rng.choice(len(hay) + len(placed), len(placed), replace=False))
        chosen, it, rest = set(slots), iter(placed), iter(hay)
        out.units = [next(it) if i in chosen else next(rest) for i in range(len(hay) + len(placed))]
        out.asked = slots[first_asked]
    else:
        out.needles, out.asked = placed, first_asked
    if decoys:
        out.wrong = [", ".join(w) for w in _wrong_answers(answers, others, decoys, rng, same)]
    return out


def singular(text: str) -> str:
    return W.singular(text)


def _chain(names: list[str], value: str) -> list[str]:
    return [f"VAR {names[0]} = {value}"] + [
        f"VAR {names[i]} = VAR {names[i - 1]}" for i in range(1, len(names))
    ]


def _vt(
    task: str,
    spec: TaskSpec,
    shape: RulerShape,
    rng: np.random.Generator,
    units: int,
    decoys: int,
    same: SameLength,
    icl: bool = True,
) -> RulerText:
    n = shape.hops + 1
    taken: set[str] = set()
    names = _distinct_vars(rng, shape, n, taken)
    value = W.number(rng, shape.vt_digits)
    steps = _chain(names, value)
    wrong: list[str] = []
    if decoys:
        # the ranking form: a chain per candidate, each of its own value (RULER's num_chains), interleaved
        # at random, each in its own order; the wrong answers are the true chain with the name at one slot
        # (the same for all) replaced by the name at that slot of another chain. The names a candidate
        # differs by then occur alike (as often, as early, as late), so no copier tells them apart; with one
        # other chain whose names filled any slot, the true chain's last name (written once) was set
        # against names written twice (issue 47)
        slot = int(rng.integers(n))
        values, chains = {value}, [steps]
        for _ in range(decoys):
            other_value = _fresh(lambda: W.number(rng, shape.vt_digits), values, "vt values", "--vt-digits")
            other = _distinct_vars(rng, shape, n, taken)
            for _ in range(200):  # a name of the replaced one's token length
                if same(names[slot], other[slot]):
                    break
                other[slot] = _distinct_vars(rng, shape, 1, taken)[0]
            wrong.append(" ".join(names[:slot] + [other[slot]] + names[slot + 1 :]))
            chains.append(_chain(other, other_value))
        take = rng.permutation(np.repeat(np.arange(len(chains)), n))
        lines = [iter(c) for c in chains]
        steps = [next(lines[int(t)]) for t in take]
    pre, ques, ans = _template("vt", shape)
    fill = {"query": value, "count": n}
    question = " ".join(x for x in (ques.format(**fill), ans.format(**fill)) if x)
    if pre and icl:  # RULER's one solved example first: a shorter chain in a little noise
        example = _vt(task, spec, shape, rng, 0, 0, same, icl=False)
        while example.question == question or set(example.answers) & taken:  # another value and names
            example = _vt(task, spec, shape, rng, 0, 0, same, icl=False)
        noise = " ".join([W.NOISE] * 2)
        solved = [example.prefix, noise, *example.needles, noise, example.question, example.target]
        pre = " ".join([*solved, pre])
    out = RulerText(task, pre, question, "noise", needles=[s + "." for s in steps], asked=0, answers=names)
    out.target, out.wrong = " ".join(names), wrong
    return out


def _distinct_vars(rng: np.random.Generator, shape: RulerShape, n: int, taken: set[str]) -> list[str]:
    return [
        _fresh(lambda: W.variable(rng, shape.var_letters), taken, "vt variables", "--var-letters")
        for _ in range(n)
    ]


def _fresh(draw: Callable[[], str], taken: set[str], what: str, flag: str) -> str:
    """A draw not in ``taken`` (which grows by it)."""
    for _ in range(10_000):
        x = draw()
        if x not in taken:
            taken.add(x)
            return x
    raise UserError(
        f"could not draw {len(taken) + 1} distinct {what}; use a larger {flag} or fewer --candidates."
    )


def cwe_counts(length: int) -> tuple[int, int]:
    """How often each common and each other word is listed (RULER: 30 and 3, or 6 and 1 below 4096
    tokens)."""
    return (6, 1) if length < 4096 else (30, 3)


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _cwe_list(
    rng: np.random.Generator, distinct: int, common: int, counts: tuple[int, int]
) -> tuple[list[str], list[str]]:
    pool = W.word_pool(max(distinct, len(W.LIST_WORDS)))
    chosen = [pool[int(i)] for i in rng.permutation(len(pool))[:distinct]]
    listed = chosen[:common] * counts[0] + chosen[common:] * counts[1]
    listed = [listed[int(i)] for i in rng.permutation(len(listed))]
    return listed, chosen[:common]


def _cwe(
    task: str,
    spec: TaskSpec,
    shape: RulerShape,
    rng: np.random.Generator,
    units: int,
    decoys: int,
    same: SameLength,
    length: int,
) -> RulerText:
    counts = cwe_counts(length)
    if units <= shape.common:
        raise UserError(f"a cwe list needs more than {shape.common} distinct words; use longer lengths.")
    listed, common = _cwe_list(rng, units, shape.common, counts)
    common = sorted(common, key=listed.index)  # the target lists them as they first appear
    pre, ques, ans = (p.format(count=shape.common) for p in _template("cwe", shape))
    if pre:  # RULER's solved example first (20 words, 3 / 1, or 40 words, 10 / 3 from 4096 tokens)
        few, few_common = _cwe_list(
            rng, *((20, shape.common, (3, 1)) if counts[0] == 6 else (40, shape.common, (10, 3)))
        )
        pre = f"{pre} {_numbered(few)} {ques} {ans} {_numbered(few_common)} {pre}"
    others = sorted(set(listed) - set(common), key=listed.index)
    out = RulerText(task, pre, " ".join(x for x in (ques, ans) if x), "units", units=[_numbered(listed)])
    out.answers, out.target = common, _numbered(common)
    if decoys:  # the candidates' words twice at least (RULER's rare count 1), spread first and last
        wrong = _wrong_answers(common, others, decoys, rng, same)
        words = list(dict.fromkeys(common + [x for w in wrong for x in w]))
        have = Counter(listed)
        listed = _spread(listed + [w for w in words for _ in range(2 - have[w])], words, rng)
        first = {w: i for i, w in reversed(list(enumerate(listed)))}
        out.units, out.answers = [_numbered(listed)], sorted(common, key=first.__getitem__)
        out.target = _numbered(out.answers)
        out.wrong = [_numbered(sorted(w, key=first.__getitem__)) for w in wrong]
    return out


#: RULER's fwe exponent alpha and zeta(alpha) = pi^2 / 6
ALPHA, ZETA = 2.0, math.pi**2 / 6


def fwe_counts(words: int, vocab: int) -> np.ndarray:
    """RULER's fwe counts: the k-th word of the vocabulary appears int(words k^-alpha / zeta(alpha)) times."""
    k = np.arange(1, vocab + 1, dtype=np.float64)
    return (words * k**-ALPHA / ZETA).astype(int)


def fwe_vocab(length: int) -> int:
    """RULER's fwe vocabulary: a word per 50 tokens of the prompt (here at least 5, so 3 words are asked
    and a fourth can be below them)."""
    return max(5, length // 50)


def _fwe(
    task: str,
    spec: TaskSpec,
    shape: RulerShape,
    rng: np.random.Generator,
    units: int,
    decoys: int,
    same: SameLength,
    length: int,
) -> RulerText:
    vocab_n = min(fwe_vocab(length), 26**shape.coded_letters)  # no more words than such words exist
    units = max(units, least_units(task, shape, length))
    counts = fwe_counts(units, vocab_n)
    while counts[3] <= counts[4]:  # the 4th word must stand above the 5th: the next size where it does
        units += 1
        counts = fwe_counts(units, vocab_n)
    vocab: list[str] = ["..."]
    taken = {"..."}
    while len(vocab) < vocab_n:
        w = W.coded_word(rng, shape.coded_letters)
        if w not in taken:
            taken.add(w)
            vocab.append(w)
    listed = [w for w, c in zip(vocab, counts) for _ in range(int(c))]
    listed = [listed[int(i)] for i in rng.permutation(len(listed))]
    answers = vocab[1:4]
    pre, ques, ans = _template("fwe", shape)
    out = RulerText(task, pre, " ".join(x for x in (ques, ans) if x), "units", units=[" ".join(listed)])
    out.answers, out.target = answers, " ".join(answers)
    if decoys:
        # the wrong answers' words listed twice at least (the answers still more often than any other
        # coded word) and spread first and last with the answers (``_spread``); the noise '...' among them
        # unless the question writes it (the ruler template's '....', closest to the answer)
        others = [w for w, c in zip(vocab, counts) if c and w not in answers]
        others = [w for w in others if not (w == "..." and w in out.question)]
        wrong = _wrong_answers(answers, others, decoys, rng, same)
        words = list(dict.fromkeys(answers + [x for w in wrong for x in w]))
        have = Counter(listed)
        need = {w: max(2, have[w]) for w in words}
        top = max(need.get(w, have[w]) for w in vocab[4:])  # the most any other coded word is listed
        need.update({a: max(need[a], top + 1) for a in answers})
        extra = [w for w in words for _ in range(need[w] - have[w])]
        out.units = [" ".join(_spread(listed + extra, words, rng))]
        out.wrong = [" ".join(w) for w in wrong]
    return out


def _qa(
    task: str,
    spec: TaskSpec,
    shape: RulerShape,
    rng: np.random.Generator,
    units: int,
    decoys: int,
    same: SameLength,
    qa: Any,
) -> RulerText:
    if qa is None:
        raise UserError(
            f"{task} needs the {'SQuAD' if spec.dataset == 'squad' else 'HotpotQA'} data, which must be "
            f"provided: pass --{spec.dataset} FILE in its published JSON format."
        )
    record = qa.records[int(rng.integers(len(qa.records)))]
    docs = qa.documents(record, units, rng)
    pre, ques, ans = (p.format(query=record.query) for p in _template("qa", shape))
    text = [W.DOCUMENT.format(i=i + 1, text=qa.docs[d]) for i, d in enumerate(docs)]
    out = RulerText(task, pre, " ".join(x for x in (ques, ans) if x), "units", units=text)
    out.answers, out.target, out.metric = list(record.answers), record.answers[0], "part"
    if decoys:
        present = set(docs)
        pool = [a for r in qa.records if r is not record and set(r.context) & present for a in r.answers[:1]]
        pool = [a for a in dict.fromkeys(pool) if a.lower() not in {x.lower() for x in record.answers}]
        # as many as the prompt's documents answer: the builder redraws when too few
        out.wrong = [pool[int(i)] for i in rng.permutation(len(pool))][:decoys]
    return out


def generate(
    task: str,
    shape: RulerShape,
    rng: np.random.Generator,
    units: int = 0,
    length: int = 4096,
    decoys: int = 0,
    same_length: SameLength = _always,
    qa: Any = None,
) -> RulerText:
    """One example of ``task``: ``units`` sizes a context made of units (the needle haystack's needles,
    cwe's distinct words, fwe's words, qa's documents); ``length`` is the prompt's token length (cwe's
    counts and fwe's vocabulary follow it, as in RULER); ``decoys`` wrong answers for the ranking form,
    each of the replaced value's token length by ``same_length``; ``qa``: the loaded QA data."""
    spec = TASKS.get(task)
    if spec is None:
        raise UserError(f"unknown RULER task {task!r}; choose from {', '.join(TASK_NAMES)}.")
    if spec.family == "niah":
        return _niah(task, spec, shape, rng, units, decoys, same_length)
    if spec.family == "vt":
        return _vt(task, spec, shape, rng, units, decoys, same_length)
    if spec.family == "cwe":
        return _cwe(task, spec, shape, rng, units, decoys, same_length, length)
    if spec.family == "fwe":
        return _fwe(task, spec, shape, rng, units, decoys, same_length, length)
    return _qa(task, spec, shape, rng, units, decoys, same_length, qa)


@lru_cache(maxsize=256)
def least_units(task: str, shape: RulerShape, length: int) -> int:
    """The fewest context units an example of ``task`` needs (0: its context is a haystack of tokens)."""
    family = TASKS[task].family
    if family == "cwe":
        return shape.common + 1
    if family == "fwe":
        n = 1
        while True:
            c = fwe_counts(n, fwe_vocab(length))
            if c[3] > c[4]:
                return n
            n += 1 if n < 64 else n // 8
    if family == "qa":
        return 1
    return 0


def answer_values(task: str, answer: str) -> list[str]:
    """The values a target or wrong answer of ``task`` is made of, as its generator joins them: NIAH's
    ", ", vt's and fwe's " ", cwe's numbered list; a QA answer is one value."""
    family = TASKS[task].family
    if family == "niah":
        return answer.split(", ")
    if family in ("vt", "fwe"):
        return answer.split(" ")
    if family == "cwe":
        return re.findall(r"\d+\. (\S+)", answer)
    return [answer]


def all_text(t: RulerText) -> str:
    """The prompt's words without the haystack: prefix, needles or units, question (for checks)."""
    return " ".join([t.prefix, *t.needles, *t.units, t.question])


__all__ = [
    "DEPTHS",
    "GENERATE",
    "METRIC",
    "RulerShape",
    "RulerText",
    "SYNTHETIC_TASKS",
    "TASKS",
    "TASK_NAMES",
    "TaskSpec",
    "all_text",
    "answer_values",
    "cwe_counts",
    "fwe_counts",
    "generate",
    "least_units",
]
