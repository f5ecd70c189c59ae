"""An exact tiktoken mirror of a byte-level BPE ``tokenizer.json``: the same ids, several times faster.

``tokenizers`` encodes a byte-level BPE (our trained ``bpe:N``, GPT-2's tokenizer.json) at 0.2 to 1
million tokens per second per core, the more the more its word cache hits; a tiktoken ``Encoding``
built from the same vocabulary runs at 4 to 5 million per core and releases the GIL, so threads
add cores. ``tiktoken_mirror``
builds that ``Encoding`` only when it provably gives the ids ``tokenizers`` gives, and otherwise says
why not (the caller then keeps ``tokenizers``). Three things must agree:

1. The pieces the text is cut into. No normalizer, and the ``ByteLevel`` pre-tokenizer with its
   regex and no prefix space: both libraries then cut with GPT-2's pattern (Radford et al. 2019),
   ``GPT2_PATTERN``, before mapping bytes. Their regex engines (Oniguruma, fancy-regex) classify every
   code point alike as a letter, a number, white space or other (a slow test checks all 1.1M).
2. The merges. tokenizers merges, again and again, the adjacent pair that comes first in its merge
   list; tiktoken merges the adjacent pair whose concatenation has the lowest rank, and the rank is
   the id. They coincide when (a) every merge makes a different token, later merges higher ids, and
   (b) every token, encoded alone, comes out whole. (b) rules out the one way they could part: two
   adjacent parts x, y whose concatenation is a token that another merge makes. tokenizers, on the
   text x+y alone, applies exactly the merges it applied inside that span in context (a merge
   outside the span never touches it, and the first pair of the whole word that lies inside the
   span is the first pair of the span), so it would reach [x, y] there too and, (x, y) being no
   merge, stop: x+y would not come out whole. (b) also means tiktoken's shortcut (a piece that is a
   token is that token) is what tokenizers does.
3. The added (special) tokens. Both find them in the raw text before cutting it (tokenizers does so
   even with ``add_special_tokens=False``); they must not strip neighbouring spaces or match whole
   words only, no one may begin another (tiktoken's alternation does not prefer the longest), and
   all must be matched in one pass (tokenizers runs two when ``normalized`` differs among them).

Nothing here changes which tokenizer a directory holds: a tokenizer's hash is that of its
tokenizer.json, and the mirror is only a faster way to compute the same ids.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken
    from tokenizers import Tokenizer as RustTokenizer

# Text that exercises each part of the pattern, run through both encoders whenever a mirror is
# built: a cheap guard should a future version of either library cut text differently.
PROBE = (
    "Hello world! It's 2024; we'll see: 1,234.5 km/h... \t\n\n  spaced   out \r\n"
    "café naïve Ünïcödé — “quotes” 東京都 한국어 العربية עברית हिन्दी 🙂👍🏽 \u00a0nbsp\u2009thin "
    "x<|endoftext|>y '' 'S 'LL\u0301 ١٢٣ Ⅻⅻ ²³ \x00\x1f\x7f " + "a" * 300 + " " * 40 + "end"
)


@lru_cache(maxsize=1)
def byte_level_table() -> dict[str, int]:
    """The byte each character of a ByteLevel vocabulary stands for (GPT-2's byte encoder,
    Radford et al. 2019): printable Latin-1 bytes stand for themselves, the 68 others take the
    characters from U+0100 on, in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in kept}
    shifted = [b for b in range(256) if chr(b) not in table]
    table.update({chr(0x100 + i): b for i, b in enumerate(shifted)})
    return table


def tiktoken_mirror(backend: RustTokenizer) -> tuple[tiktoken.Encoding | None, str]:
    """``(tiktoken.Encoding, "")`` giving the ids of the ``tokenizers.Tokenizer`` ``backend`` (with
    its added tokens matched in the text, as ``backend.encode(text, add_special_tokens=False)``
    does), or ``(None, reason)`` when that cannot be guaranteed (see the module docstring)."""
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    from extrapos.data.patterns import GPT2_PATTERN

    spec = json.loads(backend.to_str())
    reason = _unsupported(spec)
    if reason:
        return None, reason
    model = spec["model"]
    added = {t["content"]: t["id"] for t in spec.get("added_tokens") or []}
    table = byte_level_table()
    ranks: dict[bytes, int] = {}
    for token, token_id in model["vocab"].items():
        if token in added:
            if added[token] != token_id:
                return None, f"the added token {token!r} has two ids"
            continue
        if any(c not in table for c in token):
            return None, f"the vocabulary entry {token!r} is not byte-level"
        ranks[bytes(table[c] for c in token)] = token_id
    if len(set(ranks.values())) != len(ranks) or set(ranks.values()) & set(added.values()):
        return None, "two vocabulary entries share an id"
    if any(bytes([b]) not in ranks for b in range(256)):
        return None, "the vocabulary lacks some of the 256 bytes"
    reason = _merges_in_id_order(model, table, ranks)
    if reason:
        return None, reason
    tokenize = backend.model.tokenize
    for token, token_id in model["vocab"].items():  # condition (b): each token alone comes out whole
        if len(token) > 1 and token not in added and [t.id for t in tokenize(token)] != [token_id]:
            return None, f"the token {token!r} does not come out whole when encoded alone"
    encoding = tiktoken.Encoding(
        name="bpe-mirror", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=added
    )
    expected = backend.encode(PROBE, add_special_tokens=False).ids
    if encoding.encode(PROBE, allowed_special="all") != expected:
        return None, "tiktoken cuts the probe text differently"
    return encoding, ""


def _unsupported(spec: dict) -> str:
    """Why the pipeline around the model differs from tiktoken's; "" when it does not."""
    pre, post, model = spec.get("pre_tokenizer"), spec.get("post_processor"), spec.get("model") or {}
    if spec.get("normalizer") is not None:
        return "it has a normalizer"
    if not (
        isinstance(pre, dict)
        and pre.get("type") == "ByteLevel"
        and not pre.get("add_prefix_space", True)
        and pre.get("use_regex", True)
    ):
        return "its pre-tokenizer is not ByteLevel without prefix space"
    if post is not None and post.get("type") != "ByteLevel":  # ByteLevel only trims offsets
        return "it has a post-processor"
    if spec.get("truncation") is not None or spec.get("padding") is not None:
        return "it truncates or pads"
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        return "its model is not a plain BPE"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "its BPE marks word pieces"
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
        return "an added token strips spaces or matches whole words only"
    if len({bool(t.get("normalized")) for t in added}) > 1:
        return "its added tokens are matched in two passes"
    names = [t["content"] for t in added]
    if any(a != b and b.startswith(a) for a in names for b in names):
        return "one added token begins another"
    return ""


def _merges_in_id_order(model: dict, table: dict[str, int], ranks: dict[bytes, int]) -> str:
    """Condition (a): every merge makes a distinct token, with ids rising in merge order, and every
    token longer than a byte is made by a merge."""
    last, made = -1, set()
    for merge in model.get("merges") or []:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        try:
            token = bytes(table[c] for c in left + right)
        except KeyError:
            return "a merge is not byte-level"
        token_id = ranks.get(token)
        if token_id is None or token_id <= last or token in made:
            return "its merges are not in the order of the ids they make"
        last = token_id
        made.add(token)
    if len(made) != sum(1 for token in ranks if len(token) > 1):
        return "some tokens are made by no merge"
    return ""
