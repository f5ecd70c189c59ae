"""The options an evaluation sets per window (value ``"window"``: the CLI's ``--interpolate``).

A learned table is stretched to a window only when the window is longer than the table: a parent's
table has L_t rows, so its ev=1 window is read as trained and every longer one interpolated (Karypis et
al. §3.2, per evaluated L_e); an extended child's table already has L_e rows, so up to L_e it is read
as trained and only longer windows are interpolated. One flag set therefore evaluates a parent and
its extension alike (issue 40); before, the child's ev=2 window asked for a table shorter than its own.
"""

from __future__ import annotations

from typing import Any


def per_window_options(pos: Any, names: set[str], window: int, train_length: int) -> dict[str, Any]:
    """``{name: window}`` when ``window`` is longer than what the encoding holds (L_t, or a learned
    table's rows), else ``{name: None}`` (the option unset)."""
    held = max(train_length, int(getattr(pos, "length", 0) or 0))
    return {name: (window if window > held else None) for name in names}
