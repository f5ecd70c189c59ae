"""The one validator: typed dataclasses built from TOML-like dicts, with errors that name the key.

Run configs (``[model]``, ``[data]``, ``[train]``), encoding options and comparison sweeps are all
dataclasses; ``build`` checks each value against its annotation and refuses unknown keys, so every
file a user writes is checked the same way. TOML gives ints where floats are meant: an int is
accepted for a float field and converted.

Every number is bounded here, once for all keys: an int must fit in 64 bits (torch, numpy and the
checkpoint's JSON hold counts, lengths and seeds as int64; ``10**30`` would overflow deep inside a
command), a float must be finite (NaN or infinity in any option turns a loss into NaN or a loop into one
that never ends), a string must be UTF-8 text (it is written into config.toml and results).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from extrapos.bounds import BoundError
from extrapos.errors import UserError

# The largest magnitude of an int value: what an int64 holds.
INT_LIMIT = 2**63


def _type_name(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union or isinstance(hint, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if typing.get_origin(hint) is list:
        return f"a list of {_type_name(args[0]) if args else 'values'}"
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    return getattr(hint, "__name__", str(hint))


def check(hint: Any, value: Any, where: str) -> Any:  # noqa: C901 (one branch per annotation kind, in one place)
    """``value`` checked against the annotation ``hint`` (ints widened to floats); a UserError names
    ``where``."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or isinstance(hint, types.UnionType):
        allowed = typing.get_args(hint)
        if value is None and type(None) in allowed:
            return None
        specific: UserError | None = None
        for t in allowed:
            if t is type(None):
                continue
            try:
                return check(t, value, where)
            except UserError as e:
                # a value of the member's own kind that it refuses (nan for a float | None) keeps that
                # member's reason ("must be a finite number"), not the union's "must be float"
                if specific is None and _same_kind(t, value):
                    specific = e
                continue
        if specific is not None:
            raise specific
    elif origin is typing.Literal:  # a choice (RoPE's scaling, Kerple's form): refused here, before any work
        if any(value == choice and type(value) is type(choice) for choice in typing.get_args(hint)):
            return value
    elif hint is Any:  # a free value (an encoding's factor list): its numbers and strings bounded too
        _check_free(value, where)
        return value
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) >= INT_LIMIT:
                raise UserError(f"{where} must be an integer of at most 64 bits (below 2^63), got {value}.")
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an int beyond the float range (10**400)
                number = math.inf
            if not math.isfinite(number):
                raise UserError(f"{where} must be a finite number, got {value!r}.")
            return number
    elif hint is str:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
                raise UserError(
                    f"{where} must be UTF-8 text (it holds bytes that are not), got {value!r}."
                ) from None
            return value
    elif origin is list:
        if isinstance(value, (list, tuple)):
            (item,) = typing.get_args(hint) or (Any,)
            return [check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            return dict(value)
    else:  # a field type this validator does not know: accepted as it is
        return value
    raise UserError(f"{where} must be {_type_name(hint)}, got {value!r}.")


def _same_kind(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of the plain kind ``hint`` names (a number for int or float, text for str)."""
    if isinstance(value, bool):
        return hint is bool
    if hint in (int, float):
        return isinstance(value, (int, float))
    return hint is str and isinstance(value, str)


def _check_free(value: Any, where: str) -> None:
    """The bounds of ``check`` applied to every number and string inside a value of any type."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        check(int, value, where)
    elif isinstance(value, float):
        check(float, value, where)
    elif isinstance(value, str):
        check(str, value, where)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_free(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_free(item, f"{where}.{key}")


def one_line(key: Any) -> str:
    """A name the user wrote, as it may stand inside a sentence: itself when printable, else with its line
    breaks, control characters and lone surrogates escaped (``'a\\nb'``), so the sentence stays one line."""
    text = str(key)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def build(cls: type, values: dict[str, Any], where: str, unknown: str | None = None) -> Any:
    """An instance of the dataclass ``cls`` from ``values``, every value type-checked.

    ``where(key)`` phrases: ``where`` is formatted with ``{key}`` for each field (e.g.
    ``"config key 'train.{key}'"``); ``unknown`` is the sentence for a key the dataclass does not
    have (formatted with ``{key}`` and ``{keys}``, the sorted field names).
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            template = unknown or "unknown key {key!r}; the keys are: {keys}."
            raise UserError(template.format(key=one_line(key), keys=", ".join(sorted(fields)) or "(none)"))
        kwargs[key] = check(hints[key], value, where.format(key=key))
    try:
        return cls(**kwargs)
    except BoundError as e:  # outside the option's plausible range (an Options checks itself)
        raise UserError(f"{where.format(key=e.key)} must be {e.rule}, got {e.value!r}.") from None
    except TypeError:  # a required field is missing
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in kwargs
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise UserError(f"{where.format(key=missing[0])} is required.") from None
        raise
