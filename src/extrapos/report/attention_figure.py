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

With one run per label, both intervals cover the held-out documents of these trained models, not training
noise (one seed). Runs that share a label are the seeds of one row (the k-th run of every label is seed
k): the table then gives per row the mean over its S seeds, each row minus the first paired per seed
(seed k's run minus the first row's seed k, over the same documents) with Student's t 95% interval over
the seeds (``stats.t_interval``), which covers training noise; each seed's document intervals beside it;
and per layer and head at the longest length the row minus the first, averaged over the seeds, with how
many seeds share its sign. The plot pools a row's seeds into one density.
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


def seed_groups(labels: list[str]) -> tuple[list[str], int]:
    """The rows (each label once, in the order first given) and the seeds S of each: runs that share a label
    are the seeds of one row, so every label must come the same number of times."""
    rows = list(dict.fromkeys(labels))
    times = {label: labels.count(label) for label in rows}
    if len(set(times.values())) > 1:
        given = ", ".join(f"{label!r} {n} times" for label, n in times.items())
        raise UserError(
            f"the labels name their runs unevenly ({given}): runs that share a label are the seeds of one "
            "row, so give every label once per seed (in --labels), the seeds in the same order for each."
        )
    return rows, times[rows[0]] if rows else 0


def grouped(results: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(label, its runs in the order given: seed 1, 2, ...) per row, the rows in the order first given."""
    rows, _ = seed_groups([label for label, _ in results])
    return [(label, [r for name, r in results if name == label]) for label in rows]


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


def _header(first: str, evs: list[Any], minus: str) -> list[str]:
    """A table's header lines: ``first``, the value at each length, then each length's difference
    (``minus``: what it subtracts, e.g. "- parent (paired)")."""
    head = " | ".join(f"ev={ev}" for ev in evs)
    diff_head = " | ".join(f"ev={ev}: {minus}" for ev in evs)
    return [f"| {first} | {head} | {diff_head} |", "|---|" + "---:|" * (2 * len(evs))]


def summary_table(results: list[tuple[str, dict[str, Any]]], evs: list[Any]) -> str:
    """Markdown: per run and length, the mean median weight x n past L_t [95% interval over documents], and
    the run minus the first run paired over the same documents."""
    from extrapos.report import stats

    base_label = results[0][0]
    lines = _header("run", evs, f"- {base_label} (paired)")
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


def _pooled(runs: list[dict[str, Any]], ev: Any) -> tuple[np.ndarray, np.ndarray]:
    """(edges, counts) of the median weight past L_t at ``ev`` over every layer, head and seed of a row."""
    # check_comparable kept the lengths where every run has a histogram
    hists = [h for h in (_histogram(_rows(r)[ev]) for r in runs) if h is not None]
    return hists[0][0], np.sum([counts for _, counts in hists], axis=0)


def plot(groups: list[tuple[str, list[dict[str, Any]]]], evs: list[Any], path: Path) -> Path | None:
    """One panel per length: the density of median weight x n over the queries past L_t (every layer and
    head, every seed of a row pooled) of each row, its mean marked; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info(
            "attention: matplotlib is not installed, skipping the figure (pip install 'extrapos[plots]')."
        )
        return None
    seeds = len(groups[0][1])
    fig, axes = plt.subplots(1, len(evs), figsize=(5.5 * len(evs), 4.2), squeeze=False)
    for ax, ev in zip(axes[0], evs):
        histograms = [_pooled(runs, ev) for _, runs in groups]
        for i, ((label, _), (edges, counts)) in enumerate(zip(groups, histograms)):
            density = counts / (counts.sum() * np.diff(edges))
            colour = f"C{i}"
            name = label if seeds == 1 else f"{label} ({seeds} seeds pooled)"
            ax.stairs(density, edges, label=name, color=colour, linewidth=1.6)
            centres = (edges[:-1] + edges[1:]) / 2
            mean = float((centres * counts).sum() / counts.sum())
            ax.axvline(mean, color=colour, linestyle=":", linewidth=1)
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
        occupied = [edges[np.flatnonzero(counts)[-1] + 1] for edges, counts in histograms if counts.any()]
        ax.set_xlim(0, max([1.1, *occupied]))  # the bins up to 2 are mostly empty: show where queries lie
        ax.set_title(f"queries past L_t at ev={ev}", fontsize=10)
        ax.set_xlabel("median attention weight x visible keys (1 = even)")
        ax.set_ylabel("density (queries x layers x heads)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    L = groups[0][1][0]["train_length"]
    fig.suptitle(f"Median attention weight past L_t = {L} (dotted: means; dashed: even weights)", fontsize=10)
    fig.tight_layout()
    try:
        save_png(fig, path, dpi=110)  # whole or not at all, an abandoned temporary of it swept
    finally:
        plt.close(fig)
    return path


def _mean(sums: tuple[np.ndarray, np.ndarray]) -> float:
    """The mean median weight of (sums, counts): over every document, query, layer and head."""
    return float(sums[0].sum() / sums[1].sum())


def _paired(row: dict[str, Any], base: dict[str, Any]) -> tuple[Any, Any] | str:
    """(the run's, the baseline's) document sums when they read the same documents; else why not."""
    mine, ref = document_sums(row), document_sums(base)
    if mine is None or ref is None:
        return "no queries past L_t"
    if row["doc_index"] != base["doc_index"] or not np.array_equal(mine[1], ref[1]):
        return "other documents"
    return mine, ref


def _t_cell(values: list[float], signed: bool) -> str:
    """The mean of per-seed values [Student's t 95% over the seeds]; "within noise" on a signed cell whose
    interval holds 0."""
    from extrapos.report import stats

    fmt = "{:+.3f}" if signed else "{:.3f}"
    mean = float(np.mean(values))
    iv = stats.t_interval(values)
    if iv is None:
        return fmt.format(mean) + f" (no t interval for {len(values)} seeds)"
    text = f"{fmt.format(mean)} [{fmt.format(iv[0])}, {fmt.format(iv[1])}]"
    return text + (" within noise" if signed and iv[0] <= 0.0 <= iv[1] else "")


def seeds_table(groups: list[tuple[str, list[dict[str, Any]]]], evs: list[Any]) -> str:
    """Markdown: per row and length, the mean over its seeds of the mean median weight x n past L_t, and the
    row minus the first row paired per seed (seed k's run minus the first row's seed k, over the same
    documents), each with Student's t 95% interval over the seeds."""
    base_label, base_runs = groups[0]
    lines = _header("row", evs, f"- {base_label} (paired per seed)")
    for label, runs in groups:
        cells, diffs = [], []
        for ev in evs:
            sums = [x for x in (document_sums(_rows(r)[ev]) for r in runs) if x is not None]
            cells.append("–" if len(sums) < len(runs) else _t_cell([_mean(x) for x in sums], False))
            if runs is base_runs:
                diffs.append("baseline")
                continue
            pairs = [_paired(_rows(r)[ev], _rows(b)[ev]) for r, b in zip(runs, base_runs)]
            refused = [f"{why} in seed #{k}" for k, why in enumerate(pairs, 1) if isinstance(why, str)]
            paired = [pair for pair in pairs if not isinstance(pair, str)]
            if refused:
                diffs.append(f"– ({', '.join(refused)})")
            else:
                diffs.append(_t_cell([_mean(mine) - _mean(ref) for mine, ref in paired], True))
        lines.append(f"| {label} | " + " | ".join(cells + diffs) + " |")
    return "\n".join(lines)


def per_seed_table(groups: list[tuple[str, list[dict[str, Any]]]], evs: list[Any]) -> str:
    """Markdown: every seed of every row alone, its mean [95% interval over the held-out documents], and its
    difference to the first row's run of the same seed, paired over the same documents (the estimate
    always, the interval from 5 documents on)."""
    from extrapos.report import stats

    base_label, base_runs = groups[0]
    lines = _header("run", evs, f"- {base_label}, same seed (paired)")
    for label, runs in groups:
        for k, (result, base) in enumerate(zip(runs, base_runs), 1):
            cells, diffs = [], []
            for ev in evs:
                row = _rows(result)[ev]
                mine, n = document_sums(row), len(row.get("doc_index") or [])
                few = f"(too few documents for an interval: {n})"
                if mine is None:
                    cells.append("–")
                elif n < stats.MIN_DOCUMENTS:
                    cells.append(f"{_mean(mine):.3f} {few}")
                else:
                    iv = stats.loss_interval(*mine)
                    cells.append(f"{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}]")
                if runs is base_runs:
                    diffs.append("baseline")
                    continue
                pair = _paired(row, _rows(base)[ev])
                if isinstance(pair, str):
                    diffs.append(f"– ({pair})")
                elif n < stats.MIN_DOCUMENTS:
                    diffs.append(f"{_mean(pair[0]) - _mean(pair[1]):+.3f} {few}")
                else:
                    d = stats.paired_difference(pair[0][0], pair[0][1], pair[1][0], pair[1][1])
                    text = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                    diffs.append(text + (" within noise" if d.contains(0.0) else ""))
            lines.append(f"| {label} (seed #{k}) | " + " | ".join(cells + diffs) + " |")
    return "\n".join(lines)


def _head_values(row: dict[str, Any]) -> list[list[float | None]]:
    """Per layer, per head: the mean median weight x n over the queries past L_t (the result's ``beyond``)."""
    return [list((layer.get("beyond") or {}).get(STAT) or []) for layer in row["layers"]]


def head_table(groups: list[tuple[str, list[dict[str, Any]]]], ev: Any) -> str:
    """Markdown: per layer and head at ``ev``, each row's mean median weight x n past L_t minus the first
    row's of the same seed (over the same documents), averaged over the seeds, and how many seeds share
    the sign of that average."""
    base_label, base_runs = groups[0]
    others = groups[1:]
    base_heads = [_head_values(_rows(r)[ev]) for r in base_runs]
    cells: dict[tuple[int, int], list[str]] = {
        (layer, head): [] for layer, heads in enumerate(base_heads[0]) for head in range(len(heads))
    }
    seeds = len(base_runs)
    for _, runs in others:
        rows = [_rows(r)[ev] for r in runs]
        same = [row["doc_index"] == _rows(b)[ev]["doc_index"] for row, b in zip(rows, base_runs)]
        heads = [_head_values(row) for row in rows]
        for (layer, head), out in cells.items():
            diffs = []
            for s in range(seeds):
                try:
                    mine, ref = heads[s][layer][head], base_heads[s][layer][head]
                except IndexError:  # another shape of model: no pair
                    mine = ref = None
                if mine is not None and ref is not None and same[s]:
                    diffs.append(mine - ref)
            if len(diffs) < seeds:
                out += ["–", "–"]
                continue
            mean = float(np.mean(diffs))
            agree = sum(1 for d in diffs if (d > 0) == (mean > 0) and d != 0) if mean != 0 else 0
            out += [f"{mean:+.3f}", f"{agree}/{seeds}"]
    columns = " | ".join(f"{label} - {base_label} | seeds of its sign" for label, _ in others)
    lines = [f"| layer | head | {columns} |", "|---:|---:|" + "---:|" * (2 * len(others))]
    for (layer, h), out in cells.items():
        lines.append(f"| {layer} | {h} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def _seeds_text(groups: list[tuple[str, list[dict[str, Any]]]], evs: list[Any], png: Path | None) -> str:
    """median-weight.md of S >= 2 seeds per row."""
    L = groups[0][1][0]["train_length"]
    seeds = len(groups[0][1])
    runs = "\n".join(
        f"- {label}, seed #{k}: `{r['run']}`, {r['encoding']}, checkpoint step {r['checkpoint_step']}, "
        f"{r['documents_used']} documents"
        for label, group in groups
        for k, r in enumerate(group, 1)
    )
    base = groups[0][0]
    parts = [
        f"# Median attention weight past L_t = {L} (the segmented-sequences paper's Figure 3), {seeds} seeds",
        "",
        runs,
        "",
        "Mean over the queries past L_t, every layer and head, of n x the median of a query's n visible "
        "attention weights (1 = even weights, near 0 = a few keys hold the mass), per row the mean over its "
        f"{seeds} seeds (the runs given under one label; seed #k is the k-th of each), and each row minus "
        f"{base} paired per seed: seed #k's run minus {base}'s seed #k over the same held-out documents, "
        f"averaged over the seeds. The interval is Student's t 95% over the {seeds} seeds: it covers "
        "training noise (the seeds' initialisation and data order), and a sentence about the result quotes "
        'it ("within noise" when it contains 0).',
        "",
        seeds_table(groups, evs),
        "",
        "Each seed alone: its mean [95% interval over the held-out documents: they cover the documents read "
        f"from that one trained model, not training noise], and its difference to {base}'s run of the same "
        "seed, paired over the same documents.",
        "",
        per_seed_table(groups, evs),
    ]
    if len(groups) > 1:
        parts += [
            "",
            f"Per layer and head at ev={evs[-1]}: the head's mean median weight x n past L_t in each row "
            f"minus in {base}, of the same seed over the same documents, averaged over the {seeds} seeds, "
            "and how many seeds have a difference of that sign.",
            "",
            head_table(groups, evs[-1]),
        ]
    picture = "![median weight](median-weight.png)" if png else "(no plot: matplotlib is not installed)"
    parts += ["", picture, ""]
    return "\n".join(parts)


def write_figure(results: list[tuple[str, dict[str, Any]]], out_dir: Path) -> tuple[Path, Path | None]:
    """``out_dir/median-weight.md`` (the table, what it reads) and ``median-weight.png``; returns both. Runs
    that share a label are the seeds of one row (module docstring)."""
    evs = check_comparable(results)
    groups = grouped(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot(groups, evs, out_dir / "median-weight.png")
    md = out_dir / "median-weight.md"
    # what a killed figure left before its rename: no lock guards the folder, so only once abandoned
    sweep_temporaries_of(md, older_than=ABANDONED_SECONDS)
    if len(groups[0][1]) > 1:
        atomic_write(md, _seeds_text(groups, evs, png).encode())
        return md, png
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
    atomic_write(md, text.encode())
    return md, png
