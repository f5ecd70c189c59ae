"""The words, values and fixed texts of the RULER tasks (Hsieh et al. 2024, "RULER: What's the Real Context
Size of Your Long-Context Language Models?", §3 and Appendix B): the pools keys and listed words are drawn
from, the three value types (numbers, words, UUIDs), the noise haystack and an essay-like haystack made of
the same words, and the prompt templates.

RULER draws its words from the `wonderwords` lists (keys are "adjective-noun" pairs) and its essay haystack
from Paul Graham's essays, neither of which can be downloaded here; the pools below are written out instead,
and the essay-like haystack is either a real text in the run's tokenizer (the State of the Union addresses,
`extrapos.tasks.ruler`) or, for the word-level vocabulary of ``synthetic:ruler``, sentences composed from
these pools (``synthetic_essay``). Every word here is one token of that vocabulary.
"""

from __future__ import annotations

import string

import numpy as np

ADJECTIVES = (
    "ancient bitter brave bright calm careful cheerful clever cold crooked curious damp dark eager early "
    "empty fancy fierce gentle giant glossy golden hollow honest humble icy jolly kind lazy little lively "
    "loud lucky mighty modest narrow noisy odd patient plain polite proud quick quiet rapid rare rough round "
    "rusty salty "
    "shiny silent simple sleepy slow smooth soft sour steep sticky sturdy sunny swift tall tender tidy tiny "
    "vivid warm wild wise young"
).split()
NOUNS = (
    "anchor apple badge basket beacon blanket bottle bridge bucket button cabin camera candle canyon carpet "
    "castle cellar chair cherry circus cloud compass cotton crayon desert dolphin drum eagle engine falcon "
    "feather fence forest fountain garden glacier guitar hammer harbor helmet island jacket kettle ladder "
    "lantern lemon magnet marble meadow mirror monkey needle orchid oven paddle parrot pepper pillow planet "
    "pocket puzzle rabbit ribbon river rocket saddle shovel silver spider statue teapot thunder tiger tunnel "
    "violin wagon whistle window"
).split()
VERBS = (
    "builds carries cleans finds follows guards holds lifts moves opens paints pulls pushes reaches "
    "shakes sells watches"
).split()
#: the words a cwe list is made of (nouns, adjectives and verbs, as RULER's); invented two-syllable words
#: follow when a list needs more distinct words (``word_pool``), as RULER switches to a second word list
LIST_WORDS = tuple(NOUNS + ADJECTIVES + VERBS)
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]

#: RULER's noise haystack: the same five sentences, repeated
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#: the essay-like haystack's sentence forms for the word-level vocabulary (``synthetic_essay``)
_ESSAY_FORMS = (
    "The {a} {n} {v} the {n2}.",
    "A {a} {n} {v} a {a2} {n2} near the {n3}.",
    "Every {n} in the {n2} is {a}.",
    "Then the {a} {n} {v} the {n2} and the {n3}.",
    "My {n} was {a} and {a2} that year.",
    "Nobody knew why the {n} {v} the {a} {n2}.",
)

#: RULER's prompt templates (Appendix B), one per task family: what precedes the context, what follows it
#: (the question) and the answer prefix that ends the prompt. ``short`` keeps only the answer prefix, for
#: the small base models trained on ``synthetic:ruler`` (`extrapos ruler --template short`).
TEMPLATES: dict[str, dict[str, tuple[str, str, str]]] = {
    "niah": {
        "ruler": (
            "Some special magic {type} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {type} afterwards.",
            "What are all the special magic {type} for {query} mentioned in the provided text?",
            "The special magic {type} for {query} mentioned in the provided text are",
        ),
        "short": ("", "", "The special magic {type} for {query} are"),
    },
    "vt": {
        "ruler": (
            "Memorize and track the chain(s) of variable assignment hidden in the following text.",
            "Question: Find all variables that are assigned the value {query} in the text above.",
            "Answer: According to the chain(s) of variable assignment in the text above, {count} variables "
            "are assigned the value {query}, they are:",
        ),
        "short": ("", "", "The variables assigned the value {query} are:"),
    },
    "cwe": {
        "ruler": (
            "Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.",
            "Question: What are the {count} most common words in the above list?",
            "Answer: The top {count} words that appear most often in the list are:",
        ),
        "short": ("", "", "The top {count} words are:"),
    },
    "fwe": {
        "ruler": (
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words.",
            "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
            "most frequently appeared words in the above coded text?",
            "Answer: According to the coded text above, the three most frequently appeared words are:",
        ),
        "short": ("", "", "The three most frequent words are:"),
    },
    "qa": {
        "ruler": (
            "Answer the question based on the given documents. Only give me the answer and do not output "
            "any other words. The following are given documents.",
            "Answer the question based on the given documents. Only give me the answer and do not output "
            "any other words. Question: {query}",
            "Answer:",
        ),
        "short": ("", "Question: {query}", "Answer:"),
    },
}
NEEDLE = "One of the special magic {type} for {key} is: {value}."
#: the numbered documents of qa (RULER's document prompt)
DOCUMENT = "Document {i}: {text}"


def singular(text: str) -> str:
    """RULER's wording when one value is asked (one query, one value): "A special magic number is ..."."""
    for plural, one in (
        ("Some ", "A "),
        ("are all", "is"),
        (" are", " is"),
        ("numbers", "number"),
        ("words", "word"),
        ("uuids", "uuid"),
    ):
        text = text.replace(plural, one)
    return text


def word_pool(n: int) -> list[str]:
    """``n`` distinct list words: the built-in ones, then invented two-syllable words (in a fixed order)."""
    words = list(LIST_WORDS)
    extra = (a + b for a in _SYLLABLES for b in _SYLLABLES)
    while len(words) < n:
        w = next(extra)
        if w not in LIST_WORDS:
            words.append(w)
    return words[:n]


# ---- values: numbers, words, UUIDs ------------------------------------------------------------------------


def number(rng: np.random.Generator, digits: int) -> str:
    """A number of exactly ``digits`` digits (RULER: 7), its first digit non-zero."""
    low = 10 ** (digits - 1) if digits > 1 else 0
    return str(int(rng.integers(low, 10**digits)))


def pair_word(rng: np.random.Generator) -> str:
    """An "adjective-noun" word, as RULER's keys and word values."""
    return f"{ADJECTIVES[int(rng.integers(len(ADJECTIVES)))]}-{NOUNS[int(rng.integers(len(NOUNS)))]}"


def uuid(rng: np.random.Generator, hex_digits: int = 32) -> str:
    """A random UUID (version 4, 36 characters; RULER's uuid values). ``hex_digits`` < 32: that many random
    hex digits in groups of 4 joined by '-', a shorter value of the same kind for small models."""
    if hex_digits >= 32:
        h = "".join("0123456789abcdef"[i] for i in rng.integers(0, 16, 32))
        h = h[:12] + "4" + h[13:16] + "89ab"[int(rng.integers(4))] + h[17:]
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    h = "".join("0123456789abcdef"[i] for i in rng.integers(0, 16, hex_digits))
    return "-".join(h[i : i + 4] for i in range(0, hex_digits, 4))


def variable(rng: np.random.Generator, letters: int) -> str:
    """A variable name of ``letters`` capital letters (RULER's vt: 5)."""
    return "".join(string.ascii_uppercase[i] for i in rng.integers(0, 26, letters))


def coded_word(rng: np.random.Generator, letters: int) -> str:
    """A coded word of ``letters`` lowercase letters (RULER's fwe: 6)."""
    return "".join(string.ascii_lowercase[i] for i in rng.integers(0, 26, letters))


def synthetic_essay(sentences: int = 4000, seed: int = 0) -> str:
    """An essay-like text in the pools' words: varied sentences (RULER's essay haystack is prose, unlike the
    noise haystack's repeated five sentences), the same text every call."""
    rng = np.random.default_rng(seed)

    def pick(pool: list[str]) -> str:
        return pool[int(rng.integers(len(pool)))]

    out = []
    for _ in range(sentences):
        form = _ESSAY_FORMS[int(rng.integers(len(_ESSAY_FORMS)))]
        out.append(
            form.format(
                a=pick(ADJECTIVES),
                a2=pick(ADJECTIVES),
                n=pick(NOUNS),
                n2=pick(NOUNS),
                n3=pick(NOUNS),
                v=pick(VERBS),
            )
        )
    return " ".join(out)


def fixed_words() -> list[str]:
    """Every whole word the templates, the needle, the pools and the fixed texts use: the word-level
    vocabulary of ``synthetic:ruler`` (other strings, as numbers, UUIDs and coded words, are spelled)."""
    texts = [
        NOISE,
        NEEDLE,
        DOCUMENT,
        *_ESSAY_FORMS,
        *(p for t in TEMPLATES.values() for v in t.values() for p in v),
    ]
    texts += [singular(p) for t in TEMPLATES.values() for v in t.values() for p in v]
    words = set(LIST_WORDS) | {"numbers", "words", "uuids", "number", "word", "uuid", "and", "..."}
    for text in texts:
        for w in text.replace("{", " {").replace("}", "} ").split():
            w = w.strip(".,:?'()")
            if w and not w.startswith("{") and w.isalpha():
                words.add(w)
    words.update(w.rstrip("(s)") for w in list(words))
    return sorted(words)
