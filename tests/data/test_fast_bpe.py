"""The tiktoken mirror of a byte-level BPE gives the ids `tokenizers` gives, or is not used."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from extrapos.data.fast_bpe import byte_level_table, tiktoken_mirror
from extrapos.data.tokenizer import GPT2_PATTERN, HFTokenizer, train_bpe

tiktoken = pytest.importorskip("tiktoken")

TRAINING = [
    "The quick brown fox jumps over the lazy dog. It's 1234 o'clock; we'll see 56,789.01 km/h. " * 3,
    "Café naïve Ünïcödé — “quotes” ‘single’ … déjà vu, Straße, ǅemal, İstanbul, ΑΒΓ αβγ. " * 3,
    "東京都は日本の首都です。한국어 문장입니다. العربية نص قصير. עברית טקסט. हिन्दी पाठ। " * 3,
    "emoji 🙂👍🏽👨‍👩‍👧 flags 🇫🇷 and math ∑∫√∞ ≤ ≥ ≠ ²³ ½ Ⅻ ⅻ ١٢٣ ௧௨ " * 3,
    "def f(x):\n\treturn x ** 2  # comment\n\n\n    if x:\r\n        pass\n" * 3,
    "spaces     between   words\u00a0nbsp\u2009thin\u3000ideographic\t\ttabs\n\n\nlines  " * 3,
]
VARIED = [
    "",
    " ",
    "\n",
    "a",
    "Hello world",
    "Hello world<|endoftext|>Next document",
    "<|endoftext|><|pad|><|mask|>",
    "x <|endoftext|> y<|pad|>z <|mask|>\n<|endoftext|",  # the last one is incomplete: plain text
    "<|endoftext|>" * 5 + "<|end",
    "It's 'S 'LL 've don't ’s I'M",
    "   leading and trailing   ",
    "tabs\t\tand\t \tmixed \t \n \r\n\r\n  \n\n\n   x",
    " " * 100 + "x" + " " * 100,
    "\u00a0\u2009\u3000\u200b\u2028\u2029\u0085\u180e\ufeff",
    "0123456789" * 30,
    "١٢٣٤ ௧௨௩ ²³¹ ½¾ Ⅻⅻ 𝟘𝟙𝟚 3.14159e-10 -42 +7 1,000,000",
    "東京都は日本の首都です。한국어 العربية עברית हिन्दी ไทย",
    "👨‍👩‍👧‍👦🙂👍🏽🇫🇷🏳️‍🌈 a\u0301 e\u0308\u0323 ﷺ",
    "\x00\x01\x1b[31mred\x1b[0m\x7f\x1c\x1d\x1e\x1f",
    "𐍈𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010fffd \ue000 \U000e0001",
    "A" * 5000,  # one long piece of letters
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" * 300,  # base64 without spaces
    "-" * 3000 + "=" * 3000,
    "https://example.com/a/b?c=d&e=f#g " * 50,
    "\n".join(TRAINING),
]


def hf_ids(backend, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


def fuzz(n: int, seed: int = 0) -> list[str]:
    """Random strings over characters that each part of the pattern treats differently."""
    alphabet = list("aZé東한ع1٣²Ⅻ '’-_.,!?\t\n\r \u00a0\u3000🙂\u0301") + [
        "'s",
        "'ll",
        "<|endoftext|>",
        "<|pad|>",
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def trained():
    return train_bpe(TRAINING * 4, 600)


def test_byte_level_table_is_the_pre_tokenizers_alphabet():
    from tokenizers import pre_tokenizers

    table = byte_level_table()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet()) and sorted(table.values()) == list(
        range(256)
    )
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for text in ["a b\tc\n", "é", "東", "🙂", "\x00\x7f"]:
        (piece, _), *_ = pre.pre_tokenize_str(text)
        assert bytes(table[c] for c in piece) == text.encode()


def test_trained_bpe_has_a_mirror_with_the_same_ids_on_varied_text(trained):
    mirror, reason = tiktoken_mirror(trained.backend)
    assert mirror is not None, reason
    assert trained.encoder == "tiktoken"
    texts = VARIED + fuzz(400)
    expected = [hf_ids(trained.backend, t) for t in texts]
    assert [mirror.encode(t, allowed_special="all") for t in texts] == expected
    arrays = trained.encode_arrays(texts)
    assert all(a.dtype == np.uint32 for a in arrays)
    assert [a.tolist() for a in arrays] == expected
    assert trained.encode_batch(texts) == expected
    assert [trained.encode(t) for t in texts] == expected
    assert trained.eot_id in expected[5]  # special tokens in the text are matched, as tokenizers does


def test_merges_are_exercised_by_the_varied_text(trained):
    """Guard against a vacuous comparison: the texts use many merged tokens, not just bytes."""
    ids = {i for t in VARIED for i in hf_ids(trained.backend, t)}
    assert len([i for i in ids if i > 258]) > 100


def test_added_special_tokens_rebuild_the_mirror():
    tok = train_bpe(TRAINING, 400)
    tok.add_special_tokens(["[CLS]", "[SEP]"])
    text = "[CLS] first part [SEP] second<|endoftext|>"
    ids = tok.encode_arrays([text])[0].tolist()
    assert tok.encoder == "tiktoken" and ids == hf_ids(tok.backend, text)
    assert ids[0] == tok.token_id("[CLS]") == 400


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def spec_of(tok: HFTokenizer) -> dict:
    return json.loads(tok.backend.to_str())


def backend_of(spec: dict):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(spec))


def hand_bpe(merges: list[list[str]], extra: list[str]) -> dict:
    """A byte-level BPE over the 256 bytes plus ``extra`` tokens (in id order) and ``merges``."""
    table = byte_level_table()
    chars = sorted(table, key=table.get)
    vocab = {"<|endoftext|>": 0, **{c: 1 + i for i, c in enumerate(chars)}}
    vocab.update({t: len(vocab) + i for i, t in enumerate(extra)})
    added = {"id": 0, "content": "<|endoftext|>", "special": True, "normalized": False}
    added.update(single_word=False, lstrip=False, rstrip=False)
    return {
        "version": "1.0",
        "added_tokens": [added],
        "normalizer": None,
        "pre_tokenizer": BYTE_LEVEL,
        "post_processor": None,
        "decoder": BYTE_LEVEL,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    }


def test_a_token_that_merges_cannot_reach_is_why_rank_order_can_differ():
    """Merges b+c, then a+b, then ab+c: "abc" is a token, but tokenizers cuts "abc" as [a, bc]
    (b+c comes first and a+bc is no merge) while tiktoken's rank rule merges a+bc into "abc".
    The mirror sees the token does not come out whole and is refused."""
    spec = hand_bpe([["b", "c"], ["a", "b"], ["ab", "c"]], ["bc", "ab", "abc"])
    backend = backend_of(spec)
    table = byte_level_table()
    naive = {bytes(table[c] for c in t): i for t, i in spec["model"]["vocab"].items() if i}
    naive_encoding = tiktoken.Encoding(
        "naive", pat_str=GPT2_PATTERN, mergeable_ranks=naive, special_tokens={}
    )
    vocab = spec["model"]["vocab"]
    assert hf_ids(backend, "abc") == [vocab["a"], vocab["bc"]]
    assert naive_encoding.encode_ordinary("abc") == [vocab["abc"]]  # would differ
    mirror, reason = tiktoken_mirror(backend)
    assert mirror is None and "does not come out whole" in reason
    tok = HFTokenizer(backend)
    assert tok.encode_arrays(["abc xabcx"])[0].tolist() == hf_ids(backend, "abc xabcx")
    assert tok.encoder.startswith("tokenizers (")


def test_a_hand_made_bpe_in_merge_order_is_mirrored():
    spec = hand_bpe([["a", "b"], ["ab", "c"], ["Ġ", "ab"]], ["ab", "abc", "Ġab"])
    backend = backend_of(spec)
    mirror, reason = tiktoken_mirror(backend)
    assert mirror is not None, reason
    for text in ["abc ab abcabc", " ab<|endoftext|>abc", "ba cab"]:
        assert mirror.encode(text, allowed_special="all") == hf_ids(backend, text)


def edit(spec: dict, change) -> dict:
    spec = json.loads(json.dumps(spec))
    change(spec)
    return spec


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer"),
        (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "pre-tokenizer"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer"),
        (lambda s: s["model"].update(byte_fallback=True), "plain BPE"),
        (lambda s: s["model"].update(merges=s["model"]["merges"][::-1]), "order of the ids"),
        (lambda s: s["model"].update(merges=s["model"]["merges"][:-1]), "made by no merge"),
        (lambda s: s["added_tokens"][0].update(lstrip=True), "strips spaces"),
        (
            lambda s: s["added_tokens"].append(
                {**s["added_tokens"][0], "id": 3, "content": "<|endoftext|>x", "normalized": False}
            ),
            "begins another",
        ),
        (lambda s: s["added_tokens"][1].update(normalized=True), "two passes"),
    ],
)
def test_tokenizers_that_could_differ_keep_tokenizers(trained, change, reason):
    spec = edit(spec_of(trained), change)
    try:
        backend = backend_of(spec)
    except Exception:  # tokenizers itself refuses some edits (e.g. an added id that is taken)
        pytest.skip("tokenizers does not load this edit")
    mirror, why = tiktoken_mirror(backend)
    assert mirror is None and reason in why
    tok = HFTokenizer(backend)
    text = "Hello <|endoftext|> wörld 123"
    assert tok.encode_arrays([text])[0].tolist() == hf_ids(backend, text)
    assert tok.encoder == f"tokenizers ({why})"


@pytest.mark.slow
def test_both_regex_engines_classify_every_code_point_alike():
    """The pieces depend on which code points are letters, numbers, white space or other. For
    every code point c, each probe ("a" + c, "1" + c, "\\t" + c, "!" + c, " " + c and c first) is one
    piece or several alike in tokenizers' ByteLevel and in tiktoken: tiktoken's count is read off an
    encoding whose ranks hold every probe whole, so a probe kept whole is one token."""
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    prefixes = ["a", "1", "\t", "!", " "]
    differing, whole = [], 0
    for low in range(0, 0x110000, 0x10000):
        probes = [
            s
            for c in range(low, low + 0x10000)
            if not 0xD800 <= c < 0xE000
            for p in prefixes
            for s in (p + chr(c), chr(c) + p)
        ]
        ranks = {bytes([b]): b for b in range(256)}
        for probe in probes:
            ranks.setdefault(probe.encode(), len(ranks))
        encoding = tiktoken.Encoding("probe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
        tiktoken_whole = [len(ids) == 1 for ids in encoding.encode_ordinary_batch(probes)]
        for probe, one in zip(probes, tiktoken_whole):
            whole += one
            if one != (len(pre.pre_tokenize_str(probe)) == 1):
                differing.append(probe)
    assert not differing, differing[:20]
    assert whole > 500_000  # letters and others kept whole with their neighbours: the probe is not vacuous


def test_a_tiktoken_files_bulk_path_gives_its_ordinary_ids(tmp_path):
    """``.tiktoken`` files and ``gpt2`` keep tiktoken's ordinary encoding in bulk: special-token text
    is text there, as it always was for them (unlike a tokenizer.json, whose added tokens match)."""
    from data_helpers import write_tiktoken_file

    from extrapos.data.tokenizer import load_tokenizer

    tok = load_tokenizer(write_tiktoken_file(tmp_path / "tiny.tiktoken"))
    texts = VARIED + fuzz(200, seed=1)
    expected = tok.backend.encode_ordinary_batch(texts)
    assert [a.tolist() for a in tok.encode_arrays(texts)] == expected == tok.encode_batch(texts)
    assert [a.dtype for a in tok.encode_arrays(texts[:2], "uint16")] == [np.uint16, np.uint16]
    assert tok.eot_id not in expected[5]
