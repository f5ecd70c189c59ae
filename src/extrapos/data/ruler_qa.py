"""The documents and questions of RULER's QA tasks (Hsieh et al. 2024, §3: ``qa_1`` from SQuAD, Rajpurkar et
al. 2018; ``qa_2`` from HotpotQA, Yang et al. 2018), read from a local file in the dataset's published JSON
format: the data cannot be downloaded here and must be provided (`extrapos ruler --squad FILE --hotpotqa
FILE`).

* SQuAD (v1.1 or v2.0): ``{"data": [{"paragraphs": [{"context": ..., "qas": [{"question": ..., "answers":
  [{"text": ...}], "is_impossible": ...}]}]}]}``; a question's gold document is its paragraph, the other
  paragraphs of its article come next, as in RULER; unanswerable questions are skipped.
* HotpotQA (distractor setting): ``[{"question": ..., "answer": ..., "context": [[title, [sentences]],
  ...]}]``; a question's documents are its context paragraphs ("title sentences").

Every document of the file is a candidate distractor; a prompt holds the question's documents, then others
drawn at random until the length is filled, shuffled (or the whole file, repeated, when the length asks for
more documents than it has).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from extrapos.errors import UserError
from extrapos.files import check_regular_file

DATASETS = {"squad": "SQuAD", "hotpotqa": "HotpotQA"}


@dataclass
class QaRecord:
    """One question: its text, the accepted answers and the indices of its documents (``context``: gold;
    ``more``: the rest of its article, SQuAD only)."""

    query: str
    answers: list[str]
    context: list[int]
    more: list[int] = field(default_factory=list)


@dataclass
class QaData:
    """The questions and documents of one QA file."""

    dataset: str
    records: list[QaRecord]
    docs: list[str]

    def documents(self, record: QaRecord, n: int, rng: np.random.Generator) -> list[int]:
        """``n`` document indices for ``record``'s prompt (at least its own), shuffled."""
        gold, more = list(record.context), list(record.more)
        n = max(n, len(gold))
        if n < len(self.docs):
            if n - len(gold) > len(more):
                rest = [i for i in range(len(self.docs)) if i not in set(gold + more)]
                picked = (
                    gold
                    + more
                    + [rest[int(i)] for i in rng.permutation(len(rest))[: n - len(gold) - len(more)]]
                )
            else:
                picked = gold + [more[int(i)] for i in rng.permutation(len(more))[: n - len(gold)]]
        else:
            picked = (list(range(len(self.docs))) * (n // len(self.docs) + 1))[:n]
        return [picked[int(i)] for i in rng.permutation(len(picked))]


def _clean(text: str) -> str:
    """Single spaces, as the prompts' other text; a value that is not a string (a null question, a numeric
    answer) is a TypeError, never its repr ("None") as text, and a lone surrogate (a JSON escape such as
    \\udcff) a UnicodeEncodeError, never a prompt that cannot be written."""
    if not isinstance(text, str):
        raise TypeError(f"a text field holds {type(text).__name__}")
    text.encode("utf-8")
    return " ".join(text.split())


def _answerable(record: QaRecord) -> bool:
    """A question with text, a non-empty answer (an empty one is found in every output) and a gold
    document; the others are skipped as the unanswerable questions of SQuAD 2.0 are."""
    record.answers = [a for a in record.answers if a]
    return bool(record.query and record.answers and record.context)


def read_squad(data: dict) -> QaData:
    paragraphs = [p for d in data["data"] for p in d["paragraphs"]]
    docs = sorted({_clean(p["context"]) for p in paragraphs})
    index = {d: i for i, d in enumerate(docs)}
    records = []
    for article in data["data"]:
        ids = [index[_clean(p["context"])] for p in article["paragraphs"]]
        for p in article["paragraphs"]:
            mine = index[_clean(p["context"])]
            for qa in p["qas"]:
                answers = [_clean(a["text"]) for a in qa.get("answers", [])]
                if qa.get("is_impossible") or not answers:
                    continue
                records.append(
                    QaRecord(_clean(qa["question"]), answers, [mine], [i for i in ids if i != mine])
                )
    return QaData("squad", [r for r in records if _answerable(r)], docs)


def read_hotpotqa(data: list) -> QaData:
    def doc(title: str, sentences: list[str]) -> str:
        return _clean(f"{_clean(title)} {''.join(sentences)}")  # a title of null is a TypeError too

    docs = sorted({doc(t, s) for d in data for t, s in d["context"]})
    index = {d: i for i, d in enumerate(docs)}
    records = [
        QaRecord(_clean(d["question"]), [_clean(d["answer"])], [index[doc(t, s)] for t, s in d["context"]])
        for d in data
    ]
    return QaData("hotpotqa", [r for r in records if _answerable(r)], docs)


def load_qa(dataset: str, path: str | Path) -> QaData:
    """The QA data of ``dataset`` ("squad" or "hotpotqa") from ``path``; a UserError naming the fix when
    the file is missing or not in the dataset's JSON format."""
    name = DATASETS[dataset]
    path = Path(path).expanduser()
    check_regular_file(path, str(path), f"pass --{dataset} with a file of {name}'s published JSON")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        qa = read_squad(data) if dataset == "squad" else read_hotpotqa(data)
    except UnicodeEncodeError:  # a lone surrogate escaped in the JSON text (not UTF-8 once decoded)
        raise UserError(
            f"{path} holds a string that is not UTF-8 text (an escaped lone surrogate such as \\udcff); "
            f"pass {name}'s own file."
        ) from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise UserError(
            f"{path} is not {name}'s published JSON format; pass the dataset's own file."
        ) from None
    if not qa.records:
        raise UserError(f"{path} holds no answerable {name} question; pass a file with some.")
    return qa
