"""Tables and plots from saved evaluation results, in the papers' style.

Rows are encodings or variants, columns are ev = 1, 2, 4, ...; the best value of each column is
bold. Every loss cell carries a 95% interval from a bootstrap over the held-out documents (with
several seeds, one combining documents and seeds: ``extrapos.report.stats``), and a second table gives
each row's paired difference to a baseline row, flagged "within noise" when its interval contains
0. A result saved before evaluations recorded per-document losses still renders, marked
"(no interval)". The same numbers go to CSV and JSON, and two PNG plots show loss against
evaluation length (log-scaled x, bands = the intervals) and loss by position in the longest
windows. `extrapos report` rebuilds all of it from ``eval/*.json`` files, so a report never needs
a model; the bootstrap is seeded, so a re-rendered report is byte-identical. Encoder rows
(``evaluate_mlm`` results) render the same way, labelled masked-token loss, with a top-1 accuracy
table. Rows of a sweep with task columns also carry task results (passkey, synthetic tasks, lm-eval),
rendered after the loss tables by ``extrapos.report.task_tables``; a sweep with ``loss = false`` has task
tables only.

Every loss table names its evaluation protocol (``extrapos.evaluate``: documents, or the stream with
context crossing documents or document-masked; results saved before the targets were spread are a
protocol of their own). Results of different protocols score different targets with different contexts:
a report of several gets one set of tables per protocol, after one sentence saying so, and never pairs
rows across them.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from extrapos.console import STDERR
from extrapos.errors import UserError
from extrapos.files import ABANDONED_SECONDS, atomic_write, save_png, sweep_temporaries
from extrapos.report import stats
from extrapos.report.portable import portable

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from extrapos.report.task_tables import TaskReport


@dataclass
class Row:
    name: str
    result: dict[str, Any] | None  # an eval/*.json document (None: a task-only row, sweep key loss = false)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> the row's task result
    run_dir: Path | None = None  # the run the result belongs to, where the report knows it

    @property
    def loss(self) -> dict[str, Any]:
        """The loss result of a row that has one: the functions below take ``loss_rows`` only."""
        assert self.result is not None, f"row {self.name!r} has no loss evaluation"
        return self.result

    def metric(self, ev: int, metric: str) -> float | None:
        for r in self.loss["results"]:
            if r["ev"] == ev:
                return r.get(metric)  # None: a field older results do not have (e.g. seq_ppl)
        return None

    @property
    def seeds(self) -> list[dict[str, Any]]:
        """The per-seed results of a row trained once per seed ([] for a single run)."""
        return self.loss.get("seeds") or []


def loss_rows(rows: list[Row]) -> list[Row]:
    """The rows that have a loss evaluation."""
    return [row for row in rows if row.result is not None]


@dataclass(frozen=True)
class Cell:
    """The uncertainty of one (row, ev) cell: its interval and its paired difference to the baseline."""

    interval: stats.Interval | None
    difference: stats.Interval | None
    is_baseline: bool = False


def _columns(rows: list[Row]) -> list[int]:
    return sorted({r["ev"] for row in rows for r in row.loss["results"]})


def baseline_row(rows: list[Row], baseline: str | None) -> Row:
    """The reference row of the differences: the one named ``baseline``, else the first."""
    if baseline is None:
        return rows[0]
    for row in rows:
        if row.name == baseline:
            return row
    raise UserError(
        f"baseline row {baseline!r} is not in the report; the rows are: {', '.join(r.name for r in rows)}."
    )


def cell_intervals(rows: list[Row], baseline: str | None = None) -> dict[tuple[str, int], Cell]:
    """Every cell's bootstrap interval and paired difference to the baseline (None where data is missing)."""
    base = baseline_row(rows, baseline)
    cells = {}
    for ev in _columns(rows):
        ref = stats.cell_samples(base.loss, ev)
        base_finite = is_finite(base.metric(ev, "loss"))
        for row in rows:
            if not is_finite(row.metric(ev, "loss")):
                continue  # missing, or NaN / infinite: flagged in the tables, no interval nor difference
            mine = stats.cell_samples(row.loss, ev)
            interval = stats.loss_interval(mine.sums, mine.counts) if mine is not None else None
            diff = None
            if (
                row is not base
                and base_finite
                and mine is not None
                and ref is not None
                and mine.doc_index == ref.doc_index
                and mine.sums.shape == ref.sums.shape
                and stats.same_targets(row.loss, base.loss)
                and _same_cell_targets(row, ev, base, ev)
                and (mine.counts == ref.counts).all()
            ):
                diff = stats.paired_difference(mine.sums, mine.counts, ref.sums, ref.counts)
            cells[(row.name, ev)] = Cell(interval, diff, row is base)
    return cells


def _same_cell_targets(a: Row, ev_a: int, b: Row, ev_b: int) -> bool:
    """Whether two cells scored the same targets, as far as their rows' ``targets`` digests say (results
    saved before the digest existed have none: then the documents and counts decide alone)."""
    x, y = a.metric(ev_a, "targets"), b.metric(ev_b, "targets")
    return x is None or y is None or x == y


HIGHER_IS_BETTER = ("accuracy",)  # the metrics whose best value is the largest (bold in their table)


def is_mlm(rows: list[Row]) -> bool:
    """Whether every loss row is an encoder's masked-LM evaluation (``evaluate_mlm``): then the tables say
    "masked-token loss" and add the top-1 accuracy."""
    return bool(rows) and all(row.loss.get("objective") == "mlm" for row in rows)


def _number(v: float, metric: str) -> str:
    return f"{v:.2f}" if metric in ("ppl", "seq_ppl") else f"{v:.3f}"


def protocol_groups(rows: list[Row]) -> list[list[Row]]:
    """Loss rows grouped by their evaluation protocol (``stats.protocol_id``), in order of appearance: the
    protocols score different targets with different contexts, so no table holds two of them."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(stats.protocol_id(row.loss), []).append(row)
    return list(groups.values())


def mixed_protocols_note(groups: list[list[Row]]) -> str:
    """The one sentence a report of several protocols opens with."""
    names = "; ".join(stats.protocol_name(g[0].loss) for g in groups)
    return (
        f"These results were scored under {len(groups)} evaluation protocols ({names}), which score "
        "different targets with different contexts, so each protocol has its own tables and no row is "
        "compared across them."
    )


def markdown_table(
    rows: list[Row], metric: str = "loss", cells: dict[tuple[str, int], Cell] | None = None
) -> str:
    """One metric per cell, best of each column in bold; with ``cells``, loss and ppl carry their
    intervals. Rows of different kinds (objective, tokenizer: ``kind_groups``) get tables of their own
    after ``mixed_kinds_note``, and within a kind rows of different protocols after
    ``mixed_protocols_note``."""
    kinds = kind_groups(rows)
    if len(kinds) > 1:
        return "\n\n".join(
            [mixed_kinds_note(kinds)]
            + [f"{label}:\n\n" + _protocol_tables(g, metric, cells) for label, g in kinds]
        )
    return _protocol_tables(rows, metric, cells)


def _protocol_tables(rows: list[Row], metric: str, cells: dict[tuple[str, int], Cell] | None) -> str:
    groups = protocol_groups(rows)
    if len(groups) > 1:
        return "\n\n".join(
            [mixed_protocols_note(groups)]
            + [f"Protocol: {stats.protocol_name(g[0].loss)}\n\n" + _table(g, metric, cells) for g in groups]
        )
    return _table(rows, metric, cells)


# ---- what a number is: objective, tokenizer, finiteness, checkpoint -----------------------------------


def is_finite(v: float | None) -> TypeGuard[float]:
    return v is not None and math.isfinite(v)


def objective_of(result: dict[str, Any]) -> str:
    """``mlm`` for an encoder's masked-token loss (``evaluate_mlm``), ``lm`` for a next-token loss."""
    return "mlm" if result.get("objective") == "mlm" else "lm"


def tokenizer_of(result: dict[str, Any]) -> str | None:
    """The hash of the tokenizer a result's tokens were cut with: recorded in the result, else in the
    manifest of the data it scored (eval refuses data of another tokenizer than the run's); None when
    neither is at hand."""
    recorded = result.get("tokenizer_hash")
    if isinstance(recorded, str):
        return recorded
    data_dir = result.get("data_dir")
    if not isinstance(data_dir, str) or not data_dir:
        return None
    try:
        found = json.loads((Path(data_dir) / "manifest.json").read_text())["tokenizer"]["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if isinstance(found, str) else None


def kind_groups(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """Loss rows grouped by what their losses are, in order of appearance, each with its label: a masked-token
    loss (MLM) and a next-token loss are different quantities, and losses under different tokenizers are per
    different tokens, so no table holds two kinds. A row whose tokenizer is unknown (its data is gone and
    the result predates the recorded hash) joins the others unless they disagree among themselves."""
    found = {id(row): tokenizer_of(row.loss) for row in rows}
    split_tokenizers = len(set(found.values()) - {None}) > 1
    groups: dict[tuple[str, str | None], list[Row]] = {}
    for row in rows:
        groups.setdefault((objective_of(row.loss), found[id(row)] if split_tokenizers else None), []).append(
            row
        )
    split_objectives = len({objective for objective, _ in groups}) > 1

    def label(objective: str, tokenizer: str | None) -> str:
        parts = []
        if split_objectives:
            parts.append("Masked-token (MLM) loss" if objective == "mlm" else "Next-token loss")
        if split_tokenizers:
            parts.append(f"tokenizer {tokenizer}" if tokenizer else "tokenizer unknown")
        text = ", ".join(parts)
        return text[:1].upper() + text[1:]

    return [(label(*key), group) for key, group in groups.items()]


def mixed_kinds_note(kinds: list[tuple[str, list[Row]]]) -> str:
    """The one sentence a report of several kinds of loss opens with, giving the reasons that apply."""
    objectives = {objective_of(row.loss) for _, group in kinds for row in group}
    reasons = (["a masked-token loss is not a next-token loss"] if len(objectives) > 1 else []) + (
        ["losses under different tokenizers are per different tokens"]
        if any("okenizer" in label for label, _ in kinds)
        else []
    )
    return (
        f"These results are {len(kinds)} kinds of loss that cannot be compared "
        f"({'; '.join(k for k, _ in kinds)}: {' and '.join(reasons)}), so each kind has its own tables and "
        "no row is compared across them."
    )


def nonfinite_note(rows: list[Row]) -> str | None:
    """One sentence naming the rows with a NaN or infinite loss, or None."""
    names = [row.name for row in rows if any(not is_finite(r.get("loss")) for r in row.loss["results"])]
    if not names:
        return None
    return (
        f"Not finite: {', '.join(names)} scored a NaN or infinite loss at some length (a diverged model or a "
        "position option outside its range), flagged in the tables and never marked best."
    )


def run_of(row: Row) -> Path | None:
    """The run directory a loss row's result belongs to: the one it was collected from, else the ``run`` the
    result names if that is still a run directory."""
    if row.run_dir is not None:
        return row.run_dir
    named = row.result.get("run") if row.result else None
    if isinstance(named, str) and named and (Path(named) / "config.toml").is_file():
        return Path(named)
    return None


def checkpoint_notes(rows: list[Row]) -> tuple[str | None, list[str]]:
    """The checkpoint step each loss row scored (one sentence), and a warning for each row whose run has
    since reached a newer checkpoint (its row shows older weights than the run now holds)."""
    from extrapos.run import checkpoint as ckpt_io

    steps = {row.name: row.loss.get("checkpoint_step") for row in rows}
    steps = {name: step for name, step in steps.items() if isinstance(step, int)}
    if not steps:
        return None, []
    if len(set(steps.values())) == 1 and len(steps) == len(rows):
        line = f"Checkpoint scored: step {next(iter(steps.values()))} for every row."
    else:
        line = "Checkpoints scored: " + ", ".join(f"{name} step {step}" for name, step in steps.items()) + "."
    warnings = []
    for row in rows:
        run_dir, step = run_of(row), steps.get(row.name)
        if run_dir is None or step is None:
            continue
        newest = max((c.step for c in ckpt_io.list_checkpoints(run_dir)), default=step)
        if newest > step:
            warnings.append(
                f"{row.name} scored step {step} but its run {run_dir} has a newer checkpoint (step "
                f"{newest}); evaluate it again (extrapos eval {run_dir} with the same options) to report "
                "the newer weights."
            )
    return line, warnings


def _table(rows: list[Row], metric: str, cells: dict[tuple[str, int], Cell] | None) -> str:
    cols = _columns(rows)
    best = {}
    pick = max if metric in HIGHER_IS_BETTER else min
    for ev in cols:
        values = [v for row in rows if is_finite(v := row.metric(ev, metric))]
        best[ev] = pick(values) if values else None
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in rows:
        texts = []
        for ev in cols:
            v = row.metric(ev, metric)
            if v is None:
                texts.append("–")
                continue
            if not math.isfinite(v):
                texts.append(f"{'NaN' if math.isnan(v) else v} (not finite)")
                continue
            text = _number(v, metric)
            text = f"**{text}**" if v == best[ev] else text
            if cells is not None and metric in ("loss", "ppl") and (row.name, ev) in cells:
                iv = cells[(row.name, ev)].interval
                if iv is None:
                    text += " (no interval)"
                else:
                    # exp is monotone, so the perplexity interval is the loss interval's image
                    lo, hi = (iv.low, iv.high) if metric == "loss" else (math.exp(iv.low), math.exp(iv.high))
                    text += f" [{_number(lo, metric)}, {_number(hi, metric)}]"
            texts.append(text)
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def difference_table(rows: list[Row], cells: dict[tuple[str, int], Cell]) -> str:
    """Each row minus the baseline (nats), with its paired interval; "within noise" when it contains 0."""
    cols = _columns(rows)
    lines = ["| model | " + " | ".join(f"ev={ev}" for ev in cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in rows:
        texts = []
        for ev in cols:
            cell = cells.get((row.name, ev))
            if cell is None or (cell.difference is None and not cell.is_baseline):
                texts.append("–")
            elif cell.is_baseline:
                texts.append("baseline")
            else:
                d = cell.difference
                assert d is not None  # the first branch took a non-baseline cell without one
                text = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                texts.append(text + (" within noise" if d.contains(0.0) else ""))
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def length_change_table(rows: list[Row]) -> str | None:
    """Each row's loss at ev = k minus its loss at the shortest length, with a paired interval: every
    length scores the same target tokens, so the documents (and seeds) are resampled once for both
    columns; "within noise" when the interval contains 0. This is the question of length extrapolation
    itself (does the row get worse past L_t?). None when no row has the per-document data."""
    cols = _columns(rows)
    if len(cols) < 2:
        return None
    first, rest = cols[0], cols[1:]
    lines = [
        "| model | " + " | ".join(f"ev={ev} - ev={first}" for ev in rest) + " |",
        "|---|" + "---:|" * len(rest),
    ]
    found = False
    for row in rows:
        ref = stats.cell_samples(row.loss, first)
        texts = []
        for ev in rest:
            mine = stats.cell_samples(row.loss, ev)
            if (
                ref is None
                or mine is None
                or not is_finite(row.metric(ev, "loss"))
                or not is_finite(row.metric(first, "loss"))
                or not _same_cell_targets(row, ev, row, first)
                or mine.doc_index != ref.doc_index
                or mine.sums.shape != ref.sums.shape
                or not (mine.counts == ref.counts).all()
            ):
                texts.append("–")
                continue
            d = stats.paired_difference(mine.sums, mine.counts, ref.sums, ref.counts)
            found = True
            text = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
            texts.append(text + (" within noise" if d.contains(0.0) else ""))
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines) if found else None


def seed_table(rows: list[Row]) -> str:
    """Per cell: the per-seed losses' mean and sample standard deviation (training noise alone)."""
    cols = _columns(rows)
    lines = [
        "| model | seeds | " + " | ".join(f"ev={ev}" for ev in cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for row in rows:
        texts = []
        for ev in cols:
            losses = [v for part in row.seeds if (v := Row(row.name, part).metric(ev, "loss")) is not None]
            texts.append(
                f"{statistics.fmean(losses):.3f} ± {statistics.stdev(losses):.3f}" if len(losses) > 1 else "–"
            )
        lines.append(f"| {row.name} | {len(row.seeds) or 1} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _seed_values(row: Row, ev: int, ref_ev: int | None, base: Row | None) -> list[float] | None:
    """One value per training seed: the row's loss at ``ev`` minus the baseline's (the same seed) or minus
    its own loss at ``ref_ev``; None where a seed lacks one or the two rows' seeds are not the same."""
    if base is not None and row.loss.get("seed_values") != base.loss.get("seed_values"):
        return None
    others = base.seeds if base is not None else row.seeds
    if len(others) != len(row.seeds):
        return None
    values = []
    for part, other in zip(row.seeds, others, strict=True):
        mine = Row(row.name, part).metric(ev, "loss")
        theirs = Row(row.name, other).metric(ev if ref_ev is None else ref_ev, "loss")
        if not is_finite(mine) or not is_finite(theirs):
            return None
        values.append(mine - theirs)
    return values


def seed_t_table(rows: list[Row], base: Row | None) -> str | None:
    """For rows trained on 2..4 seeds: each seed's difference (to the baseline's same seed, or, with
    ``base`` None, to the row's own loss at the shortest length) and Student's t 95% interval over them.
    With so few seeds the crossed bootstrap's seed part rests on a handful of numbers; the t-interval takes
    the seed count at its word and is what a sentence about "S seeds" should quote. None when no row has
    2..4 seeds."""
    cols = _columns(rows)
    shown = cols if base is not None else cols[1:]
    if not shown:
        return None
    header = [f"ev={ev}" if base is not None else f"ev={ev} - ev={cols[0]}" for ev in shown]
    lines = ["| model | " + " | ".join(header) + " |", "|---|" + "---:|" * len(shown)]
    found = False
    for row in rows:
        if not 2 <= len(row.seeds) < stats.FEW_SEEDS or (base is not None and row.name == base.name):
            continue
        texts = []
        for ev in shown:
            values = _seed_values(row, ev, None if base is not None else cols[0], base)
            interval = stats.t_interval(values) if values else None
            if values is None or interval is None:
                texts.append("–")
                continue
            found = True
            within = " within noise" if interval[0] <= 0.0 <= interval[1] else ""
            low, high = interval
            texts.append(", ".join(f"{v:+.3f}" for v in values) + f"; t [{low:+.3f}, {high:+.3f}]{within}")
        lines.append(f"| {row.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines) if found else None


def rows_to_csv(rows: list[Row], cells: dict[tuple[str, int], Cell] | None = None) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "model",
            "encoding",
            "applied",
            "ev",
            "window",
            "tokens",
            "loss",
            "ppl",
            "bpb",
            "tail_loss",
            "seq_ppl",
            "seeds",
            "seed_sd",
            "loss_low",
            "loss_high",
            "diff",
            "diff_low",
            "diff_high",
            "accuracy",
            "protocol",
            "step",
        ]
    )

    def fmt(v: float | None, spec: str = ".6f") -> str:
        return "" if v is None else format(v, spec)

    for row in rows:
        for r in row.loss["results"]:
            cell = (cells or {}).get((row.name, r["ev"]), Cell(None, None))
            iv, d = cell.interval, cell.difference
            w.writerow(
                [
                    row.name,
                    row.loss["encoding"],
                    json.dumps(row.loss.get("applied") or {}),
                    r["ev"],
                    r["window"],
                    r["tokens"],
                    f"{r['loss']:.6f}",
                    f"{r['ppl']:.4f}",
                    fmt(r.get("bpb")),
                    fmt(r.get("tail_loss")),
                    fmt(r.get("seq_ppl"), ".4f"),
                    len(row.seeds) or 1,
                    fmt(iv.seed_sd if iv else None),
                    fmt(iv.low if iv else None),
                    fmt(iv.high if iv else None),
                    fmt(d.estimate if d else None),
                    fmt(d.low if d else None),
                    fmt(d.high if d else None),
                    fmt(r.get("accuracy")),
                    stats.protocol_id(row.loss),
                    row.loss.get("checkpoint_step", ""),
                ]
            )
    return buf.getvalue()


def plot(
    rows: list[Row], out_dir: Path, title: str = "", cells: dict[tuple[str, int], Cell] | None = None
) -> list[Path]:
    """loss_vs_length.png (bands: the cells' intervals) and per_position.png; returns the files written
    (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("report: matplotlib is not installed, skipping plots (pip install 'extrapos[plots]').")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    cols = _columns(rows)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for row in rows:
        evs = [r["ev"] for r in row.loss["results"]]
        losses = [r["loss"] for r in row.loss["results"]]
        (line,) = ax.plot(evs, losses, marker="o", label=row.name)
        bands = [(ev, c.interval) for ev in evs if (c := (cells or {}).get((row.name, ev))) and c.interval]
        if bands:
            ax.fill_between(
                [ev for ev, _ in bands],
                [iv.low for _, iv in bands],
                [iv.high for _, iv in bands],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
        # the extrapolation signal itself: how much worse (or better) than at the shortest length
        ax2.plot(evs, [x - losses[0] for x in losses], marker="o", color=line.get_color(), label=row.name)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(cols, [str(c) for c in cols])
        a.set_xlabel("evaluation length / training length (ev)")
        a.grid(alpha=0.3)
    what = "masked-token (MLM) loss" if is_mlm(rows) else "token loss"
    ax.set_ylabel(f"mean {what} (nats)")
    ax.set_title("Loss vs evaluation length", fontsize=10)
    ax2.axhline(0, color="grey", linewidth=1)
    ax2.set_ylabel(f"loss - loss at ev={cols[0]} (nats)")
    ax2.set_title("Change from the shortest length (lower is better)", fontsize=10)
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    p = out_dir / "loss_vs_length.png"
    save_png(fig, p)
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for row in rows:
        pp = row.loss.get("per_position")
        if not pp:
            continue
        mids = [(a + b) / 2 for a, b in zip(pp["starts"], pp["ends"])]
        # an MLM bucket without a masked token has no loss (None): a gap in the line
        ax.plot(mids, [math.nan if v is None else v for v in pp["loss"]], label=row.name)
    train_len = rows[0].loss["train_length"] if rows else None
    if train_len:
        ax.axvline(train_len, color="grey", linestyle="--", linewidth=1, label="training length")
    ax.set_xlabel("position in the longest window")
    ax.set_ylabel(f"mean {what} (nats)")
    ax.set_title("Loss by position (bucket means)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "per_position.png"
    save_png(fig, p)
    plt.close(fig)
    written.append(p)
    return written


def _uncertainty_note(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """What the brackets mean, in the report itself."""
    intervals = [c.interval for c in cells.values() if c.interval is not None]
    seeds = sorted({iv.seeds for iv in intervals})
    docs = sorted({iv.documents for iv in intervals})
    lines = []
    if intervals:
        how = (
            f"a bootstrap over the held-out documents ({', '.join(map(str, docs))} per cell; documents are "
            f"resampled, not tokens, {stats.RESAMPLES} resamples, seed {stats.BOOTSTRAP_SEED})"
        )
        if seeds != [1]:
            how += (
                " crossed with the training seeds (each resample also draws seeds with replacement, "
                "deviations rescaled by sqrt(S/(S-1))); the number is the mean over seeds"
            )
        lines.append(f"[a, b] = {round(stats.LEVEL * 100)}% interval from {how}.")
        if seeds == [1]:
            lines.append(
                "One training seed per row: the intervals cover the choice of held-out documents, not "
                "training noise (another seed, data order or machine can move a row by more than a "
                "difference printed here; `seeds = [0, 1, 2]` in the sweep measures it)."
            )
        if docs[0] < 10:
            lines.append(
                f"Few documents ({docs[0]}): a bootstrap over so few units is rough and tends to be too "
                "narrow; score more (`--max-eval-tokens`) to tighten it."
            )
    if any(c.interval is None for c in cells.values()):
        lines.append(
            "(no interval): the result was saved before evaluations recorded per-document losses; "
            "evaluate it again (`extrapos eval --overwrite`, or delete its eval JSON) to get one."
        )
    return lines


def write_report(
    rows: list[Row],
    out_dir: Path,
    title: str,
    facts: list[str] | None = None,
    baseline: str | None = None,
    sequence_ppl: bool = False,
    tasks: Sequence[TaskReport] = (),
) -> Path:
    """report.md + results.csv + results.json + plots/ in ``out_dir``; returns the report path.

    ``baseline``: the row the differences are taken to (default: the first); ``sequence_ppl``: add
    the segmented-sequences paper's aggregate (mean of per-window perplexities, Karypis et al. eq. 3);
    ``tasks``: the sections of the task columns (the registered tasks, ``tasks.task.registry``; a task
    without one is reported as an accuracy per length).
    """
    from extrapos.report import task_tables as tables

    task_rows = [row for row in rows if row.tasks]
    rows = loss_rows(rows)
    if not rows and not task_rows:
        raise UserError("nothing to report: no evaluation results were found; run `extrapos eval` first.")
    out_dir.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(out_dir, older_than=ABANDONED_SECONDS)  # what a killed report left before a rename
    parts = [f"# {title}", ""]
    if facts:
        parts += [f"- {f}" for f in facts] + [""]
    cells: dict[tuple[str, int], Cell] = {}
    if rows:
        baseline_row(rows, baseline)  # a named baseline must be a row of the report
        steps, warnings = checkpoint_notes(rows)
        for warning in warnings:
            logger.warning(f"extrapos: warning: {warning}", extra=STDERR)
        parts += [line for line in [steps, *(f"Warning: {w}" for w in warnings)] if line] + [""]
    kinds = kind_groups(rows)
    if len(kinds) == 1:
        parts += _protocol_sections(
            rows, out_dir, title, baseline, sequence_ppl, out_dir / "plots", "##", cells
        )
    elif kinds:
        # one set of tables per kind of loss; the baseline row is the named one where it is, else the first
        parts += [mixed_kinds_note(kinds), ""]
        for label, group in kinds:
            base = baseline if baseline in {row.name for row in group} else None
            plots = out_dir / "plots" / _slug(label)
            parts += [f"## {label}", ""]
            parts += _protocol_sections(group, out_dir, title, base, sequence_ppl, plots, "###", cells) + [""]
    if task_rows:
        parts += ([""] if rows else []) + tables.task_sections(
            task_rows, tables.plot_tasks(task_rows, out_dir / "plots", tasks), baseline, tasks
        )
        _atomic_write(out_dir / "tasks.csv", tables.tasks_csv(task_rows, tasks))
    report = out_dir / "report.md"
    _atomic_write(report, "\n".join(parts) + "\n")
    if rows:
        _atomic_write(out_dir / "results.csv", rows_to_csv(rows, cells))
        saved = [{**r.loss, "eval_name": r.loss["name"], "name": r.name} for r in rows]
        # the runs and data it names, relative to out_dir or the cache: the file means the same in a clone
        _atomic_write(out_dir / "results.json", json.dumps(portable(saved, out_dir), indent=1))
    return report


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def _protocol_sections(
    rows: list[Row],
    out_dir: Path,
    title: str,
    baseline: str | None,
    sequence_ppl: bool,
    plot_dir: Path,
    heading: str,
    cells: dict[tuple[str, int], Cell],
) -> list[str]:
    """The loss part of the report for rows of one kind: one set of tables, or one per protocol (headed by
    ``heading``) after ``mixed_protocols_note``; fills ``cells``."""
    groups = protocol_groups(rows)
    if len(groups) == 1:
        loss_parts, group_cells = _loss_sections(rows, out_dir, title, baseline, sequence_ppl, plot_dir)
        cells.update(group_cells)
        return loss_parts
    parts = [mixed_protocols_note(groups), ""]
    for group in groups:
        base = baseline if baseline in {row.name for row in group} else None
        plots = plot_dir / stats.protocol_id(group[0].loss)
        loss_parts, group_cells = _loss_sections(group, out_dir, title, base, sequence_ppl, plots)
        parts += [f"{heading} Protocol: {stats.protocol_name(group[0].loss)}", ""] + loss_parts + [""]
        cells.update(group_cells)
    return parts


def _loss_sections(
    rows: list[Row], out_dir: Path, title: str, baseline: str | None, sequence_ppl: bool, plot_dir: Path
) -> tuple[list[str], dict[tuple[str, int], Cell]]:
    """The loss part of the report for rows of one protocol (tables with intervals, differences to the
    baseline, plots in ``plot_dir``) and its cells."""
    base = baseline_row(rows, baseline)
    cells = cell_intervals(rows, base.name)
    plots = plot(rows, plot_dir, title, cells)
    mlm = is_mlm(rows)
    parts = [
        f"Protocol: {stats.protocol_name(rows[0].loss)}.",
        "",
        (
            "Mean masked-token loss (MLM, nats) on the same masked tokens at every length (encoders, "
            "`evaluate_mlm`); best per column in bold."
            if mlm
            else "Mean token loss (nats) on the same target tokens at every length; best per column in bold."
        ),
        "",
    ]
    parts += _uncertainty_note(cells) + [""]
    flagged = nonfinite_note(rows)
    if flagged is not None:
        parts += [flagged, ""]
    parts += [
        markdown_table(rows, "loss", cells),
        "",
        f"Difference to the baseline row ({base.name}), row minus baseline in nats (negative = better), with "
        "its paired-bootstrap interval (the same documents and seeds resampled for both rows); "
        '"within noise" when the interval contains 0:',
        "",
        difference_table(rows, cells),
        "",
    ]
    change = length_change_table(rows)
    if change is not None:
        parts += [
            "Change with length: each row's loss at ev = k minus its own loss at the shortest length "
            "(the same target tokens, paired-bootstrap interval; positive = worse with more context):",
            "",
            change,
            "",
        ]
    if any(row.seeds for row in rows):
        parts += [
            "Spread across seeds: mean ± sample standard deviation of the per-seed losses "
            "(training noise alone, on fixed documents):",
            "",
            seed_table(rows),
            "",
        ]
        for table, what in (
            (seed_t_table(rows, base), f"difference to the baseline ({base.name}, the same seed)"),
            (seed_t_table(rows, None), "change with length (ev = k minus the shortest length)"),
        ):
            if table is not None:
                parts += [
                    f"Over the seeds alone, {what}: each seed's value, then Student's t 95% interval over "
                    f"them (fewer than {stats.FEW_SEEDS} seeds, so the crossed bootstrap above rests its "
                    "seed part on a handful of numbers; the t-interval is the one a sentence about these "
                    'seeds quotes; "within noise" when it contains 0):',
                    "",
                    table,
                    "",
                ]
    parts += [
        f"Perplexity, exp(mean {'masked-token' if mlm else 'token'} loss):",
        "",
        markdown_table(rows, "ppl", cells),
        "",
    ]
    if mlm:
        parts += [
            "Top-1 accuracy on the masked tokens (higher is better, best per column in bold):",
            "",
            markdown_table(rows, "accuracy"),
            "",
        ]
    if sequence_ppl:
        parts += [
            "Mean of per-sequence perplexities (the segmented-sequences paper's aggregate, Karypis et al. "
            "eq. 3: exp of each L_e window's mean loss, averaged over windows; at least exp(mean loss)):",
            "",
            markdown_table(rows, "seq_ppl"),
            "",
        ]
    parts += [
        (
            "Loss of the masked tokens among each window's last L_t positions (does more context help?):"
            if mlm
            else "Loss of each window's last L_t tokens (does more context help?):"
        ),
        "",
        markdown_table(rows, "tail_loss"),
        "",
    ]
    for p in plots:
        parts.append(f"![{p.stem}]({p.relative_to(out_dir).as_posix()})")
    return parts, cells


def _atomic_write(path: Path, text: str) -> None:
    atomic_write(path, text)


def _read_rows(compare_dir: Path) -> list[dict[str, Any]]:
    try:
        entries = json.loads((compare_dir / "rows.json").read_text())
        assert isinstance(entries, list) and all(
            (isinstance(e["eval"], str) or e["eval"] is None and e.get("tasks")) and "name" in e
            for e in entries
        )
        assert all(isinstance(p, str) for e in entries for p in (e.get("tasks") or {}).values())
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UserError(
            f"{compare_dir / 'rows.json'} is damaged; rebuild it with `extrapos compare`."
        ) from None
    return entries


def collect_rows(paths: list[str | Path]) -> tuple[list[Row], Path | None]:
    """Rows from a compare directory (its rows.json order), run directories or eval JSON files."""
    rows: list[Row] = []
    compare_dir = None
    for p in map(Path, paths):
        if (p / "rows.json").is_file():
            compare_dir = p
            for entry in _read_rows(p):
                files = {t: p / f for t, f in (entry.get("tasks") or {}).items()}
                f = p / entry["eval"] if entry["eval"] is not None else None
                for g in [f, *files.values()]:
                    if g is not None and not g.resolve().is_relative_to(p.resolve()):
                        raise UserError(
                            f"{p / 'rows.json'} points outside the comparison ({g}); "
                            "rebuild it with `extrapos compare`."
                        )
                tasks = {t: json.loads(g.read_text()) for t, g in files.items() if g.is_file()}
                if f is not None and f.is_file():
                    rows.append(Row(entry["name"], json.loads(f.read_text()), tasks))
                elif tasks:
                    rows.append(Row(entry["name"], None, tasks))
        elif (p / "eval").is_dir():
            for f in sorted((p / "eval").glob("*.json")):
                rows.append(_file_row(f"{p.name}/{f.stem}", json.loads(f.read_text()), p))
        elif p.suffix == ".json" and p.is_file():
            # a run's own result is named as its run directory names it: RUN/eval/X.json -> RUN/X
            in_run = p.parent.name == "eval" and (p.parent.parent / "config.toml").is_file()
            rows.append(
                _file_row(
                    f"{p.parent.parent.name}/{p.stem}" if in_run else p.stem,
                    json.loads(p.read_text()),
                    p.parent.parent if in_run else None,
                )
            )
        elif (p / ".extrapos-compare").is_file():  # made by compare, stopped before its first result
            raise UserError(
                f"{p} is a compare directory whose sweep stopped before it wrote rows.json; run the same "
                "extrapos compare again to resume it, then report."
            )
        else:
            raise UserError(
                f"{p} is neither a compare directory, a run with eval/ results, nor an eval JSON file."
            )
    names = [r.name for r in rows]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # rows are paired and looked up by name: two of one name would be read as one
        raise UserError(
            f"two results would both be the row {twice[0]!r}; give the run directories or results "
            "distinct names (or pass each run directory once)."
        )
    return rows, compare_dir


def _file_row(name: str, doc: dict[str, Any], run_dir: Path | None = None) -> Row:
    """A saved result as a row: a task result (passkey, synthetic:..., lm-eval: it names its ``task``) becomes
    a task row, anything else a loss row; a run's eval/ holds both kinds."""
    task = doc.get("task") if isinstance(doc, dict) else None
    if isinstance(task, str):
        # the column is the task's name, before the colon of a parametrised one (synthetic:copy:...)
        return Row(name, None, {task.split(":")[0]: doc}, run_dir)
    return Row(name, doc, run_dir=run_dir)
