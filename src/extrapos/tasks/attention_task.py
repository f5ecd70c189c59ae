"""The attention-diagnostics column defined in one place (``tasks/task.py``): statistics of the attention
averaged over every layer and head per length (the reading of attention the segmented-sequences paper uses to
explain extrapolation, Karypis et al., Figure 3), with intervals over the held-out documents. Its scoring is
``evaluate/attention_stats.py``'s ``AttentionEvaluator``; its command is `extrapos attention`
(``cli/attention.py``), which also writes the per-layer and per-head figures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from extrapos.errors import UserError
from extrapos.tasks.task import Task, option


@dataclass
class AttentionColumns:
    """A sweep's ``attention = {...}`` (``extrapos attention``, docs/attention-diagnostics.md) on the held-out
    windows of each length: ``statistics`` averaged over every query, layer and head, with intervals over the
    documents; the per-layer and per-head values are in each row's JSON."""

    statistics: list[str] = option(
        factory=lambda: ["mean_distance", "entropy"], help="the statistics the report shows"
    )
    max_tokens: int = option(16_384, help="tokens read per length, as `extrapos attention --max-tokens`")
    split: str = option("test", help="the held-out split read")

    def keyed(self) -> dict[str, Any]:
        """What the result depends on (the statistics shown are read from it, so they change no name)."""
        return {"max_tokens": self.max_tokens, "split": self.split}


class AttentionTask(Task):
    name: ClassVar[str] = "attention"
    evaluator: ClassVar[str] = "extrapos.evaluate.attention_stats:AttentionEvaluator"
    columns: ClassVar[type] = AttentionColumns
    plots: ClassVar[bool] = False  # its figures are `extrapos attention`'s own

    def check_columns(self, spec: Any) -> None:
        from extrapos.evaluate.attention_stats import STATISTICS

        s = spec.statistics
        if not s or len(set(s)) != len(s) or set(s) - set(STATISTICS):
            raise UserError(f"statistics must list distinct names from {', '.join(STATISTICS)}, got {s}")
        if spec.max_tokens < 1:
            raise UserError(f"max_tokens must be a positive number of tokens, got {spec.max_tokens}")
        if spec.split not in ("train", "val", "test"):
            raise UserError(f"split must be train, val or test, got {spec.split!r}")

    # ---- the report ----------------------------------------------------------------------------------

    def describe(self, rows: Sequence[Any]) -> str:
        first = next(row.tasks[self.name] for row in rows if self.name in row.tasks)
        req = first.get("request", {})
        return (
            f"Attention diagnostics (`extrapos attention`, docs/attention-diagnostics.md) on the held-out "
            f"windows of each length ({req.get('max_tokens', '?')} tokens per length, split "
            f"{req.get('split', '?')}): each statistic averaged over every query, layer and head; [a, b] = "
            "95% interval from a bootstrap over the held-out documents (seeds crossed when the row has "
            "several). Neither direction is better; the per-layer and per-head values are in each row's "
            "JSON under tasks/attention/."
        )

    def tables(self, rows: Sequence[Any], baseline: str | None) -> list[str]:
        parts: list[str] = []
        for stat in attention_statistics(rows):
            label = ATTENTION_LABELS.get(stat, stat)
            parts += [f"{label[0].upper() + label[1:]}:", "", attention_table(rows, stat), ""]
        return parts

    def csv_rows(self, row_name: str, result: dict[str, Any]) -> list[list[Any]]:
        lines = []
        for r in result["results"]:
            for stat in attention_statistics([_Scored(result)]):
                value = attention_value(r, stat)
                if value is not None:
                    lines.append(
                        [row_name, self.name, r["ev"], r.get("window", ""), "", stat, f"{value:.6f}"]
                    )
        return lines

    def plot(self, rows: Sequence[Any], out_dir: Path, plt: Any) -> Path:
        raise NotImplementedError("attention columns draw no length plot (plots = False)")


class _Scored:
    """One result as a row holding it (what ``attention_statistics`` reads)."""

    def __init__(self, result: dict[str, Any]):
        self.tasks = {"attention": result}


#: the attention statistics a sweep shows by default: how far the heads look and how spread they are
ATTENTION_DEFAULT = ("mean_distance", "entropy")
ATTENTION_LABELS = {
    "entropy": "entropy (nats)",
    "entropy_norm": "entropy / log n",
    "sink1": "mass on first 1",
    "sink4": "mass on first 4",
    "mean_distance": "mean attended distance (tokens)",
    "median_distance": "median attended distance (tokens)",
    "median_weight": "median weight x n",
}


def attention_value(row: dict[str, Any], stat: str) -> float | None:
    """One length's ``stat``, the mean over every layer and head (the heads' means as the JSON holds
    them); None when no head has it."""
    values = [v for layer in row["layers"] for v in layer[stat] if v is not None]
    return statistics.fmean(values) if values else None


def _attention_sums(row: dict[str, Any], stat: str) -> tuple[Any, Any] | None:
    """Per held-out document, the sum of ``stat`` over every query of every layer and head and the number
    of those (query, head) pairs, as ``attention_stats.statistic_interval`` resamples them; None when the
    row recorded no per-document sums."""
    import numpy as np

    parts = [layer["every"] for layer in row.get("per_document") or []]
    if not parts or any(part is None for part in parts):
        return None
    sums = sum(np.asarray(part[stat]).sum(1) for part in parts)
    if stat == "entropy_norm":
        counts = sum(np.asarray(part["queries_norm"]).sum(1) for part in parts)
    else:  # every head of every layer reads the same queries
        counts = sum(np.asarray(part["queries"]) * np.asarray(part[stat]).shape[1] for part in parts)
    return np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)


def attention_interval(result: dict[str, Any], ev: float, stat: str) -> Any:
    """The 95% interval of one length's ``stat`` (over every layer and head) from a bootstrap over the
    held-out documents, seeds crossed when the row has several (``stats.loss_interval``); None with too
    few documents or without per-document sums."""
    import numpy as np

    from extrapos.report import stats

    sums, counts = [], []
    for one in result.get("seeds") or [result]:
        row = next((r for r in one["results"] if r["ev"] == ev), None)
        got = None if row is None else _attention_sums(row, stat)
        if row is None or got is None or len(row["doc_index"]) < stats.MIN_DOCUMENTS:
            return None
        sums.append(got[0])
        counts.append(got[1])
    if len({len(s) for s in sums}) != 1:
        return None
    return stats.loss_interval(np.stack(sums), np.stack(counts))


def _attention_number(stat: str, value: float) -> str:
    return f"{value:.1f}" if "distance" in stat else f"{value:.3f}"


def attention_statistics(rows: Sequence[Any]) -> list[str]:
    """The statistics the report shows: those the sweep asked for (``attention.statistics``)."""
    first = next(row.tasks["attention"] for row in rows if "attention" in row.tasks)
    return list(first.get("report_statistics") or ATTENTION_DEFAULT)


def attention_table(rows: Sequence[Any], stat: str) -> str:
    """Rows x ev: ``stat`` over every layer and head, with its interval where the row has one."""
    scored = [row for row in rows if "attention" in row.tasks]
    cols = sorted({r["ev"] for row in scored for r in row.tasks["attention"]["results"]})
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in scored:
        result = row.tasks["attention"]
        by_ev = {r["ev"]: r for r in result["results"]}
        texts = []
        for ev in cols:
            value = attention_value(by_ev[ev], stat) if ev in by_ev else None
            if value is None:
                texts.append("–")
                continue
            iv = attention_interval(result, ev, stat)
            interval = (
                f" [{_attention_number(stat, iv.low)}, {_attention_number(stat, iv.high)}]" if iv else ""
            )
            texts.append(_attention_number(stat, value) + interval)
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines)
