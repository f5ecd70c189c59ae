"""Every tokenizer kind: trained bpe:N, tokenizer.json, sentencepiece .model, .tiktoken; save / reload."""

from __future__ import annotations

import io

import pytest
from data_helpers import text_of, write_tiktoken_file

from extrapos.data import build_tokenizer, load_tokenizer
from extrapos.data.tokenizer import GPT2_PATTERN, token_dtype
from extrapos.errors import UserError

TEXTS = [text_of(i) for i in range(8)]
SAMPLE = "Train short, test long: 1234 tokens of café ☕ text."


def roundtrip_checks(tok, tmp_path):
    """Lossless encode/decode, batch == single, save + reload keeps ids and hash."""
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE
    assert tok.encode_batch([SAMPLE, "x"]) == [ids, tok.encode("x")]
    assert 0 <= tok.eot_id < tok.vocab_size and max(ids) < tok.vocab_size
    tok.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    assert type(again) is type(tok)
    assert again.encode(SAMPLE) == ids and again.hash == tok.hash and again.eot_id == tok.eot_id


def test_trained_bpe_has_special_tokens_and_is_deterministic(tmp_path):
    tok = build_tokenizer("bpe:300", TEXTS)
    assert tok.vocab_size == 300 and tok.eot_id == 0
    assert tok.backend.token_to_id("<|pad|>") == 1 and tok.backend.token_to_id("<|mask|>") == 2
    assert (
        build_tokenizer("bpe:300", [("id", t) for t in TEXTS]).hash == tok.hash
    )  # (id, text) pairs work too
    roundtrip_checks(tok, tmp_path)


def test_tokenizer_json_file(tmp_path):
    path = build_tokenizer("bpe:300", TEXTS).save(tmp_path / "src")
    assert path.name == "tokenizer.json"
    tok = load_tokenizer(str(path))
    assert tok.kind == "hf"
    roundtrip_checks(tok, tmp_path)


def test_tokenizer_json_without_end_of_text_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(
        str(tmp_path / "tokenizer.json")
    )
    with pytest.raises(UserError, match="no end-of-text token"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_sentencepiece_model_trained_in_the_test(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS * 4),
        model_writer=model,
        vocab_size=60,
        character_coverage=1.0,
        minloglevel=2,
    )
    (tmp_path / "tiny.model").write_bytes(model.getvalue())
    tok = load_tokenizer(tmp_path / "tiny.model")
    assert tok.kind == "sentencepiece" and tok.eot_id == 2 and tok.vocab_size == 60
    ids = tok.encode("The quick brown fox")
    assert tok.decode(ids) == "The quick brown fox"
    assert tok.encode_batch(["The quick brown fox"]) == [ids]
    tok.save(tmp_path / "saved")
    assert load_tokenizer(tmp_path / "saved").hash == tok.hash


def test_tiktoken_file_written_by_hand(tmp_path):
    pytest.importorskip("tiktoken")
    tok = load_tokenizer(write_tiktoken_file(tmp_path / "tiny.tiktoken"))
    assert tok.kind == "tiktoken" and tok.pattern == GPT2_PATTERN
    assert tok.eot_id == 263 and tok.vocab_size == 264  # <|endoftext|> right after the last rank, as in GPT-2
    assert tok.encode("the thing") == [258, 32, 256, 262]  # "the", " ", "th", "ing": lowest rank merges first
    roundtrip_checks(tok, tmp_path)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("gpt7", "Unknown tokenizer 'gpt7'.*bpe:N"),
        ("bpe:lots", "Cannot read the vocabulary size"),
        ("bpe:100", "at least 259"),
        ("./missing/tokenizer.json", "no such file"),
    ],
)
def test_bad_tokenizer_specs(spec, message):
    with pytest.raises(UserError, match=message):
        build_tokenizer(spec, TEXTS)


def test_bad_tokenizer_files(tmp_path):
    (tmp_path / "vocab.txt").write_text("hello")
    with pytest.raises(UserError, match="Unknown tokenizer file"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "bad.tiktoken").write_text("this is not base64 !!\n")
    with pytest.raises(UserError, match="tiktoken file"):
        load_tokenizer(tmp_path / "bad.tiktoken")
    (tmp_path / "bad.model").write_bytes(b"garbage")
    with pytest.raises(UserError, match="not a valid sentencepiece model"):
        load_tokenizer(tmp_path / "bad.model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no tokenizer"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(UserError, match="trained on a corpus"):
        build_tokenizer("bpe:300")


def test_token_dtype_switches_to_uint32_past_65536():
    assert token_dtype(8192) == "uint16" and token_dtype(65536) == "uint16"
    assert token_dtype(65537) == "uint32"
