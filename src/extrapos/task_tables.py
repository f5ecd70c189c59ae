"""Task columns in a comparison report: accuracy-vs-length tables, a plot per task, and a CSV.

Reads the rows' task results (``extrapos.compare_tasks``), never a model, and needs no torch, so
`extrapos report` re-renders them byte for byte. Accuracy is the metric the papers report for these
tasks: per-token accuracy and exact match on synthetic tasks (Kazemnejad et al. 2023, §4), passkey
retrieval accuracy per length, averaged over needle depths (Mohtashami & Jaggi 2023, §4.2), and the
harness's own metric for lm-eval tasks (Gao et al. 2021, lm-evaluation-harness).
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

# the task order of the report, whatever order the rows list them in
ORDER = ("synthetic", "passkey", "lm-eval")


def task_names(rows) -> list[str]:
    present = {t for row in rows for t in row.tasks}
    return [t for t in ORDER if t in present] + sorted(present - set(ORDER))


def _by_length(result: dict[str, Any], metric: str) -> dict[int, float]:
    """ev -> the metric; passkey cells are averaged over their depths."""
    values: dict[int, list[float]] = {}
    for c in result["results"]:
        if c.get(metric) is not None:
            values.setdefault(c["ev"], []).append(c[metric])
    return {ev: statistics.fmean(v) for ev, v in values.items()}


def length_metrics(task: str, rows) -> list[tuple[str, str]]:
    """(result field, label) of the metrics a length table shows for ``task``."""
    if task == "synthetic":
        return [("token_accuracy", "token accuracy"), ("exact_match", "exact match")]
    metrics = []
    for row in rows:
        if task not in row.tasks:
            continue
        result = row.tasks[task]
        both = ["exact_match"] if result.get("request", {}).get("mode") == "both" else []
        for m in [result.get("metric")] + both:
            if m and m not in [x for x, _ in metrics]:
                metrics.append((m, m.replace("_", " ")))
    return metrics


def length_table(task: str, rows, metric: str) -> str:
    """Rows x ev, the metric in each cell, best of each column in bold (higher is better)."""
    scored = [row for row in rows if task in row.tasks]
    tables = {row.name: _by_length(row.tasks[task], metric) for row in scored}
    cols = sorted({ev for t in tables.values() for ev in t})
    best = {ev: max((t[ev] for t in tables.values() if ev in t), default=None) for ev in cols}
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in scored:
        cells = []
        for ev in cols:
            v = tables[row.name].get(ev)
            cells.append("–" if v is None else (f"**{v:.3f}**" if v == best[ev] else f"{v:.3f}"))
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _lm_eval_scores(result: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """lm-eval task -> (metric, value): acc_norm where the task has it, else acc, else its first number."""
    out = {}
    for task, metrics in sorted(result.get("results", {}).items()):
        numbers = {
            k.split(",")[0]: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "stderr" not in k
        }
        for name in ("acc_norm", "acc", "exact_match"):
            if name in numbers:
                out[task] = (name, float(numbers[name]))
                break
        else:
            if numbers:
                name = sorted(numbers)[0]
                out[task] = (name, float(numbers[name]))
    return out


def lm_eval_table(rows) -> str:
    scored = [row for row in rows if "lm-eval" in row.tasks]
    scores = {row.name: _lm_eval_scores(row.tasks["lm-eval"]) for row in scored}
    cols = sorted({t for s in scores.values() for t in s})
    names = {t: next(s[t][0] for s in scores.values() if t in s) for t in cols}
    lines = [
        "| model | max length | " + " | ".join(f"{t} ({names[t]})" for t in cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for row in scored:
        cells = [f"{scores[row.name][t][1]:.3f}" if t in scores[row.name] else "–" for t in cols]
        lines.append(
            f"| {row.name} | {row.tasks['lm-eval'].get('max_length', '–')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _describe(task: str, rows) -> str:
    first = next(row.tasks[task] for row in rows if task in row.tasks)
    if task == "synthetic":
        req = first.get("request", {})
        return (
            f"Synthetic task `{first['task']}`, {req.get('examples', '?')} fresh examples of exactly ev x "
            "L_t "
            "tokens per length (never the training examples), scored teacher-forced on the answer tokens: "
            "per-token accuracy (argmax = answer) and exact match (every answer token of an example right)."
        )
    if task == "passkey":
        req = first["request"]
        chance = f"; chance {1 / req['candidates']:.2f}" if first.get("metric") == "rank_accuracy" else ""
        return (
            f"Passkey retrieval ({req['mode']}, haystack {req['haystack']}): accuracy per length, the mean "
            "over "
            f"needle depths {', '.join(f'{d:g}' for d in req['depths'])} ({req['trials']} trials per "
            f"cell{chance}); "
            "the per-depth grid is in each row's JSON under tasks/passkey/."
        )
    return f"lm-evaluation-harness: {', '.join(first.get('tasks', []))}."


def task_sections(rows, plots: dict[str, Path]) -> list[str]:
    """The report's task part: one accuracy-vs-length table per task and metric, and its plot."""
    parts: list[str] = []
    for task in task_names(rows):
        parts += [_describe(task, rows), ""]
        if task == "lm-eval":
            parts += [lm_eval_table(rows), ""]
        else:
            for metric, label in length_metrics(task, rows):
                parts += [
                    f"{label.capitalize()} (higher is better; best per column in bold):",
                    "",
                    length_table(task, rows, metric),
                    "",
                ]
        if task in plots:
            parts += [f"![{plots[task].stem}](plots/{plots[task].name})", ""]
    return parts


def tasks_csv(rows) -> str:
    """One line per (row, task, ev, depth, metric)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "task", "ev", "length", "depth", "metric", "value"])
    for row in rows:
        for task in task_names([row]):
            result = row.tasks[task]
            if task == "lm-eval":
                for name, (metric, value) in _lm_eval_scores(result).items():
                    w.writerow(
                        [
                            row.name,
                            f"lm-eval:{name}",
                            "",
                            result.get("max_length", ""),
                            "",
                            metric,
                            f"{value:.6f}",
                        ]
                    )
                continue
            for c in result["results"]:
                for metric in ("token_accuracy", "exact_match", "answer_loss", "rank_accuracy"):
                    if isinstance(c.get(metric), (int, float)):
                        w.writerow(
                            [
                                row.name,
                                task,
                                c["ev"],
                                c.get("length", ""),
                                c.get("depth", ""),
                                metric,
                                f"{c[metric]:.6f}",
                            ]
                        )
    return buf.getvalue()


def plot_tasks(rows, out_dir: Path) -> dict[str, Path]:
    """<task>_vs_length.png per length task (one panel per metric, log-scaled ev, dashed line at L_t)."""
    tasks = [t for t in task_names(rows) if t != "lm-eval"]
    if not tasks:
        return {}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is not installed, skipping task plots (pip install 'extrapos[plots]').")
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for task in tasks:
        metrics = length_metrics(task, rows)
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
        for ax, (metric, label) in zip(axes[0], metrics):
            cols = set()
            for row in rows:
                if task not in row.tasks:
                    continue
                values = _by_length(row.tasks[task], metric)
                evs = sorted(values)
                cols.update(evs)
                ax.plot(evs, [values[ev] for ev in evs], marker="o", label=row.name)
            cols = sorted(cols)
            ax.set_xscale("log", base=2)
            ax.set_xticks(cols, [str(c) for c in cols])
            ax.axvline(1, color="grey", linestyle="--", linewidth=1)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("evaluation length / training length (ev)")
            ax.set_ylabel(label)
            ax.set_title(f"{task}: {label} vs length", fontsize=10)
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        p = out_dir / f"{task}_vs_length.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written[task] = p
    return written
