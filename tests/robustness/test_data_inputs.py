"""Bad input to `extrapos data prepare` and `extrapos data info`, as a careless or hostile user types it.

Each case must end with exit status 2 and one sentence naming the fix, no traceback, and every
file of the cache (which holds an earlier prepared directory) and of the scratch dir unchanged.
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
from harness import assert_user_error

from extrapos.data import prepare_data

PREPARE = ["data", "prepare", "--quiet", "--tokenizer", "bpe:300", "--split-fractions", "0.5,0.25,0.25"]


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return path


def link(path, to):
    path.symlink_to(to)
    return path


def mkdir(path):
    path.mkdir()
    return path


def tiktoken_with_sidecar(scratch, sidecar):
    """A valid tiktoken file (the 256 bytes, no merges) whose ``.json`` sidecar holds ``sidecar``."""
    import base64

    path = write(
        scratch / "tok.tiktoken", b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256))
    )
    write(scratch / "tok.tiktoken.json", sidecar)
    return path


GARBAGE = bytes(range(256)) * 8
WORDLEVEL = json.dumps(
    {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"},
    }
)

# name -> (function of (scratch, corpus) returning the arguments after PREPARE, fragments of the sentence)
PREPARE_CASES = {
    "missing corpus": (lambda s, c: ["--corpus", s / "missing"], ["does not exist"]),
    "empty directory": (lambda s, c: ["--corpus", (s / "void").mkdir() or s / "void"], ["corpus is empty"]),
    "empty .txt file": (lambda s, c: ["--corpus", write(s / "e" / "empty.txt", "")], ["no documents"]),
    "binary .jsonl": (lambda s, c: ["--corpus", write(s / "b.jsonl", GARBAGE)], ["not valid JSON"]),
    "jsonl array lines": (lambda s, c: ["--corpus", write(s / "a.jsonl", "[1, 2]\n")], ["not a JSON object"]),
    "jsonl without the text field": (
        lambda s, c: ["--corpus", write(s / "f.jsonl", '{"body": "x"}\n')],
        ["--text-field"],
    ),
    "jsonl text is a number": (
        lambda s, c: ["--corpus", write(s / "n.jsonl", '{"text": 5}\n')],
        ["--text-field"],
    ),
    "garbage .parquet": (lambda s, c: ["--corpus", write(s / "g.parquet", GARBAGE)], ["parquet"]),
    "garbage .gz": (lambda s, c: ["--corpus", write(s / "g.txt.gz", GARBAGE)], ["Cannot read corpus file"]),
    "truncated .gz": (
        lambda s, c: ["--corpus", write(s / "t.txt.gz", gzip.compress(b"x " * 5000)[:40])],
        ["Cannot read corpus file"],
    ),
    "unknown file type": (
        lambda s, c: ["--corpus", write(s / "data.csv", "a,b\n")],
        [".txt, .jsonl or .parquet"],
    ),
    "glob matching nothing": (lambda s, c: ["--corpus", f"{s}/*.nothing"], ["matches no files"]),
    "unknown corpus name": (lambda s, c: ["--corpus", "wikipedia"], ["Unknown corpus"]),
    "empty corpus spec": (lambda s, c: ["--corpus", " "], ["corpus spec is empty"]),
    "hub spec without a name": (lambda s, c: ["--corpus", "hf:"], ["hf:OWNER/NAME"]),
    "split fractions not numbers": (
        lambda s, c: ["--corpus", c, "--split-fractions", "a,b,c"],
        ["0.9,0.05,0.05"],
    ),
    "split fractions over 1": (
        lambda s, c: ["--corpus", c, "--split-fractions", "0.9,0.2,0.1"],
        ["summing to 1"],
    ),
    "two split fractions": (lambda s, c: ["--corpus", c, "--split-fractions", "1,0"], ["three numbers"]),
    "nan split fractions": (lambda s, c: ["--corpus", c, "--split-fractions", "nan,0,0"], ["three numbers"]),
    "negative split fraction": (lambda s, c: ["--corpus", c, "--split-fractions=-1,1,1"], ["three numbers"]),
    "no train fraction for bpe": (lambda s, c: ["--corpus", c, "--split-fractions", "0,0,1"], ["train"]),
    "unknown tokenizer": (lambda s, c: ["--corpus", c, "--tokenizer", "gpt9"], ["Unknown tokenizer"]),
    "bpe size not a number": (lambda s, c: ["--corpus", c, "--tokenizer", "bpe:abc"], ["bpe:8192"]),
    "bpe size empty": (lambda s, c: ["--corpus", c, "--tokenizer", "bpe:"], ["bpe:8192"]),
    "bpe too small": (lambda s, c: ["--corpus", c, "--tokenizer", "bpe:10"], ["at least 259"]),
    "garbage tokenizer.json": (
        lambda s, c: ["--corpus", c, "--tokenizer", write(s / "tokenizer.json", GARBAGE)],
        ["not a Hugging Face tokenizer.json"],
    ),
    "garbage sentencepiece model": (
        lambda s, c: ["--corpus", c, "--tokenizer", write(s / "x.model", GARBAGE)],
        ["not a valid sentencepiece model"],
    ),
    "garbage tiktoken file": (
        lambda s, c: ["--corpus", c, "--tokenizer", write(s / "x.tiktoken", GARBAGE)],
        ["tiktoken"],
    ),
    "tokenizer dir without tokenizer": (
        lambda s, c: ["--corpus", c, "--tokenizer", c],
        ["holds no tokenizer"],
    ),
    "max docs 0": (lambda s, c: ["--corpus", c, "--max-docs", "0"], ["--max-docs"]),
    "max tokens 0": (lambda s, c: ["--corpus", c, "--max-tokens", "0"], ["--max-tokens"]),
    "negative min doc tokens": (lambda s, c: ["--corpus", c, "--min-doc-tokens", "-1"], ["--min-doc-tokens"]),
    "min doc tokens above every document": (
        lambda s, c: ["--corpus", c, "--min-doc-tokens", "1000000"],
        ["--min-doc-tokens"],
    ),
    "negative split gap": (
        lambda s, c: ["--corpus", c, "--split-rule", "within", "--split-gap", "-1"],
        ["--split-gap"],
    ),
    "corpus is a fifo": (
        lambda s, c: ["--corpus", os.mkfifo(s / "pipe.txt") or s / "pipe.txt"],
        ["regular file"],
    ),
    "corpus links to /dev/zero": (
        lambda s, c: ["--corpus", link(s / "zero.txt", "/dev/zero")],
        ["regular file"],
    ),
    "json nested 100k deep": (
        lambda s, c: ["--corpus", write(s / "deep.jsonl", "[" * 100_000 + "]" * 100_000)],
        ["not valid JSON"],
    ),
    "tokenizer.json without end-of-text": (
        lambda s, c: ["--corpus", c, "--tokenizer", write(s / "wl.json", WORDLEVEL)],
        ["no end-of-text token"],
    ),
    "damaged tiktoken sidecar": (
        lambda s, c: ["--corpus", c, "--tokenizer", tiktoken_with_sidecar(s, "{")],
        ["sidecar"],
    ),
    "out is a link to an empty directory": (
        lambda s, c: ["--corpus", c, "--out", link(s / "to-empty", mkdir(s / "e"))],
        ["symbolic link"],
    ),
    "out is a dangling link": (
        lambda s, c: ["--corpus", c, "--out", link(s / "dangling", s / "nowhere")],
        ["symbolic link"],
    ),
    "out is a file": (lambda s, c: ["--corpus", c, "--out", write(s / "file", "keep me")], ["is a file"]),
    "out is a foreign directory": (
        lambda s, c: ["--corpus", c, "--out", write(s / "mine" / "notes.txt", "x").parent],
        ["not prepared data"],
    ),
}


@pytest.fixture
def existing(cache, corpus):
    """A prepared directory in the cache that no mistake may touch."""
    return prepare_data(str(corpus), "bpe:300", cache / "data" / "existing", progress=False)


@pytest.mark.parametrize("name", PREPARE_CASES)
def test_bad_prepare_input(name, scratch, cache, corpus, existing):
    make_args, fragments = PREPARE_CASES[name]
    args = [str(a) for a in make_args(scratch, corpus)]
    assert_user_error([*PREPARE, *args], cache=cache, watch=[scratch], fragments=fragments)
    assert not [p for p in scratch.rglob("*.tmp-*")], "a staging directory was left behind"


def test_out_holding_other_prepared_data(scratch, cache, corpus, existing):
    assert_user_error(
        [*PREPARE, "--corpus", corpus, "--max-docs", "3", "--out", existing],
        cache=cache,
        watch=[scratch],
        fragments=["already holds data prepared from other inputs"],
    )


def test_unreadable_corpus_file(scratch, cache, corpus, existing):
    (corpus / "doc3.txt").chmod(0)
    assert_user_error(
        [*PREPARE, "--corpus", corpus],
        cache=cache,
        watch=[scratch],
        unprivileged=True,
        fragments=["doc3.txt"],
    )


def test_unreadable_tokenizer_file(scratch, cache, corpus, existing):
    model = write(scratch / "locked.model", GARBAGE)
    model.chmod(0)
    assert_user_error(
        [*PREPARE, "--corpus", corpus, "--tokenizer", model],
        cache=cache,
        watch=[scratch],
        unprivileged=True,
        fragments=["Cannot read the tokenizer", "permissions"],
    )


def test_unreadable_corpus_directory(scratch, cache, corpus, existing):
    (corpus / "sub").mkdir()
    write(corpus / "sub" / "hidden.txt", "text")
    (corpus / "sub").chmod(0)
    assert_user_error(
        [*PREPARE, "--corpus", corpus], cache=cache, watch=[scratch], unprivileged=True, fragments=["sub"]
    )


def test_read_only_cache(scratch, cache, corpus, existing):
    cache.chmod(0o555)
    (cache / "data").chmod(0o555)
    sentence = assert_user_error(
        [*PREPARE, "--corpus", corpus, "--max-docs", "5"],
        cache=cache,
        watch=[scratch],
        unprivileged=True,
        fragments=["EXTRAPOS_CACHE"],
    )
    assert "Cannot write" in sentence


def test_read_only_out_parent(scratch, cache, corpus, existing):
    locked = scratch / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    assert_user_error(
        [*PREPARE, "--corpus", corpus, "--out", locked / "out"],
        cache=cache,
        watch=[scratch],
        unprivileged=True,
        fragments=["Cannot write", "--out"],
    )


# --- data info -----------------------------------------------------------------------------------


def damage(directory, name, data):
    path = directory / name
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)


INFO_CASES = {
    "missing directory": (None, ["No prepared data"]),
    "a file, not a directory": ("file", ["No prepared data"]),
    "not prepared data": ("manifest.json", ["not a prepared data directory"]),
    "garbage manifest": (("manifest.json", GARBAGE), ["damaged"]),
    "manifest of another format": (("manifest.json", json.dumps({"format": "other/9"})), ["format"]),
    "manifest without splits": (("manifest.json", json.dumps({"format": "extrapos-data/1"})), ["prepare"]),
    "manifest is a list": (("manifest.json", "[1, 2]"), ["damaged"]),
    "manifest with a float dtype": ("float dtype", ["lacks its splits, dtype or tokenizer"]),
    "missing offsets": (("val.offsets.npy", None), ["prepare the data again"]),
    "truncated offsets": (("train.offsets.npy", b"\x93NUMPY"), ["prepare the data again"]),
    "offsets of garbage": (("test.offsets.npy", GARBAGE), ["prepare the data again"]),
}


@pytest.mark.parametrize("name", INFO_CASES)
def test_bad_info_input(name, scratch, cache, corpus, existing):
    change, fragments = INFO_CASES[name]
    target = scratch / "copy"
    if change is None:
        target = scratch / "missing"
    elif change == "file":
        target = write(scratch / "file", "x")
    elif change == "float dtype":
        import shutil

        shutil.copytree(existing, target)
        manifest = json.loads((target / "manifest.json").read_text())
        damage(target, "manifest.json", json.dumps({**manifest, "dtype": "float32"}))
    elif change == "manifest.json":
        target.mkdir()
    else:
        import shutil

        shutil.copytree(existing, target)
        filename, data = change
        if data is None:
            (target / filename).unlink()
        else:
            damage(target, filename, data)
    assert_user_error(["data", "info", target], cache=cache, watch=[scratch], fragments=fragments)


def test_info_reads_a_good_directory(cache, existing):
    """The control: the same command on an intact directory succeeds (so the cases above test damage)."""
    from harness import run

    result = run(["data", "info", existing], cache=cache)
    assert result.returncode == 0 and "document length" in result.stdout, result.stderr
    assert np.load(existing / "train.offsets.npy")[-1] > 0
