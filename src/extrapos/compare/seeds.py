"""Results over seeds and over an extension's evaluations: one result per row, the mean with the seeds'
spread."""

from __future__ import annotations

import math
import statistics
from typing import Any


def combine_seeds(results: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """One row from its per-seed results: every number the mean over seeds (perplexity = exp of the mean
    loss); the per-seed results are kept whole under ``seeds`` for the intervals (the per-document fields
    live there only). Works for next-token and MLM results alike (their rows' numbers differ)."""
    combined = {k: v for k, v in results[0].items() if k not in ("results", "per_position", "wall_time")}
    combined["run"] = [r["run"] for r in results]
    combined["seed_values"] = list(seeds)
    counted = ("ev", "window", "windows", "tokens", "masked_tokens", "targets")  # equal across seeds
    rows = []
    for i, first in enumerate(results[0]["results"]):
        same = [r["results"][i] for r in results]
        assert all(x["ev"] == first["ev"] for x in same)  # every seed evaluated the same lengths
        row: dict[str, Any] = {}
        for key, value in first.items():
            if key.startswith("doc_"):
                continue
            values = [x.get(key) for x in same]
            if key in counted:
                row[key] = value
            elif key == "ppl":
                row[key] = math.exp(statistics.fmean(x["loss"] for x in same))
            else:
                row[key] = statistics.fmean(values) if None not in values else None
        rows.append(row)
    combined["results"] = rows
    curves = [r["per_position"] for r in results]
    if all(curves):
        combined["per_position"] = {
            **curves[0],
            "loss": [None if None in v else statistics.fmean(v) for v in zip(*(c["loss"] for c in curves))],
        }
    else:
        combined["per_position"] = None
    combined["wall_time"] = sum(r["wall_time"] for r in results)
    combined["seeds"] = results
    return combined


def merge_length_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Evaluations of one length each, as one result with a column per length (the last's per-position
    curve)."""
    merged = dict(results[-1])
    merged["results"] = [r for res in results for r in res["results"]]
    merged["parts"] = [
        {
            "run": res["run"],
            "name": res["name"],
            "ev": [r["ev"] for r in res["results"]],
            "target_tokens": res["target_tokens"],
            "documents_used": res["documents_used"],
        }
        for res in results
    ]
    merged["wall_time"] = sum(res["wall_time"] for res in results)
    return merged
