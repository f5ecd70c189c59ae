"""Why does ExPE fail past 4x on the medium table? Its loss against the position VALUE it sees (issue 47).

    python benchmarks/expe_mechanism.py --out docs/results/expe-mechanism --runs runs/expe-mechanism
    python benchmarks/expe_mechanism.py --out /tmp/m --quick --data DIR --set model.vocab_size=512

ExPE (Datseris et al., ExPE, eq. 3) writes p_n[k] = scale * theta * (n + k) into the first l dims of every
block's Q/K input, with theta = 1 / (4 L_t): the model reads the position as a number, and in training it
only ever read indices n <= L_t - 1. The hypothesis this measures, not assumes: the loss at a position
depends on the VALUE index x scale the encoding hands the model, not on the index (the context length) or
the window, so it rises where index x scale passes L_t, and the paper's inference-time scale 0.5 moves that
point from L_t to 2 L_t (0.25: to 4 L_t).

What it does, in one process:

1. trains one ExPE model (``--config``, default cpu/small with the medium preset's data regime: code,
   packed rows with a document mask and positions restarting at each document; ``--set`` overrides);
2. scores it with ``extrapos eval``'s documents protocol at ev = 1..16 for each scale (the saved results
   give the loss per length with its interval over documents, and the per-position curve of the 16 x L_t
   windows in buckets, where a target at index i has exactly i tokens of context, whatever the scale);
3. scores the 16 x L_t windows once more per scale keeping every token's loss, to bin them by index and by
   value per document: a loss per bin with its 95 % interval over documents, and, paired over the same
   documents, each scale minus scale 1 at the same VALUE and at the same INDEX. If the value is what
   matters, the same-value differences are near 0 and the same-index ones are not;
4. writes ``OUT/mechanism.json`` (paths relative to OUT or ``$EXTRAPOS_CACHE``), ``OUT/report.md`` (its
   tables) and ``OUT/mechanism.png`` (loss against index and against value, one curve per scale).

The run goes to ``RUNS/expe`` (``--runs``, default ``OUT/runs``; the committed result keeps it in the
checkout's ignored ``runs/``, out of docs/); a second invocation reuses the trained run and its saved
evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: the medium preset's data regime on the cpu/small model (L_t = 64): python-stdlib code, packed rows, a
#: document mask, positions restarting at each document (docs/results/medium.md differs in the model, L_t,
#: the tokenizer, bf16 and the budget)
FULL_OVERRIDES = [
    'model.positions.name="expe"',
    'data.corpus="python-stdlib"',
    "data.packed=true",
    "data.document_mask=true",
    'data.document_positions="restart"',
    "train.tokens=800_000",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.threads=1",
]
#: the smallest run that goes through every step (tests): a 2-layer d 64 model, L_t = 16, a few steps
QUICK_OVERRIDES = [
    'model.positions.name="expe"',
    "model.train_length=16",
    "train.steps=6",
    "train.batch_size=4",
    "train.warmup=1",
    "train.log_every=1",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.threads=1",
]
#: the paper's scale 0.5, a quarter, and 2 (which should move the rise inside the trained window, to L_t / 2)
SCALES = (1.0, 0.5, 0.25, 2.0)
LENGTHS = (1, 2, 4, 8, 16)
#: bins of index (or value) in units of L_t; the first is the trained range
EDGES = (0, 1, 2, 4, 8, 16, 32)


@dataclass
class Settings:
    config: str = "cpu/small"
    overrides: list[str] = field(default_factory=lambda: list(FULL_OVERRIDES))
    data: str | None = None
    scales: tuple[float, ...] = SCALES
    lengths: tuple[int, ...] = LENGTHS
    max_tokens: int = 32_768
    buckets_per_lt: int = 8  # per-position buckets per L_t of the 16 x L_t windows (L_t 64: 8 positions each)
    threads: int = 1
    quick: bool = False


# ---- the three steps --------------------------------------------------------------------------------------


def train_run(s: Settings, run_dir: Path) -> dict[str, Any]:
    """Train the ExPE run (or reuse a finished one in ``run_dir``); its config, budget and wall time."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    overrides = list(s.overrides) + ([f"data.dir={json.dumps(s.data)}"] if s.data else [])
    cfg = load_config(s.config, overrides)
    summary = run_dir / "summary.json"
    if not summary.is_file():
        t0 = time.perf_counter()
        train(cfg, run_dir, progress=False)
        print(f"trained in {time.perf_counter() - t0:.0f} s")
    info = json.loads(summary.read_text()) if summary.is_file() else {}
    return {
        "config": s.config,
        "overrides": overrides,
        "train_length": cfg.model.train_length,
        "model": {"layers": cfg.model.n_layers, "d_model": cfg.model.d_model, "heads": cfg.model.n_heads},
        "summary": {k: info.get(k) for k in ("steps", "tokens", "wall_time", "final_loss", "val_loss")},
    }


def request(s: Settings, scale: float, L: int) -> Any:
    from extrapos.evaluate import EvalRequest

    return EvalRequest(
        lengths=list(s.lengths),
        max_tokens=s.max_tokens,
        position_options={} if scale == 1.0 else {"scale": scale},
        buckets=s.buckets_per_lt * max(s.lengths),
    )


def evaluate_scale(s: Settings, run_dir: Path, scale: float, L: int) -> dict[str, Any]:
    """``extrapos eval`` of the run at one scale: the saved result, summarised (loss per length with its
    interval, change from ev = 1 paired, the per-position buckets with their values)."""
    from extrapos.evaluate import evaluate
    from extrapos.report.stats import MIN_DOCUMENTS, length_difference, length_interval

    t0 = time.perf_counter()
    result = evaluate(run_dir, request(s, scale, L), progress=False)
    # the result's own scoring time: a second invocation reuses the result and keeps the time it took
    seconds = result.get("wall_time", time.perf_counter() - t0)
    rows = []
    for r in result["results"]:
        enough = len(r.get("doc_index", [])) >= MIN_DOCUMENTS
        iv = length_interval(result, r["ev"])[0] if enough else None
        diff = length_difference(result, r["ev"], min(s.lengths))[0] if enough else None
        rows.append(
            {
                "ev": r["ev"],
                "loss": r["loss"],
                "interval": None if iv is None else [iv.low, iv.high],
                "minus_ev1": None if diff is None else [diff.estimate, diff.low, diff.high],
            }
        )
    pp = result["per_position"]
    mids = [(a + b - 1) / 2 for a, b in zip(pp["starts"], pp["ends"])]
    return {
        "scale": scale,
        "result": str(run_dir / "eval" / f"{result['name']}.json") if "name" in result else None,
        "documents": result.get("documents_used"),
        "seconds": seconds,
        "lengths": rows,
        "per_position": {
            "starts": pp["starts"],
            "ends": pp["ends"],
            "index_mid": mids,
            "value_mid": [m * scale for m in mids],
            "loss": pp["loss"],
        },
    }


def token_losses_by_scale(s: Settings, run_dir: Path) -> tuple[dict[float, np.ndarray], np.ndarray, int]:
    """Every target's loss in the 16 x L_t windows (the spans the evaluation scored), per scale: ({scale:
    (spans, 16 L_t)}, each span's document, L_t)."""
    import torch

    from extrapos.evaluate import load_eval_inputs, score_windows
    from extrapos.run.handle import Run

    inputs = load_eval_inputs(Run.open(run_dir), request(s, 1.0, 0), None, "cpu", False)
    spans = torch.from_numpy(inputs.spans)
    out = {}
    for scale in s.scales:
        inputs.run.model.pos.set_options(scale=scale)
        out[scale] = score_windows(inputs.run.model, spans, inputs.max_len, 16_384, "fp32").numpy()
    return out, np.asarray(inputs.owners), inputs.L


# ---- the statistics ---------------------------------------------------------------------------------------


def doc_sums(losses: np.ndarray, owners: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-document loss sums and token counts over the index ``columns`` of every span."""
    docs, which = np.unique(owners, return_inverse=True)
    part = losses[:, columns].astype(np.float64).sum(axis=1)
    sums = np.bincount(which, weights=part, minlength=len(docs))
    counts = np.bincount(which, minlength=len(docs)) * len(columns)
    return sums, counts.astype(np.float64)


def columns_where(L: int, width: int, scale: float, lo: float, hi: float, axis: str) -> np.ndarray:
    """The indices i < width whose index (axis "index") or value i x scale (axis "value") lies in [lo L_t,
    hi L_t)."""
    i = np.arange(width)
    x = i * scale if axis == "value" else i.astype(float)
    return i[(x >= lo * L) & (x < hi * L)]


def interval(sums: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    from extrapos.report.stats import MIN_DOCUMENTS, loss_interval

    mean = float(sums.sum() / counts.sum())
    if len(sums) < MIN_DOCUMENTS:
        return {"loss": mean, "interval": None}
    iv = loss_interval(sums, counts)
    return {"loss": mean, "interval": [iv.low, iv.high]}


def paired(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """a minus b over the same documents, with its paired 95 % interval."""
    from extrapos.report.stats import MIN_DOCUMENTS, paired_difference

    est = float(a[0].sum() / a[1].sum() - b[0].sum() / b[1].sum())
    if len(a[0]) < MIN_DOCUMENTS:
        return {"difference": est, "interval": None}
    iv = paired_difference(a[0], a[1], b[0], b[1])
    return {"difference": est, "interval": [iv.low, iv.high]}


def bin_tables(losses: dict[float, np.ndarray], owners: np.ndarray, L: int) -> dict[str, Any]:
    """Loss by index bin and by value bin per scale, the same-value and same-index differences to scale 1,
    and each scale's loss past the trained values against inside them."""
    width = next(iter(losses.values())).shape[1]
    reach = {"index": width, "value": width * max(losses)}
    bins = {a: [(lo, hi) for lo, hi in zip(EDGES[:-1], EDGES[1:]) if lo * L < reach[a]] for a in reach}
    out: dict[str, Any] = {"by_value": [], "by_index": [], "to_scale_1": []}
    for axis in ("value", "index"):
        for lo, hi in bins[axis]:
            row: dict[str, Any] = {"lo": lo, "hi": hi, "scales": {}}
            for scale, x in losses.items():
                cols = columns_where(L, width, scale, lo, hi, axis)
                row["scales"][str(scale)] = (
                    None if len(cols) == 0 else {**interval(*doc_sums(x, owners, cols)), "tokens": len(cols)}
                )
            out[f"by_{axis}"].append(row)
    base = losses[1.0]
    for lo, hi in bins["index"]:
        row = {"lo": lo, "hi": hi, "scales": {}}
        for scale, x in losses.items():
            if scale == 1.0:
                continue
            cell = {}
            for axis in ("value", "index"):
                cols = columns_where(L, width, scale, lo, hi, axis)
                ref = columns_where(L, width, 1.0, lo, hi, axis)
                cell[f"same_{axis}"] = (
                    None if len(cols) == 0 else paired(doc_sums(x, owners, cols), doc_sums(base, owners, ref))
                )
            row["scales"][str(scale)] = cell
        out["to_scale_1"].append(row)
    out["inside_outside"] = []
    for scale, x in losses.items():
        inside, outside = (columns_where(L, width, scale, lo, hi, "value") for lo, hi in ((0, 1), (1, 1e9)))
        a, b = doc_sums(x, owners, inside), doc_sums(x, owners, outside)
        out["inside_outside"].append(
            {
                "scale": scale,
                "inside": interval(*a),
                "outside": None if len(outside) == 0 else interval(*b),
                "outside_minus_inside": None if len(outside) == 0 else paired(b, a),
            }
        )
    return out


def max_value_change(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each scale's change with length (ev = k minus its own ev = 1) keyed by the largest value its windows
    hold, k x scale (in L_t): if the value drives the rise, the scales agree at equal largest values."""
    rows: dict[float, dict[str, Any]] = {}
    for e in evaluations:
        for r in e["lengths"]:
            m = r["ev"] * e["scale"]
            rows.setdefault(m, {"max_value": m, "scales": {}})["scales"][str(e["scale"])] = {
                "ev": r["ev"],
                "change": r["minus_ev1"],
            }
    return [rows[m] for m in sorted(rows)]


# ---- report and plot --------------------------------------------------------------------------------------


def fmt(cell: dict[str, Any] | None, key: str = "loss", sign: bool = False) -> str:
    if cell is None:
        return "–"
    v = cell[key]
    text = f"{v:+.3f}" if sign else f"{v:.3f}"
    if cell.get("interval") is None:
        return text
    lo, hi = cell["interval"]
    return f"{text} [{lo:+.3f}, {hi:+.3f}]" if sign else f"{text} [{lo:.3f}, {hi:.3f}]"


def scale_name(scale: float) -> str:
    return f"x{scale:g}"


def bin_name(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g}) L_t"


def report_md(doc: dict[str, Any]) -> str:
    """The report's tables (the results page copies them under `table from` markers)."""
    scales = [e["scale"] for e in doc["evaluations"]]
    head = " | ".join(scale_name(x) for x in scales)
    rule = "|---|" + "---:|" * len(scales)
    wall, load = doc["wall_seconds"], doc["machine"]
    lines = [
        f"# {doc['title']}",
        "",
        f"- run: {doc['run']} ({doc['train']['config']} with {', '.join(doc['train']['overrides'])})",
        f"- L_t: {doc['L_t']}; documents: {doc['documents']}; targets per length: {doc['targets']}",
        f"- wall time: {wall['total'] / 60:.1f} min (training {wall['train'] / 60:.1f} min, evaluation "
        f"{wall['evaluate'] / 60:.1f} min, token losses {wall['token_losses'] / 60:.1f} min), one thread, "
        f"load average {load['load_average_before'][0]:.1f} before and {load['load_average_after'][0]:.1f} "
        "after",
        "",
        "Loss per length (nats, 95 % interval over documents), each scale applied at inference:",
        "",
        "| scale | " + " | ".join(f"ev={r['ev']}" for r in doc["evaluations"][0]["lengths"]) + " |",
        "|---|" + "---:|" * len(doc["evaluations"][0]["lengths"]),
    ]
    for e in doc["evaluations"]:
        cells = [fmt({"loss": r["loss"], "interval": r["interval"]}) for r in e["lengths"]]
        lines.append(f"| {scale_name(e['scale'])} | " + " | ".join(cells) + " |")
    lines += ["", "Change with length (ev = k minus ev = 1, paired):", ""]
    lines += [
        "| scale | " + " | ".join(f"ev={r['ev']} - ev=1" for r in doc["evaluations"][0]["lengths"][1:]) + " |"
    ]
    lines += ["|---|" + "---:|" * (len(doc["evaluations"][0]["lengths"]) - 1)]
    for e in doc["evaluations"]:
        cells = [
            "–"
            if r["minus_ev1"] is None
            else fmt({"d": r["minus_ev1"][0], "interval": r["minus_ev1"][1:]}, "d", sign=True)
            for r in e["lengths"][1:]
        ]
        lines.append(f"| {scale_name(e['scale'])} | " + " | ".join(cells) + " |")
    bins = doc["bins"]
    for axis, words in (
        ("value", "position VALUE index x scale"),
        ("index", "position INDEX (the context a target has)"),
    ):
        lines += ["", f"Loss of the 16 x L_t windows' targets by {words} (nats, 95 % interval):", ""]
        lines += [f"| {axis} | {head} |", rule]
        for row in bins[f"by_{axis}"]:
            cells = [fmt(row["scales"][str(x)]) for x in scales]
            lines.append(f"| {bin_name(row['lo'], row['hi'])} | " + " | ".join(cells) + " |")
    others = [x for x in scales if x != 1.0]
    lines += ["", "Each scale minus x1 at the same value and at the same index (paired over documents):", ""]
    lines += [
        "| bin | "
        + " | ".join(f"{scale_name(x)} same value | {scale_name(x)} same index" for x in others)
        + " |",
        "|---|" + "---:|" * (2 * len(others)),
    ]
    for row in bins["to_scale_1"]:
        cells = []
        for x in others:
            c = row["scales"][str(x)]
            cells += [fmt(c[f"same_{a}"], "difference", sign=True) for a in ("value", "index")]
        lines.append(f"| {bin_name(row['lo'], row['hi'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Change with length (ev = k minus the same scale's ev = 1, paired) by the largest value the windows "
        "hold, k x scale:",
        "",
        f"| largest value | {head} |",
        rule,
    ]
    for row in doc["max_value_change"]:
        cells = []
        for x in scales:
            c = row["scales"].get(str(x))
            if c is None:
                cells.append("–")
            elif c["ev"] == min(doc["lengths"]):
                cells.append(f"ev={c['ev']}: reference")
            elif c["change"] is None:
                cells.append(f"ev={c['ev']}: –")
            else:
                d = {"d": c["change"][0], "interval": c["change"][1:]}
                cells.append(f"ev={c['ev']}: {fmt(d, 'd', sign=True)}")
        lines.append(f"| {row['max_value']:g} L_t | " + " | ".join(cells) + " |")
    lines += ["", "Past the trained values against inside them (value < L_t), per scale:", ""]
    lines += ["| scale | value < L_t | value >= L_t | outside - inside |", "|---|---:|---:|---:|"]
    for r in bins["inside_outside"]:
        lines.append(
            f"| {scale_name(r['scale'])} | {fmt(r['inside'])} | {fmt(r['outside'])} | "
            f"{fmt(r['outside_minus_inside'], 'difference', sign=True)} |"
        )
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> bool:
    """Loss against index and against value, one curve per scale; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'extrapos[plots]').")
        return False
    L = doc["L_t"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    base = next(e for e in doc["evaluations"] if e["scale"] == 1.0)["per_position"]["loss"]
    for e in doc["evaluations"]:
        pp, label = e["per_position"], scale_name(e["scale"])
        colour = axes[0].plot([m / L for m in pp["index_mid"]], pp["loss"], lw=1, label=label)[0].get_color()
        axes[1].plot([m / L for m in pp["value_mid"]], pp["loss"], lw=1, color=colour, label=label)
        if e["scale"] != 1.0:  # the same targets and context: only the value differs
            diff = [a - b for a, b in zip(pp["loss"], base)]
            axes[2].plot([m / L for m in pp["index_mid"]], diff, lw=1, color=colour, label=f"{label} - x1")
    axes[1].sharey(axes[0])
    axes[2].axhline(0.0, color="black", lw=0.6)
    for ax, what in zip(
        axes, ("index (context) / L_t", "value = index x scale, / L_t", "index (context) / L_t")
    ):
        ax.axvline(1.0, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(what)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss (nats), per-position buckets of 16 x L_t windows")
    axes[0].set_title("against the index")
    axes[1].set_title("against the value ExPE writes")
    axes[2].set_title("each scale minus x1 at the same index")
    axes[2].set_ylabel("loss difference (nats)")
    axes[1].legend(title="scale")
    axes[2].legend()
    fig.suptitle(doc["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---- the whole ------------------------------------------------------------------------------------------


def run(s: Settings, out: Path, runs: Path | None = None) -> dict[str, Any]:
    import torch

    from extrapos.data.cache import cache_root
    from extrapos.report.portable import portable_tree

    torch.set_num_threads(s.threads)
    out = out.resolve()  # every path the JSON names is made relative to it below
    out.mkdir(parents=True, exist_ok=True)
    run_dir = (runs.resolve() if runs is not None else out / "runs") / "expe"
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    trained = train_run(s, run_dir)
    L = trained["train_length"]
    evaluations = [evaluate_scale(s, run_dir, scale, L) for scale in s.scales]
    t2 = time.perf_counter()
    losses, owners, _ = token_losses_by_scale(s, run_dir)
    t3 = time.perf_counter()
    # times of the work itself (the trainer's and each saved result's own), so that a second invocation,
    # which reuses the run and the results, reports what they cost when they were made
    train_s = float(trained["summary"].get("wall_time") or 0.0)
    eval_s = float(sum(e["seconds"] for e in evaluations))
    bins = bin_tables(losses, owners, L)
    # the evaluation's own per-position buckets and the token losses binned alike agree (the same targets)
    check = max(
        abs(float(losses[e["scale"]][:, a:b].mean()) - v)
        for e in evaluations
        for a, b, v in zip(e["per_position"]["starts"], e["per_position"]["ends"], e["per_position"]["loss"])
    )
    doc = {
        "title": "ExPE's loss against the position value it sees (index x inference-time scale)",
        "question": "does ExPE's loss past L_t follow the value index x scale, or the index?",
        "quick": s.quick,
        "run": str(run_dir),
        "train": trained,
        "L_t": L,
        "lengths": list(s.lengths),
        "scales": list(s.scales),
        "documents": len(np.unique(owners)),
        "targets": int(owners.size * losses[1.0].shape[1]),
        "buckets_per_lt": s.buckets_per_lt,
        "evaluations": evaluations,
        "bins": bins,
        "per_position_check_max_abs": check,
        "max_value_change": max_value_change(evaluations),
        "wall_seconds": {
            "train": train_s,
            "evaluate": eval_s,
            "token_losses": t3 - t2,
            "total": train_s + eval_s + (t3 - t2),
            "this_invocation": t3 - t0,
        },
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": s.threads,
            "torch": torch.__version__,
            "load_average_before": load_before,
            "load_average_after": list(os.getloadavg()),
        },
    }
    doc = portable_tree(doc, out, cache_root())
    (out / "mechanism.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "report.md").write_text(report_md(doc))
    plot(doc, out / "mechanism.png")
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--out", required=True, help="the folder for mechanism.json, report.md, the plot and runs/"
    )
    p.add_argument("--runs", default=None, help="folder for the trained run (default OUT/runs)")
    p.add_argument("--quick", action="store_true", help="a tiny model and budget: seconds, for the tests")
    p.add_argument("--config", default=None, help="the training preset (default cpu/small; --quick cpu/tiny)")
    p.add_argument("--data", default=None, help="a prepared data directory to train and score on")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="one more training override")
    p.add_argument("--max-tokens", type=int, default=None, help="target tokens scored per length")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    s = Settings(threads=a.threads, data=a.data, quick=a.quick)
    if a.quick:
        s.config, s.overrides, s.max_tokens, s.buckets_per_lt = "cpu/tiny", list(QUICK_OVERRIDES), 2048, 4
    if a.config:
        s.config = a.config
    s.overrides += a.overrides
    if a.max_tokens:
        s.max_tokens = a.max_tokens
    doc = run(s, Path(a.out), Path(a.runs) if a.runs else None)
    print(report_md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
