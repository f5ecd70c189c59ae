"""Tables and plots from saved evaluation results, in the papers' style.

Rows are encodings or variants, columns are ev = 1, 2, 4, ...; the best value of each column is
bold. The same numbers go to CSV and JSON, and two PNG plots show loss against evaluation length
(log-scaled x) and loss by position in the longest windows. `extrapos report` rebuilds all of it
from ``eval/*.json`` files, so a report never needs a model.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extrapos.errors import UserError
from extrapos.files import atomic_write


@dataclass
class Row:
    name: str
    result: dict[str, Any]  # an eval/*.json document

    def metric(self, ev: int, metric: str) -> float | None:
        for r in self.result["results"]:
            if r["ev"] == ev:
                return r[metric]
        return None


def _columns(rows: list[Row]) -> list[int]:
    return sorted({r["ev"] for row in rows for r in row.result["results"]})


def markdown_table(rows: list[Row], metric: str = "loss") -> str:
    cols = _columns(rows)
    best = {}
    for ev in cols:
        values = [v for row in rows if (v := row.metric(ev, metric)) is not None]
        best[ev] = min(values) if values else None
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for row in rows:
        cells = []
        for ev in cols:
            v = row.metric(ev, metric)
            if v is None:
                cells.append("–")
            else:
                text = f"{v:.2f}" if metric == "ppl" else f"{v:.3f}"
                cells.append(f"**{text}**" if v == best[ev] else text)
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_to_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "encoding", "applied", "ev", "window", "tokens", "loss", "ppl", "bpb", "tail_loss"])
    for row in rows:
        for r in row.result["results"]:
            w.writerow([row.name, row.result["encoding"], json.dumps(row.result.get("applied") or {}), r["ev"],
                        r["window"], r["tokens"], f"{r['loss']:.6f}", f"{r['ppl']:.4f}", f"{r['bpb']:.6f}",
                        f"{r['tail_loss']:.6f}"])
    return buf.getvalue()


def plot(rows: list[Row], out_dir: Path, title: str = "") -> list[Path]:
    """loss_vs_length.png and per_position.png; returns the files written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is not installed, skipping plots (pip install 'extrapos[plots]').")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    cols = _columns(rows)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for row in rows:
        evs = [r["ev"] for r in row.result["results"]]
        losses = [r["loss"] for r in row.result["results"]]
        line, = ax.plot(evs, losses, marker="o", label=row.name)
        # the extrapolation signal itself: how much worse (or better) than at the shortest length
        ax2.plot(evs, [x - losses[0] for x in losses], marker="o", color=line.get_color(), label=row.name)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(cols, [str(c) for c in cols])
        a.set_xlabel("evaluation length / training length (ev)")
        a.grid(alpha=0.3)
    ax.set_ylabel("mean token loss (nats)")
    ax.set_title("Loss vs evaluation length", fontsize=10)
    ax2.axhline(0, color="grey", linewidth=1)
    ax2.set_ylabel(f"loss - loss at ev={cols[0]} (nats)")
    ax2.set_title("Change from the shortest length (lower is better)", fontsize=10)
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    p = out_dir / "loss_vs_length.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for row in rows:
        pp = row.result.get("per_position")
        if not pp:
            continue
        mids = [(a + b) / 2 for a, b in zip(pp["starts"], pp["ends"])]
        ax.plot(mids, pp["loss"], label=row.name)
    train_len = rows[0].result["train_length"] if rows else None
    if train_len:
        ax.axvline(train_len, color="grey", linestyle="--", linewidth=1, label="training length")
    ax.set_xlabel("position in the longest window")
    ax.set_ylabel("mean token loss (nats)")
    ax.set_title("Loss by position (bucket means)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "per_position.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    written.append(p)
    return written


def write_report(rows: list[Row], out_dir: Path, title: str, facts: list[str] | None = None) -> Path:
    """report.md + results.csv + results.json + plots/ in ``out_dir``; returns the report path."""
    if not rows:
        raise UserError("nothing to report: no evaluation results were found; run `extrapos eval` first.")
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(rows, out_dir / "plots", title)
    parts = [f"# {title}", ""]
    if facts:
        parts += [f"- {f}" for f in facts] + [""]
    parts += ["Mean token loss (nats) on the same target tokens at every length; best per column in bold.", "",
              markdown_table(rows, "loss"), "", "Perplexity:", "", markdown_table(rows, "ppl"), "",
              "Loss of each window's last L_t tokens (does more context help?):", "",
              markdown_table(rows, "tail_loss"), ""]
    for p in plots:
        parts.append(f"![{p.stem}](plots/{p.name})")
    report = out_dir / "report.md"
    _atomic_write(report, "\n".join(parts) + "\n")
    _atomic_write(out_dir / "results.csv", rows_to_csv(rows))
    _atomic_write(out_dir / "results.json", json.dumps([{**r.result, "eval_name": r.result["name"], "name": r.name} for r in rows], indent=1))
    return report


def _atomic_write(path: Path, text: str) -> None:
    atomic_write(path, text)


def _read_rows(compare_dir: Path) -> list[dict[str, Any]]:
    try:
        entries = json.loads((compare_dir / "rows.json").read_text())
        assert isinstance(entries, list) and all(isinstance(e["eval"], str) and "name" in e for e in entries)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UserError(f"{compare_dir / 'rows.json'} is damaged; rebuild it with `extrapos compare`.") from None
    return entries


def collect_rows(paths: list[str | Path]) -> tuple[list[Row], Path | None]:
    """Rows from a compare directory (its rows.json order), run directories or eval JSON files."""
    rows: list[Row] = []
    compare_dir = None
    for p in map(Path, paths):
        if (p / "rows.json").is_file():
            compare_dir = p
            for entry in _read_rows(p):
                f = p / entry["eval"]
                if not f.resolve().is_relative_to(p.resolve()):
                    raise UserError(f"{p / 'rows.json'} points outside the comparison ({entry['eval']}); "
                                    "rebuild it with `extrapos compare`.")
                if f.is_file():
                    rows.append(Row(entry["name"], json.loads(f.read_text())))
        elif (p / "eval").is_dir():
            for f in sorted((p / "eval").glob("*.json")):
                rows.append(Row(f"{p.name}/{f.stem}", json.loads(f.read_text())))
        elif p.suffix == ".json" and p.is_file():
            rows.append(Row(p.stem, json.loads(p.read_text())))
        else:
            raise UserError(f"{p} is neither a compare directory, a run with eval/ results, nor an eval JSON file.")
    return rows, compare_dir
