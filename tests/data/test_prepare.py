"""prepare_data: shards + manifest, filters, splits, cache, atomic and idempotent writes."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from data_helpers import text_of, write_tiktoken_file

from extrapos.data import iter_documents, load_tokenizer, open_split, prepare_data
from extrapos.data.prepare import parse_split_fractions, split_of
from extrapos.data.shards import SplitWriter, read_manifest
from extrapos.errors import UserError

SMALL = {"split_fractions": (0.5, 0.25, 0.25), "progress": False}


def snapshot(directory):
    """Every file's bytes: to prove a directory was not touched."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def leftovers(parent):
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name]


def test_prepared_directory_layout_and_manifest(sotu_data):
    names = {p.name for p in sotu_data.iterdir()}
    assert {
        "manifest.json",
        "tokenizer.json",
        "train.bin",
        "train.offsets.npy",
        "val.bin",
        "test.bin",
    } <= names
    manifest = json.loads((sotu_data / "manifest.json").read_text())
    assert manifest["corpus"] == "sotu" and manifest["dtype"] == "uint16" and manifest["documents_read"] == 8
    assert manifest["tokenizer"]["hash"] == load_tokenizer(sotu_data).hash
    assert manifest["tokenizer"]["vocab_size"] == 400 and manifest["replaced_bytes"] == 0
    assert sum(s["num_docs"] for s in manifest["splits"].values()) == 8
    for name, info in manifest["splits"].items():
        assert (sotu_data / f"{name}.bin").stat().st_size == 2 * info["num_tokens"]
        if info["num_docs"]:
            assert info["bytes_per_token"] == pytest.approx(info["num_bytes"] / info["num_tokens"])
            assert {"p0", "p50", "p100", "mean"} <= set(info["doc_tokens"])


def test_documents_roundtrip_and_land_in_their_hashed_split(sotu_data):
    tok = load_tokenizer(sotu_data)
    texts = dict(iter_documents("sotu"))
    by_text = {text: doc_id for doc_id, text in list(texts.items())[:8]}
    moved = read_manifest(sotu_data)["split_rule"]["moved"]  # rescued into an empty split
    for name in ("train", "val", "test"):
        split = open_split(sotu_data, name)
        assert split.num_bytes == sum(len(tok.decode(split.doc(i)).encode()) for i in range(split.num_docs))
        for i in range(split.num_docs):
            doc_id = by_text[tok.decode(split.doc(i).tolist())]  # byte-level BPE is lossless
            assert moved.get(doc_id, split_of(doc_id, (0.5, 0.25, 0.25))) == name


def test_open_split_is_memory_mapped(sotu_data):
    split = open_split(sotu_data, "train")
    assert isinstance(split.tokens, np.memmap)
    assert split.doc_lengths.dtype == np.int64 and split.doc_lengths.sum() == split.num_tokens
    doc = split.doc(split.num_docs - 1)
    assert np.shares_memory(doc, split.tokens) and len(doc) == split.doc_lengths[-1]
    assert split.bytes_per_token > 1 and split.manifest["corpus"] == "sotu"
    with pytest.raises(UserError, match="Unknown split 'dev'"):
        open_split(sotu_data, "dev")
    with pytest.raises(UserError, match="No prepared data"):
        open_split(sotu_data / "nope", "train")


def test_same_inputs_reuse_the_directory(text_dir, tmp_path, capsys, console):
    out = tmp_path / "out"
    assert prepare_data(str(text_dir), "bpe:300", out, **SMALL) == out
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert prepare_data(str(text_dir), "bpe:300", out, split_fractions=(0.5, 0.25, 0.25)) == out
    assert "Reusing data in" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_cache_is_keyed_by_corpus_tokenizer_and_filters(text_dir, isolated_cache):
    first = prepare_data(str(text_dir), "bpe:300", **SMALL)
    assert first.parent == isolated_cache / "data" and first.name.startswith("texts-bpe-300-")
    assert prepare_data(str(text_dir), "bpe:300", **SMALL) == first
    assert prepare_data(str(text_dir), "bpe:300", min_doc_tokens=10, **SMALL) != first
    (text_dir / "doc0.txt").write_text("edited " + text_of(0))  # an edited corpus is a new entry
    assert prepare_data(str(text_dir), "bpe:300", **SMALL) != first


def test_min_doc_tokens_and_max_tokens(tmp_path):
    folder = tmp_path / "lengths"
    folder.mkdir()
    for i, repeat in enumerate([1, 30, 2, 40, 50]):
        (folder / f"d{i}.txt").write_text(text_of(i, repeat))
    tiktoken_file = write_tiktoken_file(tmp_path / "t.tiktoken")
    tok = load_tokenizer(tiktoken_file)
    lengths = [len(tok.encode(text_of(i, r))) for i, r in enumerate([1, 30, 2, 40, 50])]
    threshold = max(lengths[0], lengths[2]) + 1  # drops exactly the two short documents
    out = prepare_data(str(folder), str(tiktoken_file), tmp_path / "a", min_doc_tokens=threshold, **SMALL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["documents_too_short"] == 2
    assert sum(s["num_tokens"] for s in manifest["splits"].values()) == sum(lengths[1:2] + lengths[3:])
    out = prepare_data(str(folder), str(tiktoken_file), tmp_path / "b", max_tokens=lengths[0] + 1, **SMALL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        manifest["stopped_at_max_tokens"] and manifest["documents_read"] == 2
    )  # the crossing doc is kept whole
    assert sum(s["num_tokens"] for s in manifest["splits"].values()) == lengths[0] + lengths[1]


def test_split_is_a_deterministic_hash_of_the_document_id():
    ids = [f"doc-{i}" for i in range(20000)]
    splits = [split_of(i, (0.9, 0.05, 0.05)) for i in ids]
    assert splits == [split_of(i, (0.9, 0.05, 0.05)) for i in ids]
    counts = {name: splits.count(name) / len(ids) for name in ("train", "val", "test")}
    assert counts == pytest.approx({"train": 0.9, "val": 0.05, "test": 0.05}, abs=0.01)
    assert [split_of(i, (0.9, 0.05, 0.05), seed=1) for i in ids] != splits


def test_a_document_keeps_its_split_when_other_documents_change(text_dir, tmp_path):
    tiktoken_file = str(write_tiktoken_file(tmp_path / "t.tiktoken"))

    def docs_by_split(out):
        return {
            name: {
                tuple(open_split(out, name).doc(i).tolist()) for i in range(open_split(out, name).num_docs)
            }
            for name in ("train", "val", "test")
        }

    full = docs_by_split(prepare_data(str(text_dir), tiktoken_file, tmp_path / "full", **SMALL))
    part = docs_by_split(prepare_data(str(text_dir), tiktoken_file, tmp_path / "part", max_docs=3, **SMALL))
    assert all(part[name] <= full[name] for name in full)


def test_undecodable_bytes_and_lone_surrogates_are_counted(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.txt").write_bytes(text_of(1).encode() + b" \xff\xfe broken")
    (folder / "b.jsonl").write_text('{"text": "lone \\ud800 surrogate ' + text_of(2) + '"}\n')
    out = prepare_data(str(folder), "bpe:300", tmp_path / "out", split_fractions=(1, 0, 0), progress=False)
    assert json.loads((out / "manifest.json").read_text())["replaced_bytes"] == 3
    assert open_split(out, "train").num_docs == 2


def test_vocabulary_past_uint16_switches_to_uint32(tmp_path):
    pytest.importorskip("tiktoken")
    # Byte pairs take ranks 0..65535 and single bytes come after, so leftover bytes get ids > 65535.
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)]
    tokens = pairs + [bytes([b]) for b in range(256)]
    path = tmp_path / "big.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(tokens)))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "doc.txt").write_text("abc " * 50 + "odd")
    out = prepare_data(
        str(tmp_path / "c"), str(path), tmp_path / "out", split_fractions=(1, 0, 0), progress=False
    )
    assert json.loads((out / "manifest.json").read_text())["dtype"] == "uint32"
    split = open_split(out, "train")
    assert split.tokens.dtype == np.uint32 and split.doc(0).max() > 65535
    assert load_tokenizer(out).decode(split.doc(0).tolist()) == "abc " * 50 + "odd"


def test_failure_midway_leaves_no_directory(text_dir, tmp_path, monkeypatch):
    def exploding_add(self, ids, num_bytes):
        raise RuntimeError("disk full")

    monkeypatch.setattr(SplitWriter, "add", exploding_add)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_data(str(text_dir), "bpe:300", tmp_path / "out", **SMALL)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_bad_input_never_damages_an_existing_prepared_directory(text_dir, tmp_path):
    out = prepare_data(str(text_dir), "bpe:300", tmp_path / "out", **SMALL)
    before = snapshot(out)
    with pytest.raises(UserError, match="already holds data prepared from other inputs"):
        prepare_data(str(text_dir), "bpe:300", out, max_docs=2, **SMALL)
    with pytest.raises(UserError, match="does not exist"):
        prepare_data(str(tmp_path / "missing"), "bpe:300", out, **SMALL)
    with pytest.raises(UserError, match="Unknown tokenizer"):
        prepare_data(str(text_dir), "nonsense", out, **SMALL)
    with pytest.raises(UserError, match="[Ss]plit fractions"):
        prepare_data(str(text_dir), "bpe:300", out, split_fractions="0.5,0.6,0.1", progress=False)
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_zero_documents_and_empty_corpus_are_user_errors(text_dir, tmp_path):
    with pytest.raises(UserError, match="left after filtering"):
        prepare_data(str(text_dir), "bpe:300", tmp_path / "a", min_doc_tokens=10**9, **SMALL)
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(UserError, match="holds no documents"):
        prepare_data(str(tmp_path / "empty.jsonl"), "bpe:300", tmp_path / "b", **SMALL)
    with pytest.raises(UserError, match="train split"):
        prepare_data(str(text_dir), "bpe:300", tmp_path / "c", split_fractions=(0, 0.5, 0.5), progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and leftovers(tmp_path) == []


def test_output_path_that_is_not_prepared_data_is_refused(text_dir, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty and is not prepared data"):
        prepare_data(str(text_dir), "bpe:300", tmp_path / "mine", **SMALL)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()  # an empty directory is fine to fill
    assert prepare_data(str(text_dir), "bpe:300", tmp_path / "empty", **SMALL) == tmp_path / "empty"


@pytest.mark.parametrize("value", ["0.9,0.1", "a,b,c", "0.5,0.5,0.5", (1.2, -0.1, -0.1)])
def test_bad_split_fractions(value):
    with pytest.raises(UserError, match="[Ss]plit fractions"):
        parse_split_fractions(value)
