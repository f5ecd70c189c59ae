"""The tokenizing pipeline of `data prepare`: the fast encoder writes the bytes `tokenizers` would,
shards are written as the corpus is read, progress only on a terminal, hub streams the same way."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
from data_helpers import text_of

from extrapos.data import fast_bpe, load_tokenizer, open_split, prepare_data
from extrapos.data import prepare as prepare_module
from extrapos.data.corpora import Corpus, open_corpus
from extrapos.data.shards import SPLITS, SplitWriter

SMALL = {"split_fractions": (0.5, 0.25, 0.25), "progress": False}
VARIED_DOCS = [
    "Café naïve — “quotes” 東京都 한국어 العربية 🙂👍🏽 ١٢٣ ²³\n\n\tindented\r\n",
    "It's <|endoftext|> inside a document, and <|pad|> too; 1234567890 " * 20,
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" * 200,
    "   many    spaces\u00a0and\u3000others   " * 30,
]


def files_of(directory):
    """Every file's bytes; the manifest without its timing fields."""
    files = {p.name: p.read_bytes() for p in directory.iterdir() if p.name != "manifest.json"}
    manifest = json.loads((directory / "manifest.json").read_text())
    for key in ("seconds", "created"):
        manifest.pop(key)
    return files, manifest


@pytest.fixture
def varied_dir(text_dir):
    for i, text in enumerate(VARIED_DOCS):
        (text_dir / f"varied{i}.txt").write_text(text, encoding="utf-8")
    return text_dir


@pytest.mark.parametrize("rule", ["document", "within"])
def test_the_tiktoken_mirror_writes_the_bytes_tokenizers_writes(varied_dir, tmp_path, monkeypatch, rule):
    fast = prepare_data(str(varied_dir), "bpe:300", tmp_path / "fast", split_rule=rule, **SMALL)
    assert load_tokenizer(fast).encoder == "tiktoken"
    with monkeypatch.context() as patch:
        patch.setattr(fast_bpe, "tiktoken_mirror", lambda backend: (None, "held to it"))
        slow = prepare_data(str(varied_dir), "bpe:300", tmp_path / "slow", split_rule=rule, **SMALL)
        assert load_tokenizer(slow).encoder == "tokenizers (held to it)"
    assert files_of(fast) == files_of(slow)
    tok = load_tokenizer(fast)  # the end-of-text written in a document was matched, as tokenizers does
    splits = [open_split(fast, s) for s in SPLITS]
    assert any(tok.eot_id in split.doc(i) for split in splits for i in range(split.num_docs))


def test_shards_are_written_while_the_corpus_is_read(text_dir, tmp_path, monkeypatch):
    """At most two batches are read ahead of the documents written: memory does not grow with the corpus."""
    for i in range(30):
        (text_dir / f"more{i:02d}.txt").write_text(text_of(i, 5))
    monkeypatch.setattr(prepare_module, "ENCODE_BATCH_DOCS", 3)
    read, ahead = [0], []
    real_open = prepare_module.open_corpus

    def counting_open(*args, **kwargs):
        corpus = real_open(*args, **kwargs)

        def iterate(outer):
            read[0] = 0  # each pass: training bpe:300, then tokenizing
            for doc in corpus:
                read[0] += 1
                yield doc

        return Corpus(corpus.spec, iterate, corpus.fingerprint, corpus.size_hint)

    real_add = SplitWriter.add
    written = [0]

    def add(self, ids, num_bytes):
        ahead.append(read[0] - written[0])
        written[0] += 1
        return real_add(self, ids, num_bytes)

    monkeypatch.setattr(prepare_module, "open_corpus", counting_open)
    monkeypatch.setattr(SplitWriter, "add", add)
    prepare_data(str(text_dir), "bpe:300", tmp_path / "out", **SMALL)
    total = len(list(open_corpus(str(text_dir))))
    assert written[0] == total == 36
    assert max(ahead) <= 2 * 3 and ahead[0] < total  # writing starts long before the corpus ends
    assert max(ahead) > 1  # the next batch is read while one is encoded


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_tokens_per_second_only_on_a_terminal(text_dir, tmp_path, monkeypatch, console):
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    prepare_data(str(text_dir), "bpe:300", tmp_path / "a", split_fractions=(0.5, 0.25, 0.25), progress=True)
    assert "tokenizing" not in piped.getvalue() and "tokens/s" not in piped.getvalue()
    assert piped.getvalue().startswith("Prepared data in")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    prepare_data(str(text_dir), "bpe:300", tmp_path / "b", split_fractions=(0.5, 0.25, 0.25), progress=True)
    assert (
        "M tokens/s with tiktoken" in terminal.getvalue() and "tokenized 6 documents" in terminal.getvalue()
    )
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    prepare_data(str(text_dir), "bpe:300", tmp_path / "c", **SMALL)
    assert quiet.getvalue() == ""


def test_a_hub_stream_goes_through_the_same_pipeline(tmp_path, monkeypatch):
    """hf:OWNER/NAME through the real datasets.load_dataset(..., streaming=True), on a local jsonl."""
    datasets = pytest.importorskip("datasets")
    records = [
        {"id": f"urn:{i}", "text": text}
        for i, text in enumerate([text_of(i) for i in range(8)] + VARIED_DOCS)
    ]
    local = tmp_path / "shard.jsonl"
    local.write_text("".join(json.dumps(r) + "\n" for r in records))
    real = datasets.load_dataset
    calls = []

    def load_dataset(path, name=None, *, split, streaming, data_files=None):
        calls.append((path, name, split, streaming))
        return real("json", data_files=str(local), split=split, streaming=streaming)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    out = prepare_data("hf:someone/webtext:sample", "bpe:300", tmp_path / "out", **SMALL)
    assert calls[-1] == ("someone/webtext", "sample", "train", True)
    tok = load_tokenizer(out)
    assert tok.encoder == "tiktoken"
    manifest = open_split(out, "train").manifest
    assert manifest["documents_read"] == len(records)
    prepared = sorted(
        tuple(open_split(out, s).doc(i).tolist()) for s in SPLITS for i in range(len(open_split(out, s)))
    )
    expected = sorted(tuple(tok.backend.encode(r["text"], add_special_tokens=False).ids) for r in records)
    assert prepared == expected


def test_split_writer_takes_lists_and_arrays_alike(tmp_path):
    for name, ids in (("a", [1, 2, 65535]), ("b", np.array([1, 2, 65535], dtype=np.uint32))):
        (tmp_path / name).mkdir()
        writer = SplitWriter(tmp_path / name, "train", "uint16")
        writer.add(ids, 7)
        writer.add([], 0)
        assert writer.close()["num_tokens"] == 3
    assert (tmp_path / "a" / "train.bin").read_bytes() == (tmp_path / "b" / "train.bin").read_bytes()
    assert np.load(tmp_path / "a" / "train.offsets.npy").tolist() == [0, 3, 3]
