"""The context limit an exported folder records: the longest input the model is meant to be given, not
the length it was trained at.

Tools read a folder's ``max_position_embeddings`` as the model's window: lm-eval's ``hf`` backend cuts
every context there, silently. Written as the training length L_t, it cut an extrapolating model exactly
where it should be measured. So an export records the longest length the run was evaluated at (its
loss evaluations in ``RUN/eval/``, of the exported checkpoint, as the folder computes them: none with
inference-time changes such as ``--scale``), or the length the user gives (``extrapos export
--context N``), and never less than L_t (or L_e for an extended run). The training length is kept as
its own field (``train_length``). A learned table has no row past its last: its length bounds both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.model import ModelConfig


def evaluations(run_path: Path, step: int) -> list[dict[str, Any]]:
    """The loss evaluations (``extrapos eval``, next-token or masked-LM) of checkpoint ``step`` that the
    exported folder reproduces (no inference-time position options), by file name."""
    found = []
    for path in sorted((run_path / "eval").glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):  # a damaged result is the report's to name, not the export's
            continue
        rows = result.get("results") if isinstance(result, dict) else None
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            continue
        if not all(isinstance(r.get("window"), int) and "loss" in r for r in rows):
            continue
        request = result.get("request") or {}
        if result.get("checkpoint_step") != step or result.get("applied") or request.get("position_options"):
            continue
        found.append({**result, "file": path.name})
    return found


def table_rows(cfg: ModelConfig) -> int | None:
    """The rows of a learned position table (its longest input), or None for an encoding without one."""
    from extrapos.positions.absolute import LearnedAbsolute

    plan = cfg.positions_plan()
    if plan.name != "learned":
        return None
    return plan.options_as(LearnedAbsolute.Options).max_length


def supported_context(
    cfg: ModelConfig, trained: int, evaluated: list[dict[str, Any]], given: int | None
) -> tuple[int, str]:
    """The context an export records and why, in words. ``cfg``: the ModelConfig; ``trained``: L_t (L_e
    for an extended run); ``given``: ``--context``."""
    rows = table_rows(cfg)
    if given is not None:
        if given < 1:
            raise UserError(f"--context must be a positive number of tokens, got {given}.")
        if rows is not None and given > rows:
            raise UserError(
                f"--context {given} is past the learned position table's {rows} rows; give at most {rows}."
            )
        return given, "--context"
    longest = max((r["window"] for e in evaluated for r in e["results"]), default=0)
    if longest > trained:
        context, why = longest, "the longest length the run was evaluated at"
    else:
        context, why = trained, "the training length (no longer evaluation of this checkpoint)"
    if rows is not None and context > rows:
        return rows, "the learned position table's rows"
    return context, why
