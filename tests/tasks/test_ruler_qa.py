"""RULER's QA tasks read SQuAD and HotpotQA from local files in their published JSON format (the data must be
provided): the question's own documents are in every prompt among distractors, the references are the
dataset's answers scored by "part", and a missing or malformed file is one sentence naming the fix."""

import json

import numpy as np
import pytest

from extrapos.data import ruler_words as W
from extrapos.data.ruler_prompts import Essay, RulerBuilder, synthetic_tokenizer
from extrapos.data.ruler_qa import load_qa
from extrapos.data.ruler_tasks import RulerShape
from extrapos.errors import UserError

TOK = synthetic_tokenizer()


def squad_file(path):
    articles = []
    for a in range(3):
        paragraphs = []
        for p in range(2):
            context = f"Paragraph {a}{p} tells that the capital of land {a}{p} is city {a}{p}."
            qas = [
                {
                    "id": f"q{a}{p}",
                    "question": f"What is the capital of land {a}{p}?",
                    "answers": [{"text": f"city {a}{p}", "answer_start": 0}, {"text": f"City {a}{p}."}],
                    "is_impossible": False,
                },
                {"id": f"x{a}{p}", "question": "Unanswerable?", "answers": [], "is_impossible": True},
            ]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Land {a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "v2.0", "data": articles}))
    return path


def hotpot_file(path):
    data = []
    for i in range(4):
        context = [[f"Title {i}{j}", [f"Sentence {i}{j} one. ", f"Fact {i}{j} two."]] for j in range(3)]
        data.append(
            {"_id": str(i), "question": f"Which fact links {i}?", "answer": f"fact {i}1", "context": context}
        )
    path.write_text(json.dumps(data))
    return path


def test_squad_prompts_hold_the_gold_paragraph_and_score_by_part(tmp_path):
    qa = load_qa("squad", squad_file(tmp_path / "squad.json"))
    assert len(qa.records) == 6 and len(qa.docs) == 6  # the unanswerable questions skipped
    assert all(len(r.more) == 1 for r in qa.records)  # the other paragraph of its article
    b = RulerBuilder(
        TOK, RulerShape(template="ruler"), Essay(TOK, W.synthetic_essay(), "builtin"), {"squad": qa}
    )
    rng = np.random.default_rng(0)
    for _ in range(10):
        p = b.build("qa_1", 700, rng)
        assert len(p.tokens) + len(p.target) == 701
        text = TOK.decode(p.tokens)
        gold = qa.docs[
            next(
                r for r in qa.records if r.query == p.text.question.split("Question: ")[1].split(" Answer")[0]
            ).context[0]
        ]
        assert TOK.decode(TOK.encode(" " + gold)) in text and p.text.metric == "part"
        assert "Document 1 :" in text and text.count("Document ") >= 2
        assert p.text.answers[0].lower().startswith("city")
    ranked = b.build("qa_1", 700, rng, decoys=3)  # the ranking form: other questions' answers in the prompt
    assert len(ranked.wrong) == 3


def test_hotpotqa_prompts_hold_every_context_paragraph(tmp_path):
    qa = load_qa("hotpotqa", hotpot_file(tmp_path / "hotpot.json"))
    assert len(qa.records) == 4 and len(qa.docs) == 12 and all(len(r.context) == 3 for r in qa.records)
    b = RulerBuilder(TOK, RulerShape(template="short"), None, {"hotpotqa": qa})
    p = b.build("qa_2", 400, np.random.default_rng(1))
    i = p.text.question.split("links ")[1][0]
    text = TOK.decode(p.tokens)
    for j in range(3):
        assert TOK.decode(TOK.encode(f" Title {i}{j} Sentence {i}{j} one. Fact {i}{j} two.")) in text
    assert p.text.answers == [f"fact {i}1"]


def test_missing_or_malformed_qa_data_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="does not exist; pass --squad with a file of SQuAD's published JSON"):
        load_qa("squad", tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"rows": []}')
    with pytest.raises(UserError, match="is not HotpotQA's published JSON format"):
        load_qa("hotpotqa", tmp_path / "bad.json")
    b = RulerBuilder(TOK, RulerShape(), None)
    with pytest.raises(UserError, match="needs the SQuAD data, which must be provided"):
        b.build("qa_1", 500, np.random.default_rng(0))
