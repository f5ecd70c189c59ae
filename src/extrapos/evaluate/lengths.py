"""Evaluation lengths: multiples of L_t (whole or fractional) and explicit window lengths in tokens.

A request names its lengths two ways, which may be combined:

* ``lengths``: multiples k of the training length L_t, the papers' "ev = k". Whole multiples are the
  usual 1, 2, 4, ...; a fractional one (the CABLE paper's 0.5 x L_t) is allowed when k x L_t is a whole
  number of at least 2 tokens (a window needs one input and one target beyond the first).
* ``tokens``: windows given in tokens, for lengths the papers state in tokens rather than as multiples
  (the CABLE paper's 15,360 = 15 x 1024).

Both resolve to windows of whole tokens; each evaluated length is labelled in the results by its ``ev``
(window / L_t: an int when whole, as results always recorded it, else a float) and its ``window``.
A window named both ways (``--lengths 2 --tokens 128`` at L_t = 64) is evaluated once.

Multiples are read as the decimals they were written as (``Fraction(repr(k))``), so 0.1 x 10 is
exactly one token and a binary rounding error never makes a valid length look fractional.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from extrapos.errors import UserError

MIN_WINDOW = 2  # tokens: the shortest window that scores a target with any context


@dataclass(frozen=True)
class EvalLength:
    """One evaluated length: ``ev`` = window / L_t (int when whole) and the window in tokens."""

    ev: int | float
    window: int


def ev_value(x: Fraction | float | int) -> int | float:
    """A length as results record it: an int when whole (1, 2, 4 as they always were), else a float."""
    f = x if isinstance(x, Fraction) else Fraction(repr(x)) if isinstance(x, float) else Fraction(x)
    return int(f) if f.denominator == 1 else float(f)


def is_multiple(k: object) -> bool:
    """A positive number (not a bool): what ``lengths`` may hold."""
    return isinstance(k, (int, float)) and not isinstance(k, bool) and k > 0


def is_token_count(n: object) -> bool:
    """A whole number of at least MIN_WINDOW tokens (not a bool): what ``tokens`` may hold."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= MIN_WINDOW


def window_of(k: int | float, L: int) -> int:
    """The window of k x L_t tokens; a UserError naming the nearest valid multiple when it is not a whole
    number of at least MIN_WINDOW tokens."""
    exact = Fraction(repr(k)) * L if isinstance(k, float) else Fraction(k) * L
    if exact.denominator == 1 and exact >= MIN_WINDOW:
        return int(exact)
    nearest = max(MIN_WINDOW, round(exact))
    multiple = Fraction(nearest, L)
    written = repr(float(multiple))
    # a multiple such as 1/3 has no exact decimal: then only --tokens names that window
    fix = (
        f"{written} ({nearest} tokens)"
        if Fraction(written) == multiple
        else f"--tokens {nearest} (no decimal multiple of L_t gives it)"
    )
    raise UserError(
        f"length {k!r} x L_t = {float(exact):g} tokens is not a whole number of at least {MIN_WINDOW} "
        f"tokens (L_t = {L}); the nearest valid length is {fix}."
    )


def resolve_lengths(lengths: Sequence[int | float], tokens: Sequence[int] | None, L: int) -> list[EvalLength]:
    """The lengths of a request at training length ``L``, sorted by window, each window once."""
    by_window: dict[int, EvalLength] = {}
    for k in lengths:
        window = window_of(k, L)
        by_window.setdefault(window, EvalLength(ev_value(k), window))
    for window in tokens or ():
        by_window.setdefault(window, EvalLength(ev_value(Fraction(window, L)), window))
    return [by_window[w] for w in sorted(by_window)]


def check_windows_divide(windows: list[int]) -> None:
    """The documents protocol splits each span of the longest window into whole windows of every length."""
    longest = max(windows)
    if any(longest % w for w in windows):
        bad = [w for w in windows if longest % w]
        raise UserError(
            f"every window must divide the longest ({longest} tokens) so that each span splits into whole "
            f"windows, and {', '.join(map(str, bad))} do not; drop them, choose divisors of {longest}, or "
            "use --protocol stream."
        )
