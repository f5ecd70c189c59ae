"""What `extrapos ruler` shows of a result: the task x length grid of each metric with 95% intervals and the
mean over the tasks per length (RULER's average, Hsieh et al. 2024, §4), the ranking form's copier baselines
beside the model's accuracy, the needle depth x length table (RULER's and the needle-in-a-haystack test's
view of where retrieval fails), and the heatmap."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from extrapos.tasks.common import accuracy_heatmap

#: the depth bins of the per-depth table (fractions of the context before the asked needle)
DEPTH_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
_LABELS = {
    "recall": "string-match recall",
    "exact": "exact match (the answer as trained, nothing extending it)",
    "rank_accuracy": "rank accuracy (ranking form)",
}


def cell_interval(cell: dict[str, Any], metric: str) -> Any:
    """The 95% bootstrap interval of one cell's metric over its examples (``stats.loss_interval`` with the
    example as unit: the resampling the report's task tables use); None when the cell lacks the metric."""
    from extrapos.report import stats

    pair = cell.get("per_example", {}).get(metric)
    return None if pair is None else stats.loss_interval(pair[0], pair[1])


def _describe(result: dict[str, Any], metric: str) -> str:
    req = result["request"]
    kinds = {c["task"]: c.get("recall_kind") for c in result["results"]}
    what = _LABELS.get(metric, metric.replace("_", " "))
    if metric == "recall":
        what += (
            " ('part' for "
            + (", ".join(t for t, k in kinds.items() if k == "part") or "none")
            + ", else 'all')"
        )
    essay = result.get("essay_source", req.get("essay"))
    return (
        f"ruler {req['mode']} ({what}; {req['trials']} examples per cell, template {req['template']}, essay "
        f"{essay}, encoding {result['encoding']}, L_t={result['train_length']}; [a, b] = 95% bootstrap "
        "interval over the examples)"
    )


def format_ruler(result: dict[str, Any], metric: str | None = None) -> str:
    """A markdown grid: one row per task, one column per length, the metric and its 95% interval in each
    cell (rank accuracy: and the copier baselines' beside it, where the result holds them), and the mean over
    tasks per length."""
    metric = metric or result["metric"]
    cells = [c for c in result["results"] if metric in c]
    lengths = sorted({(c["ev"], c["length"]) for c in cells})
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    lines = [
        _describe(result, metric),
        "| task | " + " | ".join(f"{ev}x ({n})" for ev, n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    copied = metric == "rank_accuracy" and any("copiers" in c for c in cells)
    for task in tasks:
        texts = []
        for ev, _ in lengths:
            c = next(c for c in cells if c["task"] == task and c["ev"] == ev)
            iv = cell_interval(c, metric)
            texts.append(
                f"{c[metric]:.2f}"
                + (f" [{iv.low:.2f}, {iv.high:.2f}]" if iv else "")
                + (_copiers(c.get("copiers"), task) if copied else "")
            )
        lines.append(f"| {task} | " + " | ".join(texts) + " |")
    means = [np.mean([c[metric] for c in cells if c["ev"] == ev]) for ev, _ in lengths]
    if copied:
        from extrapos.tasks.ruler_copiers import COPIERS, copier_mean

        at = [[c for c in cells if c["ev"] == ev] for ev, _ in lengths]
        mean_texts = [
            f"{m:.2f}" + _copiers({k: copier_mean(group, k) for k in COPIERS}, "")
            for m, group in zip(means, at)
        ]
    else:
        mean_texts = [f"{m:.2f}" for m in means]
    lines.append("| **mean** | " + " | ".join(mean_texts) + " |")
    if metric == "rank_accuracy" and cells:
        lines.append(f"(chance: {cells[0]['chance']:.2f})")
    if copied:
        lines.append(
            "(copiers r / p / c: the accuracy of three baselines that run no model on the same prompts, the "
            "candidate whose values occur last (recency), first (primacy), most often (counting) in the "
            "prompt, ties drawn; * = the task's own skill, left out of the mean)"
        )
    return "\n".join(lines)


def _copiers(copiers: dict[str, float] | None, task: str) -> str:
    """ " (copiers r / p / c)" of a cell (``ruler_copiers``), "" for a cell without them."""
    from extrapos.tasks.ruler_copiers import COPIERS, SKILL

    if not copiers:
        return ""
    texts = [f"{copiers[k]:.2f}" + ("*" if SKILL.get(task) == k else "") for k in COPIERS]
    return " (copiers " + " / ".join(texts) + ")"


def depth_table(result: dict[str, Any], metric: str) -> list[tuple[str, list[tuple[float, int]]]]:
    """(depth bin label, [(mean, examples) per length]) over the needle tasks' examples, binned by the
    asked needle's depth; the mean is nan where a bin holds no example."""
    depth_key = "rank_depths" if metric == "rank_accuracy" else "depths"
    cells = [c for c in result["results"] if metric in c and c["task"].startswith("niah")]
    evs = sorted({c["ev"] for c in cells})
    rows = []
    for lo, hi in zip(DEPTH_BINS[:-1], DEPTH_BINS[1:]):
        per_length = []
        for ev in evs:
            values = [
                v
                for c in cells
                if c["ev"] == ev
                for v, d in zip(c["per_example"][metric][0], c[depth_key])
                if d is not None and (lo <= d < hi or (hi == 1.0 and d == 1.0))
            ]
            per_length.append((float(np.mean(values)) if values else math.nan, len(values)))
        rows.append((f"{lo:.1f}-{hi:.1f}", per_length))
    return rows


def format_depths(result: dict[str, Any], metric: str | None = None) -> str:
    """The needle depth x length table: the metric over every needle task's examples whose asked needle
    lies in each fifth of the context, with the examples counted, per length."""
    metric = metric or result["metric"]
    cells = [c for c in result["results"] if metric in c and c["task"].startswith("niah")]
    if not cells:
        return ""
    lengths = sorted({(c["ev"], c["length"]) for c in cells})
    lines = [
        f"{_LABELS.get(metric, metric)} by the asked needle's depth (the needle tasks pooled; depth = the "
        "fraction of the context before the needle; (n) = examples):",
        "| depth | " + " | ".join(f"{ev}x ({n})" for ev, n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for label, per_length in depth_table(result, metric):
        texts = ["–" if n == 0 else f"{m:.2f} ({n})" for m, n in per_length]
        lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def format_all(result: dict[str, Any]) -> str:
    """What the console shows after `extrapos ruler`: each metric's grid, then its per-depth table."""
    parts = []
    for metric in result.get("metrics") or [result["metric"]]:
        parts.append(format_ruler(result, metric))
        depths = format_depths(result, metric)
        if depths:
            parts.append(depths)
    return "\n\n".join(parts)


def plot_grid(result: dict[str, Any], path: str | Path, metric: str | None = None) -> Path:
    """Save a task x length heatmap of the metric (matplotlib) to ``path``."""
    metric = metric or result["metric"]
    cells = [c for c in result["results"] if metric in c]
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    lengths = sorted({c["length"] for c in cells})
    grid = np.full((len(tasks), len(lengths)), math.nan)
    for c in cells:
        grid[tasks.index(c["task"]), lengths.index(c["length"])] = c[metric]
    title = f"RULER {_LABELS.get(metric, metric)}: {result['encoding']} (L_t={result['train_length']})"
    return accuracy_heatmap(
        grid, tasks, lengths, train_length=result["train_length"], title=title,
        xlabel="example length (tokens)", ylabel=None, path=path, size=(3, 0.5),
    )  # fmt: skip
