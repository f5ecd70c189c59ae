"""Plausibility bounds: the range in which a numeric option means something (issue 37, items 6-7).

A value can be finite and of the right type and still mean nothing: YaRN's ``beta_fast = 0`` divides by
zero, ``beta_fast = -1e30`` takes the log of a negative number, ``factor = 1e30`` or ``base = 1e308``
give finite but meaningless losses. Each encoding's ``Options`` (``positions/``) declares ``BOUNDS``, one
``Bound`` per numeric option, and rules between options in ``check``; ``CheckedOptions.__post_init__``
enforces both whenever an Options is built (the library, the CLI and ``set_options`` alike), raising a
``BoundError`` that ``schema.build`` rephrases with where the option was given. docs/robustness.md holds
the table (a test keeps it equal to the declared bounds).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from extrapos.errors import UserError


class BoundError(UserError):
    """An option outside its plausible range: ``key``, the ``rule`` it breaks (a phrase after "must be")
    and the ``value``."""

    def __init__(self, key: str, rule: str, value: Any):
        self.key, self.rule, self.value = key, rule, value
        super().__init__(f"option {key} must be {rule}, got {value!r}.")


def _text(x: float) -> str:
    """1e10 for a large power of ten, 16777216 for another whole number, 0.5 otherwise."""
    if x >= 1e8 and 10 ** round(math.log10(x)) == x:
        return f"1e{round(math.log10(x))}"
    return str(int(x)) if x == int(x) and abs(x) < 1e12 else f"{x:g}"


@dataclass(frozen=True)
class Bound:
    """``low`` <= value <= ``high`` (either side open: strict); None: unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # appended to the rule: what a value outside it does

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    @property
    def rule(self) -> str:
        """'within [2, 1e10]', 'within (0, 1]', 'at least 1', 'greater than 0', then ``why``."""
        return self.range + (f" ({self.why})" if self.why else "")

    @property
    def range(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"within {left}{_text(self.low)}, {_text(self.high)}{right}"
        if self.low is not None:
            return f"{'greater than' if self.low_open else 'at least'} {_text(self.low)}"
        if self.high is not None:
            return f"{'less than' if self.high_open else 'at most'} {_text(self.high)}"
        return "a finite number"


#: the longest position an option may name: positions are exact in fp32 up to 2**24 (base.float_positions)
MAX_POSITION = 2**24


#: why a frequency base is bounded (Vaswani et al. 2017; Su et al. 2021): base^(-2i/d) is infinite at 0 and
#: NaN-making at or below 1, and past 1e10 the slowest frequencies never turn within any context
BASE_WHY = "greater than 1 at the very least, or base^(-2i/d) blows up; past 1e10 nothing turns"


_CHOICES: dict[type, dict[str, tuple[Any, ...]]] = {}  # per Options class: its hints are read once


def choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The fields of an Options dataclass annotated ``Literal[...]`` (or ``Literal[...] | None``) and
    their allowed values: a string option (RoPE's ``scaling``, Kerple's ``form``) is then refused when the
    Options is built, as a number outside its bound is, and not when the module is (after a sweep has
    trained its other rows)."""
    if cls not in _CHOICES:
        out = {}
        for key, hint in typing.get_type_hints(cls).items():
            args = typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal else (hint,)
            literal = [a for a in (args or (hint,)) if typing.get_origin(a) is typing.Literal]
            if literal:
                out[key] = typing.get_args(literal[0])
        _CHOICES[cls] = out
    return _CHOICES[cls]


class CheckedOptions:
    """An encoding's Options that check themselves on construction: every numeric field named in
    ``BOUNDS`` (None, an unset optional, is left to its default) and the rules of ``check``."""

    BOUNDS: ClassVar[dict[str, Bound]] = {}
    # every subclass is a dataclass: declared so the type checker takes any CheckedOptions to
    # dataclasses.fields / replace / asdict
    __dataclass_fields__: ClassVar[dict[str, Any]]

    def __post_init__(self) -> None:
        for key, bound in self.BOUNDS.items():
            value = getattr(self, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not bound.holds(value):
                raise BoundError(key, bound.rule, value)
        for key, allowed in choices(type(self)).items():
            value = getattr(self, key)
            if value is not None and value not in allowed:
                raise BoundError(key, "one of " + ", ".join(repr(c) for c in allowed), value)
        self.check()

    def check(self) -> None:
        """Rules between options (raise ``BoundError`` naming the option to change)."""
