"""Name -> positional-encoding class, like Hugging Face's ROPE_INIT_FUNCTIONS.

Adding an encoding is one new file in ``positions/`` with a class and a ``register(...)`` call:
every module of this package is imported (pkgutil) the first time the registry is read. One class
may be registered under several names with different default options (``cable-nw`` is CABLE with
``weighted = False``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

from extrapos.bounds import CheckedOptions
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, PositionalEncoding
from extrapos.schema import build as build_checked

# modules of this package that define no encoding (schedule.py combines them per layer)
_NOT_ENCODINGS = {"base", "registry", "schedule"}


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


def encoding_modules() -> list[str]:
    """Every module of ``extrapos.positions`` that may register encodings, in file-name order."""
    import extrapos.positions as package

    return [
        f"{package.__name__}.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if m.name not in _NOT_ENCODINGS and not m.name.startswith("_")
    ]


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in encoding_modules():
            importlib.import_module(module)
        from extrapos.plugins import load_encodings

        load_encodings()  # other packages' encodings (plugins.py), after every built-in name is taken


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def spec(name: str) -> EncodingSpec:
    _load()
    if not isinstance(name, str) or name not in _REGISTRY:  # a list or table as the name is unknown too
        raise UserError(f"unknown positional encoding {name!r}; choose one of: {', '.join(_REGISTRY)}.")
    return _REGISTRY[name]


def _shown(key: Any) -> str:
    """An option's name as given: bare when it is a plain printable word, else quoted (a name holding a
    line break or a space would break the sentence)."""
    text = str(key)
    return text if text.isprintable() and text and not any(c.isspace() for c in text) else repr(text)


def build_options(
    name: str, options: dict[str, Any] | None = None, table: str = "model.positions"
) -> CheckedOptions:
    """The encoding's Options dataclass from registry defaults + user options, type-checked and within
    their plausible bounds (``bounds.py``); an error names the option as ``table.KEY``."""
    s = spec(name)
    merged = {**s.defaults, **(options or {})}
    fields = {f.name: f for f in dataclasses.fields(s.cls.Options)}
    unknown = sorted(map(_shown, set(merged) - set(fields)))
    if unknown:
        raise UserError(
            f"encoding {name!r} has no option {', '.join(unknown)}; its options are: "
            f"{', '.join(sorted(fields)) or '(none)'}."
        )
    built: CheckedOptions = build_checked(
        s.cls.Options, merged, where=f"{table}.{{key}} (an option of encoding {name!r})"
    )
    return built


def build_encoding(
    name: str, ctx: EncodingContext, options: dict[str, Any] | CheckedOptions | None = None
) -> PositionalEncoding:
    """Instantiate the encoding registered as ``name`` for a model described by ``ctx``, from a table of
    options (checked here) or from its ``Options`` already built (``build_options``; a model's plan)."""
    s = spec(name)
    built: CheckedOptions
    if isinstance(options, CheckedOptions):
        if not isinstance(options, s.cls.Options):
            raise TypeError(
                f"encoding {name!r} takes {s.cls.Options.__qualname__}, not {type(options).__qualname__}"
            )
        built = options
    else:
        built = build_options(name, options)
    enc = s.cls(ctx, built)
    enc.registry_name = name
    return enc


def default_options(name: str) -> dict[str, Any]:
    return dataclasses.asdict(build_options(name))
