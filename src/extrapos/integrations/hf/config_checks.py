"""Every config.json field an adapter reads is checked here first, by key.

A malformed or hand-edited config.json ends with one sentence naming the key (never a KeyError, a
ValueError from int("four") or a ZeroDivisionError from 0 heads), and values that would only show up
as NaN losses later (rope_theta <= 0, a negative norm epsilon) or as an allocation no machine has (a
context of 10^12 tokens) are refused before any work.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from extrapos.errors import UserError

# The longest context any released checkpoint records is about 10M tokens (Llama 4 Scout); a larger
# max_position_embeddings or --context-length is a typo, and would size RoPE tables and memory
# estimates for a model nobody can run.
MAX_CONTEXT = 1 << 24
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "seq_length", "original_max_position_embeddings")

POSITIVE_INT = (
    "n_embd n_layer n_head n_positions n_inner vocab_size hidden_size n_embed num_hidden_layers "
    "num_attention_heads intermediate_size max_position_embeddings num_key_value_heads head_dim "
    "seq_length original_max_position_embeddings sliding_window"
).split()
POSITIVE_FLOAT = "layer_norm_epsilon layer_norm_eps rms_norm_eps rope_theta rotary_emb_base".split()
FRACTION = ["rotary_pct", "partial_rotary_factor"]
COUNT = ["max_window_layers"]  # may be 0 (Qwen2: every layer from 0 on has the window)
STRING = ["activation_function", "hidden_act"]
BOOL = (
    "tie_word_embeddings scale_attn_by_inverse_layer_idx scale_attn_weights use_parallel_residual "
    "attention_bias mlp_bias apply_residual_connection_post_layernorm use_sliding_window"
).split()
_ACT_IN = {
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def bad(key: str, need: str, value: Any) -> UserError:
    return UserError(f"config.json's {key} must be {need}, not {show(value)}; fix config.json.")


#: the largest magnitude of an integer read (an int64, as schema.INT_LIMIT); 10**400 is past any float too
INT_LIMIT = 2**63


def is_number(value: Any) -> bool:
    """A finite float, or an int that fits in 64 bits (``math.isfinite(10**400)`` raises OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < INT_LIMIT if isinstance(value, int) else math.isfinite(value)


def check_value(key: str, value: Any, kind: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
        raise bad(key, "a number below 2^63", value)
    if kind == "int":
        if not (is_number(value) and float(value).is_integer() and value >= 1):
            raise bad(key, "a positive integer", value)
    elif kind == "float":
        if not (is_number(value) and value > 0):
            raise bad(key, "a positive number", value)
    elif kind == "count":
        if not (is_number(value) and float(value).is_integer() and value >= 0):
            raise bad(key, "a non-negative integer", value)
    elif kind == "fraction":
        if not (is_number(value) and 0 < value <= 1):
            raise bad(key, "a number in (0, 1]", value)
    elif kind == "str":
        if not isinstance(value, str):
            raise bad(key, "a string", value)
    elif kind == "bool" and not isinstance(value, bool):
        raise bad(key, "true or false", value)


def check_context_length(value: Any, where: str, fix: str) -> None:
    """A context length no machine can hold is refused (``where`` names it, ``fix`` says what to do)."""
    if value > MAX_CONTEXT:
        raise UserError(
            f"{where} is {show(value)} tokens, more than the {MAX_CONTEXT:,} extrapos accepts (no model "
            f"has been trained that long); {fix}."
        )


#: Hugging Face's attention layer types extrapos runs ("attention" is the old name of the first)
LAYER_TYPES = {
    "full_attention": "full_attention",
    "attention": "full_attention",
    "sliding_attention": "sliding_attention",
}


def layer_types(hf: dict, n_layers: int) -> list[str] | None:
    """config.json's ``layer_types`` (full or sliding attention, one per layer), or None when absent."""
    types = hf.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) for t in types):
        raise bad("layer_types", f"a list of {n_layers} layer types (one per layer)", types)
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise UserError(
            f"config.json's layer_types holds {', '.join(map(repr, unknown))}, which extrapos does not run; "
            "it runs full_attention and sliding_attention layers."
        )
    return [LAYER_TYPES[t] for t in types]


def first(hf: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    return default


def activation(hf: dict, key: str, default: str) -> str:
    act = hf.get(key) or default
    if act not in _ACT_IN:
        raise UserError(f"activation {act!r} is not supported; extrapos has {', '.join(sorted(_ACT_IN))}.")
    return _ACT_IN[act]


def check_hf_config(hf: dict, arch: str, required: Sequence[tuple[str, ...]]) -> None:
    """Check every config.json field the adapters read (UserError naming the key); ``required``: each
    entry a key, or alternative keys of one setting, that the ``arch`` config must have."""
    for keys in required:
        if all(hf.get(k) is None for k in keys):
            raise UserError(
                f"config.json has no {' or '.join(keys)}, which a {arch} config needs; check its "
                "model_type or re-download the model."
            )
    for names, kind in (
        (POSITIVE_INT, "int"),
        (POSITIVE_FLOAT, "float"),
        (FRACTION, "fraction"),
        (COUNT, "count"),
        (STRING, "str"),
        (BOOL, "bool"),
    ):
        for key in names:
            if hf.get(key) is not None:
                check_value(key, hf[key], kind)
    for key in CONTEXT_KEYS:
        if hf.get(key) is not None:
            check_context_length(hf[key], f"config.json's {key}", "fix config.json")
    _check_structure(hf)


def _check_structure(hf: dict) -> None:
    """The keys that hold lists or objects, and the head split of the hidden size."""
    flags = hf.get("no_rope_layers")
    if flags is not None and not (isinstance(flags, list) and all(f in (0, 1) for f in flags)):
        raise bad("no_rope_layers", "a list of 0 and 1 (one per layer)", flags)
    for key in ("rope_scaling", "rope_parameters"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise bad(key, 'an object such as {"rope_type": "linear", "factor": 2.0} or null', hf[key])
    d = first(hf, "n_embd", "hidden_size", "n_embed")
    heads = first(hf, "n_head", "num_attention_heads")
    if hf.get("head_dim") is None and int(d) % int(heads):
        raise UserError(
            f"config.json's hidden size {int(d)} is not divisible by its {int(heads)} attention heads; "
            "fix config.json."
        )
