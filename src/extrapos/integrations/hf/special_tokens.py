"""The begin-of-text, end-of-text and padding tokens of a run, carried through an import and back out by
an export.

Hugging Face keeps them in two places: the ids in config.json (``bos_token_id``, ``eos_token_id``, which
may be a list, ``pad_token_id``) and the token texts in tokenizer_config.json (``bos_token``, ...). An
import records both (``source.json``'s ``special_tokens``), so that an export writes back what the model
came with (a Qwen2 whose begin-of-text differs from its end-of-text keeps both). A run trained here has
one special token, end of text: it is begin, end and padding, as GPT-2's ``<|endoftext|>`` is, so that a
batch of prompts can be padded without the user naming a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("bos", "eos", "pad")


@dataclass
class SpecialTokens:
    """``ids``: config.json's ``<role>_token_id`` (``eos`` may be a list); ``tokens``: the texts
    tokenizer_config.json names them by. None where the model has no such token."""

    ids: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(ROLES))
    tokens: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(ROLES))

    def config_fields(self) -> dict[str, Any]:
        """The keys of config.json (and generation_config.json)."""
        return {f"{role}_token_id": self.ids.get(role) for role in ROLES}

    def tokenizer_fields(self) -> dict[str, str | None]:
        """The keys of tokenizer_config.json."""
        return {f"{role}_token": self.tokens.get(role) for role in ROLES}

    def record(self) -> dict[str, Any]:
        """What ``source.json`` keeps."""
        return {"ids": dict(self.ids), "tokens": dict(self.tokens)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SpecialTokens:
        return cls(
            {r: record.get("ids", {}).get(r) for r in ROLES},
            {r: record.get("tokens", {}).get(r) for r in ROLES},
        )


def token_text(tokenizer: Any, token_id: int) -> str | None:
    """The text of one token id in any of data/tokenizer.py's kinds (None past the vocabulary)."""
    backend = getattr(tokenizer, "backend", None)
    for method in ("id_to_token", "id_to_piece"):  # tokenizers' Tokenizer, sentencepiece
        lookup = getattr(backend, method, None)
        if lookup is not None:
            try:
                return lookup(int(token_id))
            except Exception:  # an id past the vocabulary (a model whose embedding is larger)
                return None
    try:
        return tokenizer.decode([int(token_id)])
    except Exception:
        return None


def _text(value: Any) -> str | None:
    """tokenizer_config.json writes a token as its text or as an AddedToken dict (``content``)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _single(value: Any) -> int | None:
    """The first id of an id or a list of ids (Llama 3 ends on either of two tokens)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def imported(source: Path, hf: dict[str, Any], tokenizer: Any) -> SpecialTokens:
    """The special tokens of a Hugging Face model directory: the ids of config.json (else of
    generation_config.json), the texts of tokenizer_config.json, each side completed from the other
    through ``tokenizer`` (the one the run gets)."""
    generation: dict[str, Any] = {}
    tok_config: dict[str, Any] = {}
    for name, into in (("generation_config.json", generation), ("tokenizer_config.json", tok_config)):
        try:
            loaded = json.loads((source / name).read_text())
        except (OSError, ValueError):  # absent or unreadable: config.json's ids still hold
            continue
        if isinstance(loaded, dict):
            into.update(loaded)
    special = SpecialTokens()
    for role in ROLES:
        key = f"{role}_token_id"
        ids = hf.get(key) if hf.get(key) is not None else generation.get(key)
        text = _text(tok_config.get(f"{role}_token"))
        if ids is None and text is not None:
            ids = tokenizer.token_id(text)
        first = _single(ids)
        if text is None and first is not None:
            text = token_text(tokenizer, first)
        special.ids[role], special.tokens[role] = ids, text
    return special


def of_run(run_path: Path, tokenizer: Any) -> SpecialTokens:
    """The special tokens an export of the run writes: what its import recorded (a run imported before
    the record existed: config.json's ids kept in ``source.json``), else end of text in all three roles."""
    source = run_path / "source.json"
    if source.is_file():
        record = json.loads(source.read_text())
        if "special_tokens" in record:
            return SpecialTokens.from_record(record["special_tokens"])
        hf = record.get("hf_config") or {}
        ids = {role: hf.get(f"{role}_token_id") for role in ROLES}
        first = {role: _single(i) for role, i in ids.items()}
        return SpecialTokens(
            ids, {r: None if i is None else token_text(tokenizer, i) for r, i in first.items()}
        )
    eot = getattr(tokenizer, "eot_id", None)
    text = token_text(tokenizer, eot) if eot is not None else None
    return SpecialTokens(dict.fromkeys(ROLES, eot), dict.fromkeys(ROLES, text))
