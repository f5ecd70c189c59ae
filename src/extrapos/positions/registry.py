"""Name -> positional-encoding class, like Hugging Face's ROPE_INIT_FUNCTIONS.

Adding an encoding is one new file with a class and a ``register(...)`` call, plus its module
name in ``_MODULES`` below. One class may be registered under several names with different
default options (``cable-nw`` is CABLE with ``weighted = False``).
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, PositionalEncoding

# modules whose import registers encodings
_MODULES = [
    "extrapos.positions.absolute",
    "extrapos.positions.rotary",
    "extrapos.positions.expe",
    "extrapos.positions.bias",
    "extrapos.positions.cable",
]


@dataclass(frozen=True)
class EncodingSpec:
    name: str
    cls: type[PositionalEncoding]
    defaults: dict[str, Any] = field(default_factory=dict)  # overrides of cls.Options defaults
    description: str = ""


_REGISTRY: dict[str, EncodingSpec] = {}
_loaded = False


def register(name: str, cls: type[PositionalEncoding], description: str = "", **defaults: Any) -> None:
    if name in _REGISTRY:
        raise ValueError(f"positional encoding {name!r} is registered twice")
    _REGISTRY[name] = EncodingSpec(name, cls, defaults, description)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in _MODULES:
            importlib.import_module(module)


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def spec(name: str) -> EncodingSpec:
    _load()
    if name not in _REGISTRY:
        raise UserError(f"unknown positional encoding {name!r}; choose one of: {', '.join(_REGISTRY)}.")
    return _REGISTRY[name]


def _coerce(name: str, f: dataclasses.Field, value: Any, hints: dict) -> Any:
    """Check one option value against its annotation (TOML gives ints where floats are meant)."""
    hint = hints.get(f.name, Any)
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else (hint,)
    if value is None and type(None) in allowed:
        return None
    for t in allowed:
        if t is Any:
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is bool and isinstance(value, bool):
            return value
        if t is str and isinstance(value, str):
            return value
    raise UserError(
        f"option {f.name!r} of encoding {name!r} must be {' or '.join(getattr(t, '__name__', str(t)) for t in allowed)}, "
        f"got {value!r}."
    )


def build_options(name: str, options: dict[str, Any] | None = None) -> Any:
    """The encoding's Options dataclass from registry defaults + user options, type-checked."""
    s = spec(name)
    merged = {**s.defaults, **(options or {})}
    fields = {f.name: f for f in dataclasses.fields(s.cls.Options)}
    unknown = sorted(set(merged) - set(fields))
    if unknown:
        raise UserError(
            f"encoding {name!r} has no option {', '.join(unknown)}; its options are: "
            f"{', '.join(sorted(fields)) or '(none)'}."
        )
    hints = typing.get_type_hints(s.cls.Options)
    return s.cls.Options(**{k: _coerce(name, fields[k], v, hints) for k, v in merged.items()})


def build_encoding(name: str, ctx: EncodingContext, options: dict[str, Any] | None = None) -> PositionalEncoding:
    """Instantiate the encoding registered as ``name`` for a model described by ``ctx``."""
    s = spec(name)
    enc = s.cls(ctx, build_options(name, options))
    enc.registry_name = name
    return enc


def default_options(name: str) -> dict[str, Any]:
    return dataclasses.asdict(build_options(name))
