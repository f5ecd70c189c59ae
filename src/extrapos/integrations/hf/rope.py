"""RoPE settings in and out of a config.json (rope_theta, rope_scaling / rope_parameters), shared by
every architecture that rotates (GPT-NeoX, the Llama family).

Import reads Hugging Face's rope types (default, linear, dynamic, yarn, llama3, longrope) into the
options of our ``rope`` encoding; export writes the inverse. The formulas: Su et al. 2021 (RoPE),
Chen et al. 2023 (linear), Peng et al. 2023 (YaRN, with NTK-aware and dynamic scaling), Dubey et al.
2024 (llama3), Ding et al. 2024 (LongRoPE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from extrapos.errors import UserError
from extrapos.integrations.hf.config_checks import (
    bad,
    check_context_length,
    check_value,
    first,
    is_number,
    show,
)

if TYPE_CHECKING:
    from extrapos.model import ModelConfig
    from extrapos.positions.rotary import RoPE


def _rope_number(params: dict, key: str, kind: str, section: str) -> float:
    """A number of the rope_scaling / rope_parameters object, checked (UserError naming the key)."""
    if params.get(key) is None:
        rope_type = params.get("rope_type", params.get("type"))
        raise UserError(
            f"config.json's {section} has no {key}, which RoPE type {rope_type!r} needs; fix config.json."
        )
    check_value(f"{section}.{key}", params[key], kind)
    return float(params[key])


def _rope_factors(params: dict, key: str, section: str) -> list[float]:
    values = params.get(key)
    if not (isinstance(values, list) and values and all(is_number(v) and v > 0 for v in values)):
        raise bad(f"{section}.{key}", "a list of positive numbers", values)
    return [float(v) for v in values]


def _theta(hf: dict, params: dict, section: str) -> float:
    """rope_theta of the rope section, else of the config (rotary_emb_base: GPT-NeoX), else 10000."""
    if params.get("rope_theta") is not None:
        return _rope_number(params, "rope_theta", "float", section)
    key = next((k for k in ("rope_theta", "rotary_emb_base") if hf.get(k) is not None), None)
    if key is not None:
        check_value(key, hf[key], "float")
    return float(hf[key]) if key else 10000.0


def _lengths(hf: dict, params: dict, section: str) -> tuple[int, int]:
    """(max_position_embeddings, the original context a scaling extends)."""
    if hf.get("max_position_embeddings") is None:
        raise UserError(
            "config.json has no max_position_embeddings, which a RoPE model needs; fix config.json."
        )
    check_value("max_position_embeddings", hf["max_position_embeddings"], "int")
    max_pos = int(hf["max_position_embeddings"])
    if hf.get("original_max_position_embeddings") is not None:
        check_value("original_max_position_embeddings", hf["original_max_position_embeddings"], "int")
        return max_pos, int(hf["original_max_position_embeddings"])
    if params.get("original_max_position_embeddings") is not None:
        original = int(_rope_number(params, "original_max_position_embeddings", "int", section))
        where = f"config.json's {section}.original_max_position_embeddings"
        check_context_length(original, where, "fix config.json")
        return max_pos, original
    return max_pos, max_pos


@dataclass(frozen=True)
class _Scaling:
    """What every rope type reads: its section of config.json, the factor and the lengths."""

    params: dict
    section: str
    factor: float
    original: int
    max_pos: int

    def number(self, key: str) -> float:
        return _rope_number(self.params, key, "float", self.section)


def _linear(s: _Scaling) -> dict[str, Any]:
    return {"scaling": "linear", "factor": s.factor}


def _dynamic(
    s: _Scaling,
) -> dict[str, Any]:  # Hugging Face's dynamic NTK measures from max_position_embeddings
    return {"scaling": "dynamic", "factor": s.factor, "original_length": s.max_pos}


def _llama3(s: _Scaling) -> dict[str, Any]:
    return {
        "scaling": "llama3",
        "factor": s.factor,
        "original_length": s.original,
        "low_freq_factor": s.number("low_freq_factor"),
        "high_freq_factor": s.number("high_freq_factor"),
    }


def _yarn(s: _Scaling) -> dict[str, Any]:
    if s.params.get("truncate") is False:
        raise UserError("YaRN with truncate = false is not supported; extrapos rounds the correction range.")
    attention = s.params.get("attention_factor")
    mscale, mscale_all = s.params.get("mscale"), s.params.get("mscale_all_dim")
    if attention is None and mscale and mscale_all:

        def m(scale: float, k: float) -> float:
            return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

        attention = m(s.factor, mscale) / m(s.factor, mscale_all)
    out = {
        "scaling": "yarn",
        "factor": float(s.factor),
        "original_length": s.original,
        "beta_fast": float(s.params.get("beta_fast") or 32.0),
        "beta_slow": float(s.params.get("beta_slow") or 1.0),
    }
    return out if attention is None else {**out, "attention_factor": float(attention)}


def _longrope(s: _Scaling) -> dict[str, Any]:
    out = {
        "scaling": "longrope",
        "factor": float(s.factor),
        "original_length": s.original,
        "long_factor": _rope_factors(s.params, "long_factor", s.section),
        "short_factor": _rope_factors(s.params, "short_factor", s.section),
    }
    attention = s.params.get("attention_factor")
    return out if attention is None else {**out, "attention_factor": float(attention)}


# Hugging Face's rope_type -> our options; linear, dynamic and llama3 need an explicit factor
_SCALINGS = {"linear": _linear, "dynamic": _dynamic, "llama3": _llama3, "yarn": _yarn, "longrope": _longrope}


def _rope_section(hf: dict) -> str:
    """The section of config.json transformers 5 reads the RoPE from: ``rope_scaling`` when it holds
    anything, else ``rope_parameters`` (``convert_rope_params_to_dict``: ``rope_scaling or
    rope_parameters``). transformers 5 writes ``rope_parameters`` and model cards tell users to add a
    top-level ``rope_scaling``: reading ``rope_parameters`` alone imported plain RoPE where transformers
    applies the scaling. A ``rope_parameters`` value that transformers would then drop is refused."""
    for key in ("rope_scaling", "rope_parameters"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise bad(key, 'an object such as {"rope_type": "linear", "factor": 2.0} or null', hf[key])
    scaling, parameters = hf.get("rope_scaling"), hf.get("rope_parameters")
    if not scaling:
        return "rope_parameters" if parameters else "rope_scaling"
    if parameters:
        _refuse_conflict(hf, dict(scaling), dict(parameters))
    return "rope_scaling"


# what transformers 5 sets in the section it reads when the file leaves it out (the rest stays out)
_FILLED = ("rope_type", "rope_theta", "original_max_position_embeddings", "partial_rotary_factor")


def _refuse_conflict(hf: dict, scaling: dict, parameters: dict) -> None:
    """A UserError naming the first ``rope_parameters`` value that reading ``rope_scaling`` in its place
    changes or drops (a plain ``rope_type: default`` is no conflict: that is what the scaling replaces)."""
    if parameters and all(isinstance(v, dict) or v is None for v in parameters.values()):
        raise UserError("this config has a different RoPE per layer type, which extrapos does not model.")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    used = {
        **scaling,
        "rope_type": kind,
        "rope_theta": _theta(hf, scaling, "rope_scaling"),
        "partial_rotary_factor": scaling.get("partial_rotary_factor", hf.get("partial_rotary_factor")),
    }
    if kind in ("llama3", "yarn", "longrope"):
        used["original_max_position_embeddings"] = first(
            hf, "original_max_position_embeddings", default=_lengths(hf, scaling, "rope_scaling")[1]
        )
    given = {**parameters, "rope_type": parameters.get("rope_type", parameters.get("type", "default"))}
    given.pop("type", None)
    if given["rope_type"] == "default":
        given.pop("rope_type")
    for key in sorted(given, key=lambda k: (k != "rope_type", k)):
        if given[key] is not None and given[key] != used.get(key):
            now = "dropped" if used.get(key) is None else f"{show(used[key])}"
            raise UserError(
                "config.json has both rope_scaling and rope_parameters, and transformers 5 reads "
                f"rope_scaling in their place, so rope_parameters.{key} = {show(given[key])} would be {now}; "
                "give the two the same values or keep only one of them in config.json."
            )


def rope_options_from_hf(hf: dict, head_dim: int, partial: float = 1.0) -> dict[str, Any]:
    """Our ``rope`` encoding options from a config's rope_theta and rope_scaling / rope_parameters, read
    as transformers 5 reads them (``_rope_section``)."""
    section = _rope_section(hf)
    params = dict(hf.get(section) or {})
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        raise UserError("this config has a different RoPE per layer type, which extrapos does not model.")
    theta = _theta(hf, params, section)
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if not isinstance(kind, str):
        raise bad(f"{section}.rope_type", 'a string such as "linear"', kind)
    max_pos, original = _lengths(hf, params, section)
    opts: dict[str, Any] = {"name": "rope", "base": theta}
    if partial != 1.0:
        opts["rotary_fraction"] = float(partial)
    if kind == "default":
        return _within_bounds(opts, hf, section)
    if kind not in _SCALINGS:
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
            check_value(f"{section}.{key}", params[key], "float")
    return _within_bounds(
        {**opts, **_SCALINGS[kind](_Scaling(params, section, factor, original, max_pos))}, hf, section
    )


def _within_bounds(opts: dict[str, Any], hf: dict, section: str) -> dict[str, Any]:
    """``opts`` once the ``rope`` encoding's own bounds accept them (``bounds.py``: a factor of 1e30 or a
    rope_theta of 1e308 imports with exit 0 and makes every later evaluation blame options the user never
    gave); a refusal names the config.json field the value came from."""
    from extrapos.bounds import BoundError
    from extrapos.positions.rotary import RoPE

    try:
        RoPE.Options(**{k: v for k, v in opts.items() if k != "name"})
    except BoundError as e:
        raise bad(_hf_field(e.key, hf, section), e.rule, e.value) from None
    return opts


def _hf_field(option: str, hf: dict, section: str) -> str:
    """The config.json field a ``rope`` option was read from."""
    if option == "base":
        params = hf.get(section) or {}
        inside = isinstance(params, dict) and params.get("rope_theta") is not None
        return (
            f"{section}.rope_theta"
            if inside
            else "rotary_emb_base"
            if "rotary_emb_base" in hf
            else "rope_theta"
        )
    if option == "rotary_fraction":
        return "partial_rotary_factor" if "partial_rotary_factor" in hf else "rotary_pct"
    if option == "original_length":
        return "original_max_position_embeddings"
    if option == "attention_factor" and (hf.get(section) or {}).get("attention_factor") is None:
        return f"{section}.mscale / mscale_all_dim"
    if option == "factor" and (hf.get(section) or {}).get("factor") is None:
        return "max_position_embeddings / original_max_position_embeddings"
    return f"{section}.{option}"


def rope_export(cfg: ModelConfig, context: int) -> tuple[float, dict | None, int]:
    """(rope_theta, rope_scaling or None, max_position_embeddings) for an exported RoPE run whose
    context length is ``context`` (L_t, or L_e for an extended run)."""
    o = rope_options(cfg)
    L = o.original_length or cfg.train_length
    dim = int(cfg.head_dim * o.rotary_fraction) // 2 * 2
    longer = max(context, int(L * o.factor))
    if o.scaling is None:
        return o.base, None, context
    if o.scaling == "ntk":  # static NTK-aware scaling is plain RoPE with a larger base
        return o.base * o.factor ** (dim / (dim - 2)), None, context
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


def rope_export_blocker(cfg: ModelConfig, whole_heads: bool) -> str | None:
    """Why a RoPE run has no faithful Hugging Face config (``whole_heads``: the architecture rotates
    every dim of a head, as Llama does), or None."""
    o = rope_options(cfg)
    rot = int(cfg.head_dim * o.rotary_fraction)
    if whole_heads and rot != cfg.head_dim:
        return "Llama rotates whole heads, the run has rotary_fraction < 1"
    if rot % 2:
        return f"rotary_fraction {o.rotary_fraction} rotates an odd number of dims"
    if rot != cfg.head_dim and o.scaling in ("yarn", "longrope"):
        return "Hugging Face applies the yarn / longrope attention factor to the rotated dims only"
    return None


def rotary_fraction(cfg: ModelConfig) -> float:
    return rope_options(cfg).rotary_fraction


def rope_options(cfg: Any) -> RoPE.Options:
    """The ``rope`` encoding's options of a run the RoPE adapters claimed (its plan, typed)."""
    from extrapos.positions.rotary import RoPE

    return cfg.positions_plan().options_as(RoPE.Options)
