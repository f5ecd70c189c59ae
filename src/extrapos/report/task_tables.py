"""Task columns in a comparison report: accuracy-vs-length tables, a plot per task, and a CSV.

Reads the rows' task results (``extrapos.compare.tasks``), never a model, and needs no torch, so
`extrapos report` re-renders them byte for byte. Accuracy is the metric the papers report for these
tasks: per-token accuracy and exact match on synthetic tasks (Kazemnejad et al. 2023, §4), passkey
retrieval accuracy per length, averaged over needle depths (Mohtashami & Jaggi 2023, §4.2), RULER accuracy
per length, averaged over its tasks as RULER averages them (Hsieh et al. 2024, §4), and the
harness's own metric for lm-eval tasks (Gao et al. 2021, lm-evaluation-harness). Attention diagnostics
columns give statistics of the attention averaged over every layer and head per length (the reading of
attention the segmented-sequences paper uses to explain extrapolation, Karypis et al., Figure 3), with
intervals over the held-out documents.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

# the task order of the report, whatever order the rows list them in
ORDER = ("synthetic", "passkey", "ruler", "lm-eval", "attention")


def task_names(rows) -> list[str]:
    present = {t for row in rows for t in row.tasks}
    return [t for t in ORDER if t in present] + sorted(present - set(ORDER))


def _by_length(result: dict[str, Any], metric: str) -> dict[int, float]:
    """ev -> the metric; passkey cells are averaged over their depths, RULER cells over their tasks."""
    values: dict[int, list[float]] = {}
    for c in result["results"]:
        if c.get(metric) is not None:
            values.setdefault(c["ev"], []).append(c[metric])
    return {ev: statistics.fmean(v) for ev, v in values.items()}


def length_metrics(task: str, rows) -> list[tuple[str, str]]:
    """(result field, label) of the metrics a length table shows for ``task``."""
    if task == "synthetic":
        return [("token_accuracy", "token accuracy"), ("exact_match", "exact match")]
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


def accuracy_cells(task: str, rows, metric: str, baseline: str | None = None) -> dict[tuple[str, int], Any]:
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


def length_table(task: str, rows, metric: str, cells: dict[tuple[str, int], Any] | None = None) -> str:
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


def difference_table(task: str, rows, metric: str, cells: dict[tuple[str, int], Any], baseline: str) -> str:
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
    if task == "ruler":
        req = first["request"]
        chance = f"; ranking form's chance {1 / req['candidates']:.2f}" if req["mode"] != "generate" else ""
        return (
            f"RULER tasks ({req['mode']}: string-match recall of the greedy output and/or rank accuracy, "
            f"template {req.get('template', 'ruler')}, essay {first.get('essay_source', req.get('essay'))}): "
            f"per length, the mean over the tasks {', '.join(req['tasks'])} ({req['trials']} examples per "
            f"task and length{chance}); the per-task table follows."
        )
    if task == "attention":
        req = first.get("request", {})
        return (
            f"Attention diagnostics (`extrapos attention`, docs/attention-diagnostics.md) on the held-out "
            f"windows of each length ({req.get('max_tokens', '?')} tokens per length, split "
            f"{req.get('split', '?')}): each statistic averaged over every query, layer and head; [a, b] = "
            "95% interval from a bootstrap over the held-out documents (seeds crossed when the row has "
            "several). Neither direction is better; the per-layer and per-head values are in each row's "
            "JSON under tasks/attention/."
        )
    return f"lm-evaluation-harness: {', '.join(first.get('tasks', []))}."


def ruler_task_table(rows, metric: str) -> str:
    """Rows x RULER tasks x ev: each task's accuracy per length (the column table averages them)."""
    scored = [row for row in rows if "ruler" in row.tasks]
    cells = [c for row in scored for c in row.tasks["ruler"]["results"]]
    evs = sorted({c["ev"] for c in cells})
    lines = [
        "| model | task | " + " | ".join(f"ev={ev}" for ev in evs) + " |",
        "|---|---|" + "---:|" * len(evs),
    ]
    for row in scored:
        mine = row.tasks["ruler"]["results"]
        for task in dict.fromkeys(c["task"] for c in mine):
            values = {c["ev"]: c.get(metric) for c in mine if c["task"] == task}
            texts = ["–" if values.get(ev) is None else f"{values[ev]:.3f}" for ev in evs]
            lines.append(f"| {row.name} | {task} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def task_sections(rows, plots: dict[str, Path], baseline: str | None = None) -> list[str]:
    """The report's task part: one accuracy-vs-length table per task and metric with intervals, the
    paired differences to the baseline row, and the plot."""
    from extrapos.report import stats

    parts: list[str] = []
    for task in task_names(rows):
        parts += [_describe(task, rows), ""]
        if task == "lm-eval":
            parts += [lm_eval_table(rows), ""]
            continue
        if task == "attention":
            for stat in attention_statistics(rows):
                label = ATTENTION_LABELS.get(stat, stat)
                parts += [f"{label[0].upper() + label[1:]}:", "", attention_table(rows, stat), ""]
            continue
        scored = [row for row in rows if task in row.tasks]
        base = next((row.name for row in scored if row.name == baseline), scored[0].name)
        for metric, label in length_metrics(task, rows):
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
            if task == "ruler":
                parts += [f"{label.capitalize()} per RULER task:", "", ruler_task_table(rows, metric), ""]
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
            if task == "attention":
                for r in result["results"]:
                    for stat in attention_statistics([row]):
                        value = attention_value(r, stat)
                        if value is not None:
                            w.writerow(
                                [row.name, task, r["ev"], r.get("window", ""), "", stat, f"{value:.6f}"]
                            )
                continue
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
                                f"{task}:{c['task']}" if task == "ruler" else task,
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
    tasks = [t for t in task_names(rows) if t not in ("lm-eval", "attention")]  # attention: its own plots
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
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written[task] = p
    return written


# ---- attention diagnostics ------------------------------------------------------------------------

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


def _attention_sums(row: dict[str, Any], stat: str):
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


def attention_interval(result: dict[str, Any], ev: float, stat: str):
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


def attention_statistics(rows) -> list[str]:
    """The statistics the report shows: those the sweep asked for (``attention.statistics``)."""
    first = next(row.tasks["attention"] for row in rows if "attention" in row.tasks)
    return list(first.get("report_statistics") or ATTENTION_DEFAULT)


def attention_table(rows, stat: str) -> str:
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
