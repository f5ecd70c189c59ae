"""The segmented-sequences paper's Figure 3 for any set of runs: how evenly the queries past L_t spread
their attention, before and after an extension (Karypis et al., "Extending Input Contexts of Language
Models through Training on Segmented Sequences", §6 and Figure 3).

The paper histograms the median attention weight of the positions past the original training length,
before and after segmented training, and reads a larger, more even median as the model attending to
more of the far context. Here each run's `extrapos attention` result (read with the same ``base_length``,
so "past L_t" means past the parent's training length for every run) gives, per length:

* the histogram over every query past L_t, layer and head of ``n x median_j p_ij`` (the lower median of
  the query's n visible weights, times n: 1 when its weights are even, near 0 when a few keys hold the
  mass; the n makes lengths comparable), drawn as densities, one panel per length;
* the mean of that statistic with its 95% interval over the held-out documents, and each run minus the
  first (the parent) paired over the same documents, as ``report/stats.py`` does for the loss.

Both intervals cover the held-out documents of these trained models, not training noise (one seed).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from extrapos.errors import UserError
from extrapos.files import ABANDONED_SECONDS, atomic_write, save_png, sweep_temporaries_of

logger = logging.getLogger(__name__)

STAT = "median_weight"


def _rows(result: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {row["ev"]: row for row in result["results"]}


def document_sums(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(sums, counts) per document of the median weight past L_t over every layer and head, or None."""
    parts = [layer["beyond"] for layer in row.get("per_document") or []]
    if not parts or any(part is None for part in parts):
        return None
    sums = sum(np.asarray(part[STAT]).sum(1) for part in parts)
    counts = sum(np.asarray(part["queries"]) * np.asarray(part[STAT]).shape[1] for part in parts)
    return np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)


def _histogram(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(edges, counts over every layer and head) of the median weight past L_t, or None (none past L_t, or
    a result saved before the histogram was recorded)."""
    hist = row.get("median_weight_histogram")
    if not hist:
        return None
    return np.asarray(hist["edges"]), np.asarray(hist["counts"], dtype=np.float64).sum(axis=(0, 1))


def check_comparable(results: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The lengths every result has queries past L_t at; refuses results of other base lengths or held-out
    data (their "past L_t" or their documents would differ)."""
    if len(results) < 1:
        raise UserError("the figure needs at least one attention result.")
    first = results[0][1]
    for label, result in results[1:]:
        if result["train_length"] != first["train_length"]:
            raise UserError(
                f"{label} was read with L_t = {result['train_length']} and {results[0][0]} with "
                f"{first['train_length']}; pass the same --base-length (the parent's L_t) for every run."
            )
    evs = [ev for ev in _rows(first) if all(_histogram(_rows(r).get(ev) or {}) for _, r in results)]
    if not evs:
        raise UserError(
            "no length has queries past L_t in every result (and a recorded histogram); read lengths above "
            "1 x the parent's L_t (e.g. --lengths 1,2,4 --base-length L_t), re-reading older results with "
            "--overwrite."
        )
    return evs


def summary_table(results: list[tuple[str, dict[str, Any]]], evs: list[Any]) -> str:
    """Markdown: per run and length, the mean median weight x n past L_t [95% interval over documents], and
    the run minus the first run paired over the same documents."""
    from extrapos.report import stats

    base_label = results[0][0]
    head = " | ".join(f"ev={ev}" for ev in evs)
    diff_head = " | ".join(f"ev={ev}: - {base_label} (paired)" for ev in evs)
    lines = [f"| run | {head} | {diff_head} |", "|---|" + "---:|" * (2 * len(evs))]
    for label, result in results:
        cells, diffs = [], []
        for ev in evs:
            row, base = _rows(result)[ev], _rows(results[0][1])[ev]
            mine, ref = document_sums(row), document_sums(base)
            n = len(row.get("doc_index") or [])
            if mine is None or n < stats.MIN_DOCUMENTS:
                cells.append("–")
            else:
                iv = stats.loss_interval(*mine)
                cells.append(f"{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}]")
            if result is results[0][1]:
                diffs.append("baseline")
            elif mine is None or ref is None or n < stats.MIN_DOCUMENTS:
                diffs.append(f"– (too few documents: {n})")
            elif row["doc_index"] != base["doc_index"] or not np.array_equal(mine[1], ref[1]):
                diffs.append("– (other documents)")
            else:
                d = stats.paired_difference(mine[0], mine[1], ref[0], ref[1])
                text = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                diffs.append(text + (" within noise" if d.contains(0.0) else ""))
        lines.append(f"| {label} | " + " | ".join(cells + diffs) + " |")
    return "\n".join(lines)


def plot(results: list[tuple[str, dict[str, Any]]], evs: list[Any], path: Path) -> Path | None:
    """One panel per length: the density of median weight x n over the queries past L_t (every layer and
    head) of each run, its mean marked; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info(
            "attention: matplotlib is not installed, skipping the figure (pip install 'extrapos[plots]')."
        )
        return None
    fig, axes = plt.subplots(1, len(evs), figsize=(5.5 * len(evs), 4.2), squeeze=False)
    for ax, ev in zip(axes[0], evs):
        for i, (label, result) in enumerate(results):
            edges, counts = _histogram(_rows(result)[ev])  # type: ignore[misc]
            density = counts / (counts.sum() * np.diff(edges))
            colour = f"C{i}"
            ax.stairs(density, edges, label=label, color=colour, linewidth=1.6)
            centres = (edges[:-1] + edges[1:]) / 2
            mean = float((centres * counts).sum() / counts.sum())
            ax.axvline(mean, color=colour, linestyle=":", linewidth=1)
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
        histograms = [h for h in (_histogram(_rows(r)[ev]) for _, r in results) if h is not None]
        occupied = [edges[np.flatnonzero(counts)[-1] + 1] for edges, counts in histograms if counts.any()]
        ax.set_xlim(0, max([1.1, *occupied]))  # the bins up to 2 are mostly empty: show where queries lie
        ax.set_title(f"queries past L_t at ev={ev}", fontsize=10)
        ax.set_xlabel("median attention weight x visible keys (1 = even)")
        ax.set_ylabel("density (queries x layers x heads)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    L = results[0][1]["train_length"]
    fig.suptitle(f"Median attention weight past L_t = {L} (dotted: means; dashed: even weights)", fontsize=10)
    fig.tight_layout()
    try:
        save_png(fig, path, dpi=110)  # whole or not at all, an abandoned temporary of it swept
    finally:
        plt.close(fig)
    return path


def write_figure(results: list[tuple[str, dict[str, Any]]], out_dir: Path) -> tuple[Path, Path | None]:
    """``out_dir/median-weight.md`` (the table, what it reads) and ``median-weight.png``; returns both."""
    evs = check_comparable(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot(results, evs, out_dir / "median-weight.png")
    L = results[0][1]["train_length"]
    runs = "\n".join(
        f"- {label}: `{r['run']}`, {r['encoding']}, checkpoint step {r['checkpoint_step']}, "
        f"{r['documents_used']} documents"
        for label, r in results
    )
    text = "\n".join(
        [
            f"# Median attention weight past L_t = {L} (the segmented-sequences paper's Figure 3)",
            "",
            runs,
            "",
            "Mean over the queries past L_t, every layer and head, of n x the median of a query's n visible "
            "attention weights (1 = even weights, near 0 = a few keys hold the mass) [95% interval over the "
            'held-out documents], and each run minus the first, paired over the same documents ("within '
            'noise" when the interval contains 0). One trained model per row: the intervals cover the '
            "documents, not training noise.",
            "",
            summary_table(results, evs),
            "",
            "![median weight](median-weight.png)" if png else "(no plot: matplotlib is not installed)",
            "",
        ]
    )
    md = out_dir / "median-weight.md"
    # what a killed figure left before its rename: no lock guards the folder, so only once abandoned
    sweep_temporaries_of(md, older_than=ABANDONED_SECONDS)
    atomic_write(md, text.encode())
    return md, png
