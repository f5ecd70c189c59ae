"""Task columns in a comparison report: accuracy-vs-length tables, a plot per task, and a CSV.

Reads the rows' task results (``extrapos.compare.tasks``), never a model, and needs no torch, so
`extrapos report` re-renders them byte for byte. The report names no task: each task's section comes from the
task itself (``tasks/task.py``: a ``Task`` is a ``LengthReport``), handed to ``task_sections`` by the command
that renders the report. ``LengthReport`` is what every accuracy task shares: the metric per length with a
bootstrap interval over the examples (and seeds), the paired difference to the baseline row, the plot and
the CSV lines; a task that reports otherwise (lm-eval's scores, attention statistics) overrides its hooks.
Accuracy is the metric the papers report for these tasks: per-token accuracy and exact match on synthetic
tasks (Kazemnejad et al. 2023, §4), passkey retrieval accuracy per length, averaged over needle depths
(Mohtashami & Jaggi 2023, §4.2), RULER accuracy per length, averaged over its tasks as RULER averages them
(Hsieh et al. 2024, §4).
"""

from __future__ import annotations

import csv
import io
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from extrapos.files import save_png

logger = logging.getLogger(__name__)


def _by_length(result: dict[str, Any], metric: str) -> dict[int, float]:
    """ev -> the metric; passkey cells are averaged over their depths, RULER cells over their tasks."""
    values: dict[int, list[float]] = {}
    for c in result["results"]:
        if c.get(metric) is not None:
            values.setdefault(c["ev"], []).append(c[metric])
    return {ev: statistics.fmean(v) for ev, v in values.items()}


def length_metrics(task: str, rows: Sequence[Any]) -> list[tuple[str, str]]:
    """(result field, label) of the metrics a length table shows for ``task``: those its results name
    (``metrics``, or ``metric`` and exact match beside it when both modes were scored)."""
    metrics: list[tuple[str, str]] = []
    for row in rows:
        if task not in row.tasks:
            continue
        result = row.tasks[task]
        both = ["exact_match"] if result.get("request", {}).get("mode") == "both" else []
        for m in result.get("metrics") or [result.get("metric")] + both:  # a RULER result lists its metrics
            if m and m not in [x for x, _ in metrics]:
                metrics.append((m, m.replace("_", " ")))
    return metrics


def example_samples(result: dict[str, Any], ev: int, metric: str) -> tuple[Any, Any, tuple] | None:
    """Per-example (numerators, denominators) of one length, every depth pooled, one row per seed:
    arrays (seeds, examples), and the digests of the examples they scored; None for results saved
    before cells recorded their examples."""
    import numpy as np

    nums, dens = [], []
    digests: tuple[Any, ...] | None = None
    for one in result.get("seeds") or [result]:
        n, d, g = [], [], []
        for c in one["results"]:
            if c["ev"] != ev:
                continue
            pair = c.get("per_example", {}).get(metric)
            if pair is None:
                return None
            n += pair[0]
            d += pair[1]
            g.append(c.get("examples_digest"))
        if not n or (digests is not None and tuple(g) != digests):
            return None
        digests = tuple(g)
        nums.append(n)
        dens.append(d)
    if len({len(n) for n in nums}) != 1:
        return None
    assert digests is not None  # set by the first seed (there is one at least)
    return np.asarray(nums, dtype=np.float64), np.asarray(dens, dtype=np.float64), digests


def accuracy_cells(
    task: str, rows: Sequence[Any], metric: str, baseline: str | None = None
) -> dict[tuple[str, int], Any]:
    """(row, ev) -> (interval, paired difference to the baseline row or None): a bootstrap over the
    examples (and seeds), the same resampling as the loss tables' (stats.py) with the example as unit;
    rows that scored the same examples (equal digests) are paired."""
    from extrapos.report import stats

    scored = [row for row in rows if task in row.tasks]
    if not scored:
        return {}
    base = next((row for row in scored if row.name == baseline), scored[0])
    out: dict[tuple[str, int], Any] = {}
    for row in scored:
        for ev in _by_length(row.tasks[task], metric):
            mine = example_samples(row.tasks[task], ev, metric)
            if mine is None:
                continue
            diff = None
            ref = example_samples(base.tasks[task], ev, metric) if row is not base else None
            if ref is not None and ref[2] == mine[2] and ref[0].shape == mine[0].shape:
                diff = stats.paired_difference(mine[0], mine[1], ref[0], ref[1])
            out[(row.name, ev)] = (stats.loss_interval(mine[0], mine[1]), diff)
    return out


def length_table(
    task: str, rows: Sequence[Any], metric: str, cells: dict[tuple[str, int], Any] | None = None
) -> str:
    """Rows x ev, the metric in each cell, best of each column in bold (higher is better); with
    ``cells``, each value carries its interval."""
    scored = [row for row in rows if task in row.tasks]
    tables = {row.name: _by_length(row.tasks[task], metric) for row in scored}
    cols = sorted({ev for t in tables.values() for ev in t})
    best = {ev: max((t[ev] for t in tables.values() if ev in t), default=None) for ev in cols}
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in scored:
        texts = []
        for ev in cols:
            v = tables[row.name].get(ev)
            if v is None:
                texts.append("–")
                continue
            text = f"**{v:.3f}**" if v == best[ev] else f"{v:.3f}"
            if cells is not None and (row.name, ev) in cells:
                iv = cells[(row.name, ev)][0]
                text += f" [{iv.low:.3f}, {iv.high:.3f}]"
            texts.append(text)
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def difference_table(
    task: str, rows: Sequence[Any], metric: str, cells: dict[tuple[str, int], Any], baseline: str
) -> str:
    """Each row minus the baseline, with its paired interval; "within noise" when it contains 0."""
    scored = [row for row in rows if task in row.tasks]
    cols = sorted({ev for row in scored for ev in _by_length(row.tasks[task], metric)})
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in scored:
        texts = []
        for ev in cols:
            cell = cells.get((row.name, ev))
            if row.name == baseline and cell is not None:
                texts.append("baseline")
            elif cell is None or cell[1] is None:
                texts.append("–")
            else:
                d = cell[1]
                text = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                texts.append(text + (" within noise" if d.contains(0.0) else ""))
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


class TaskReport(Protocol):
    """A task's section of the report (``LengthReport`` is the shared implementation)."""

    @property
    def name(self) -> str:
        """The task's name: its rows' key in ``Row.tasks``."""
        ...

    @property
    def plots(self) -> bool:
        """Whether it draws ``<name>_vs_length.png``."""
        ...

    def describe(self, rows: Sequence[Any]) -> str:
        """The sentence above the task's tables: what was scored and how."""
        ...

    def tables(self, rows: Sequence[Any], baseline: str | None) -> list[str]:
        """The task's tables (Markdown lines), rows scored by the task only."""
        ...

    def csv_rows(self, row_name: str, result: dict[str, Any]) -> list[list[Any]]:
        """One row's lines of tasks.csv (model, task, ev, length, depth, metric, value)."""
        ...

    def plot(self, rows: Sequence[Any], out_dir: Path, plt: Any) -> Path:
        """The task's plot written into ``out_dir`` with matplotlib's ``plt``."""
        ...


class LengthReport:
    """The report of an accuracy-per-length task: per metric, a rows x ev table with intervals, the paired
    differences to the baseline row, the plot of the metric against ev, and the CSV lines of every cell."""

    name: ClassVar[str]
    plots: ClassVar[bool] = True

    def __init__(self, name: str | None = None):
        if name is not None:  # a task whose definition is not installed: reported the shared way
            self.name = name  # type: ignore[misc]

    def metrics(self, rows: Sequence[Any]) -> list[tuple[str, str]]:
        """(result field, label) of the metrics a table is shown for."""
        return length_metrics(self.name, rows)

    def describe(self, rows: Sequence[Any]) -> str:
        return f"{self.name}: accuracy per length (higher is better)."

    def extra_tables(self, rows: Sequence[Any], metric: str, label: str) -> list[str]:
        """Lines after a metric's tables (RULER: the metric per RULER task)."""
        return []

    def tables(self, rows: Sequence[Any], baseline: str | None) -> list[str]:
        from extrapos.report import stats

        task = self.name
        parts: list[str] = []
        scored = [row for row in rows if task in row.tasks]
        base = next((row.name for row in scored if row.name == baseline), scored[0].name)
        for metric, label in self.metrics(rows):
            cells = accuracy_cells(task, rows, metric, base)
            parts += [f"{label.capitalize()} (higher is better; best per column in bold):", ""]
            if cells:
                parts += [
                    f"[a, b] = {round(stats.LEVEL * 100)}% interval from a bootstrap over the examples "
                    f"({stats.RESAMPLES} resamples, seed {stats.BOOTSTRAP_SEED}; seeds crossed when the row "
                    "has several).",
                    "",
                ]
            parts += [length_table(task, rows, metric, cells or None), ""]
            if any(d is not None for _, d in cells.values()):
                parts += [
                    f"Difference to {base} (row minus baseline; positive = better), paired over the same "
                    'examples; "within noise" when the interval contains 0:',
                    "",
                    difference_table(task, rows, metric, cells, base),
                    "",
                ]
            parts += self.extra_tables(rows, metric, label)
        return parts

    def csv_task(self, cell: dict[str, Any]) -> str:
        """The task column of a cell's CSV lines."""
        return self.name

    def csv_rows(self, row_name: str, result: dict[str, Any]) -> list[list[Any]]:
        lines = []
        for c in result["results"]:
            for metric in ("token_accuracy", "exact_match", "answer_loss", "rank_accuracy"):
                if isinstance(c.get(metric), (int, float)):
                    lines.append(
                        [
                            row_name,
                            self.csv_task(c),
                            c["ev"],
                            c.get("length", ""),
                            c.get("depth", ""),
                            metric,
                            f"{c[metric]:.6f}",
                        ]
                    )
        return lines

    def plot(self, rows: Sequence[Any], out_dir: Path, plt: Any) -> Path:
        """<task>_vs_length.png: one panel per metric, log-scaled ev, dashed line at L_t."""
        task = self.name
        metrics = self.metrics(rows)
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
        for ax, (metric, label) in zip(axes[0], metrics):
            cols: set[int] = set()
            for row in rows:
                if task not in row.tasks:
                    continue
                values = _by_length(row.tasks[task], metric)
                evs = sorted(values)
                cols.update(evs)
                (line,) = ax.plot(evs, [values[ev] for ev in evs], marker="o", label=row.name)
                bands = accuracy_cells(task, [row], metric)
                if len(bands) == len(evs):
                    low = [bands[(row.name, ev)][0].low for ev in evs]
                    high = [bands[(row.name, ev)][0].high for ev in evs]
                    ax.fill_between(evs, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            ticks = sorted(cols)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(c) for c in ticks])
            ax.axvline(1, color="grey", linestyle="--", linewidth=1)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("evaluation length / training length (ev)")
            ax.set_ylabel(label)
            ax.set_title(f"{task}: {label} vs length", fontsize=10)
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        p = out_dir / f"{task}_vs_length.png"
        save_png(fig, p)  # whole or not at all
        plt.close(fig)
        return p


def reports_of(rows: Sequence[Any], reports: Sequence[TaskReport]) -> list[TaskReport]:
    """The reports of the tasks ``rows`` scored, in the order of ``reports`` (the registry's); a task with
    no report given (its package is not installed) last, reported the shared way, in name order."""
    present = {t for row in rows for t in row.tasks}
    known = [r for r in reports if r.name in present]
    return known + [LengthReport(n) for n in sorted(present - {r.name for r in known})]


def task_names(rows: Sequence[Any], reports: Sequence[TaskReport] = ()) -> list[str]:
    return [r.name for r in reports_of(rows, reports)]


def task_sections(
    rows: Sequence[Any],
    plots: dict[str, Path],
    baseline: str | None = None,
    reports: Sequence[TaskReport] = (),
) -> list[str]:
    """The report's task part: each task's description and tables (``TaskReport``), then its plot."""
    parts: list[str] = []
    for report in reports_of(rows, reports):
        parts += [report.describe(rows), ""]
        parts += report.tables(rows, baseline)
        if report.name in plots:
            parts += [f"![{plots[report.name].stem}](plots/{plots[report.name].name})", ""]
    return parts


def tasks_csv(rows: Sequence[Any], reports: Sequence[TaskReport] = ()) -> str:
    """One line per (row, task, ev, depth, metric)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "task", "ev", "length", "depth", "metric", "value"])
    for row in rows:
        for report in reports_of([row], reports):
            w.writerows(report.csv_rows(row.name, row.tasks[report.name]))
    return buf.getvalue()


def plot_tasks(rows: Sequence[Any], out_dir: Path, reports: Sequence[TaskReport] = ()) -> dict[str, Path]:
    """task -> its plot, for the tasks that draw one."""
    drawn = [r for r in reports_of(rows, reports) if r.plots]
    if not drawn:
        return {}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info(
            "report: matplotlib is not installed, skipping task plots (pip install 'extrapos[plots]')."
        )
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    return {r.name: r.plot(rows, out_dir, plt) for r in drawn}
