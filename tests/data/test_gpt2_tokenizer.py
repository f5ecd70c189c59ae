"""`gpt2`: GPT-2's BPE by name, from the local cache file or tiktoken's loader, the same either way.

GPT-2's real rank file is third-party data and not needed here: a small tiktoken file stands in
for it (its sha256 replaces the published one), and the download is tiktoken's own ``read_file``
replaced by one that serves that file, so tiktoken's cache handling runs for real.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import pytest
from data_helpers import text_of, write_tiktoken_file

from extrapos.cli import main
from extrapos.data import build_tokenizer, load_tokenizer, open_split, prepare_data
from extrapos.data.named_tokenizers import NAMED_TOKENIZERS, local_path
from extrapos.data.tokenizer import GPT2_PATTERN
from extrapos.errors import UserError

tiktoken_load = pytest.importorskip("tiktoken.load")
SECOND_SENTENCE = re.compile(r"[.!?]\s+[A-Z]")


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A tiktoken rank file playing GPT-2's: ``gpt2`` is made to expect its sha256."""
    (tmp_path / "stand-in").mkdir()
    path = write_tiktoken_file(tmp_path / "stand-in" / "r50k_base.tiktoken")
    data = path.read_bytes()
    entry = dataclasses.replace(NAMED_TOKENIZERS["gpt2"], sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(NAMED_TOKENIZERS, "gpt2", entry)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    return path


@pytest.fixture
def hub(stand_in, monkeypatch):
    """tiktoken's network read, serving the stand-in at gpt2's URL; ``hub.calls`` lists the URLs."""

    def read_file(url):
        hub.calls.append(url)
        if hub.error is not None:
            raise hub.error
        assert url == NAMED_TOKENIZERS["gpt2"].url
        return hub.payload

    hub.calls, hub.error, hub.payload = [], None, stand_in.read_bytes()
    monkeypatch.setattr(tiktoken_load, "read_file", read_file)
    return hub


def test_gpt2_from_the_local_file_needs_no_network(stand_in, hub, isolated_cache):
    local = isolated_cache / "tokenizers" / "gpt2.tiktoken"
    assert local_path(NAMED_TOKENIZERS["gpt2"]) == local
    local.parent.mkdir(parents=True)
    local.write_bytes(stand_in.read_bytes())
    tok = load_tokenizer("gpt2")
    assert hub.calls == []
    assert tok.kind == "tiktoken" and tok.pattern == GPT2_PATTERN
    assert (
        tok.eot_id == 263 and tok.vocab_size == 264
    )  # end-of-text right after the last rank, as GPT-2's 50256
    assert tok.encode("the thing") == [258, 32, 256, 262]
    by_path = load_tokenizer(str(stand_in))
    assert tok.hash == by_path.hash == build_tokenizer(" gpt2 ").hash
    assert load_tokenizer("gpt2").encode(text_of(3)) == by_path.encode(text_of(3))


def test_gpt2_fetched_once_through_tiktoken_then_kept(stand_in, hub, isolated_cache, tmp_path):
    tok = load_tokenizer("gpt2")
    assert hub.calls == [NAMED_TOKENIZERS["gpt2"].url]
    local = isolated_cache / "tokenizers" / "gpt2.tiktoken"
    assert local.read_bytes() == stand_in.read_bytes()  # kept where the next run looks first
    assert len(list((tmp_path / "tiktoken-cache").iterdir())) == 1  # and in tiktoken's own cache
    assert load_tokenizer("gpt2").hash == tok.hash == load_tokenizer(str(stand_in)).hash
    local.unlink()
    assert load_tokenizer("gpt2").hash == tok.hash  # from tiktoken's cache this time
    assert hub.calls == [NAMED_TOKENIZERS["gpt2"].url]


def test_gpt2_unreachable_is_one_sentence_naming_the_local_file(hub, isolated_cache, tmp_path, capsys):
    requests = pytest.importorskip("requests")
    hub.error = requests.ConnectionError(
        "HTTPSConnectionPool(host='openaipublic.blob.core.windows.net', port=443): Max retries exceeded "
        "with url: /encodings/r50k_base.tiktoken (Caused by NameResolutionError(...))"
    )
    local = isolated_cache / "tokenizers" / "gpt2.tiktoken"
    with pytest.raises(UserError) as error:
        load_tokenizer("gpt2")
    message = str(error.value)
    assert str(local) in message and "data.tokenizer" in message and "ConnectionError" in message
    assert not SECOND_SENTENCE.search(message) and "\n" not in message
    assert not local.exists()
    out = tmp_path / "out"
    code = main(["data", "prepare", "--corpus", "sotu", "--tokenizer", "gpt2", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("extrapos: error: ") and str(local) in err[0]
    assert not out.exists()


def test_a_file_that_is_not_gpt2s_is_refused(hub, isolated_cache):
    hub.payload = b"dGhl 0\n"  # a download that is not the published file
    with pytest.raises(UserError, match="sha256 is not the published one"):
        load_tokenizer("gpt2")
    local = isolated_cache / "tokenizers" / "gpt2.tiktoken"
    assert not local.exists()
    local.parent.mkdir(parents=True)
    local.write_bytes(b"dGhl 0\n")
    with pytest.raises(UserError, match="is not GPT-2's rank file.*sha256 differs"):
        load_tokenizer("gpt2")


def test_a_path_named_gpt2_is_still_a_path(stand_in, hub, tmp_path, monkeypatch):
    folder = tmp_path / "work" / "gpt2"
    folder.mkdir(parents=True)
    build_tokenizer("bpe:300", [text_of(i) for i in range(4)]).save(folder)
    monkeypatch.chdir(tmp_path / "work")
    assert load_tokenizer("./gpt2").kind == "hf"
    assert load_tokenizer("gpt2").kind == "tiktoken"


def test_prepare_with_gpt2_is_prepare_with_its_file(stand_in, hub, text_dir, tmp_path):
    named = prepare_data(
        str(text_dir), "gpt2", tmp_path / "named", split_fractions=(0.5, 0.25, 0.25), progress=False
    )
    by_path = prepare_data(
        str(text_dir), str(stand_in), tmp_path / "path", split_fractions=(0.5, 0.25, 0.25), progress=False
    )
    key = [open_split(d, "train").manifest["key"] for d in (named, by_path)]
    assert key[0] == key[1]  # one cache entry whichever way the vocabulary arrived
    for name in ("train.bin", "val.bin", "test.bin", "train.offsets.npy", "tokenizer.tiktoken"):
        assert (named / name).read_bytes() == (by_path / name).read_bytes()
    assert open_split(named, "train").num_tokens > 0


def test_gpt2_and_its_file_share_one_cache_directory(stand_in, hub, text_dir, isolated_cache):
    """Issue 37, item 10: the path of the same rank file prepared again into a second cache folder."""
    named = prepare_data(str(text_dir), "gpt2", split_fractions=(0.5, 0.25, 0.25), progress=False)
    by_path = prepare_data(str(text_dir), str(stand_in), split_fractions=(0.5, 0.25, 0.25), progress=False)
    assert by_path == named and [d.name for d in (isolated_cache / "data").iterdir()] == [named.name]
