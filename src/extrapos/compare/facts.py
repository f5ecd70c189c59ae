"""The facts a comparison report states under its tables: what each row ran, on which data, scored how."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extrapos.compare.sweep import Sweep
from extrapos.errors import UserError
from extrapos.presets import read_toml
from extrapos.report.render import Row, loss_rows
from extrapos.report.stats import protocol_name
from extrapos.run.config import RunConfig


def _existing_run_facts(
    sweep: Sweep, run_dirs: dict[tuple[str, int | None], Path], scored: list[Row]
) -> list[str]:
    """One line per ``run = ...`` row: where it came from (an import's source.json, else its config), L_t;
    they have no summary.json (nothing was trained here)."""
    from extrapos.run.config import load_run_config

    facts = []
    for row in (r for r in sweep.rows if r.run):
        path = run_dirs[(row.name, None)]
        cfg = load_run_config(path)
        m = cfg.model
        line = (
            f"{row.name}: existing run {row.run} ({m.flavour}, {m.n_layers} layers, d={m.d_model}, "
            f"{m.n_heads} heads, encoding {m.positions_plan().name}, L_t={cfg.seq_len}"
        )
        source = path / "source.json"
        if source.is_file():
            record = json.loads(source.read_text())
            line += (
                f"; imported from {record.get('source')} ({record.get('architecture')}, context "
                f"{record.get('context_length')}), not trained by this sweep"
            )
        facts.append(
            line + f"; data: corpus {cfg.data.corpus}, tokenizer {Path(str(cfg.data.tokenizer)).name})"
        )
    if scored and scored[0].result is not None:  # scored: loss_rows, whose results are never None
        facts.append(_evaluation_fact(scored[0].result))
    return facts


def precision_of(result: dict[str, Any]) -> str:
    """The precision a result was scored in: its own record, else its request's (results saved before the
    field existed), else fp32 (the only precision of those that had neither)."""
    return result.get("precision") or result.get("request", {}).get("precision") or "fp32"


def _evaluation_fact(result: dict[str, Any]) -> str:
    """What a loss column scored and in which precision."""
    precision = precision_of(result)
    how = "bf16 autocast, losses in fp32" if precision == "bf16" else precision
    return f"{_scored_fact(result)}; scored in {how}"


def _scored_fact(result: dict[str, Any]) -> str:
    """What a loss column scored: next-token targets, or (an encoder) the masked tokens of the BERT mask."""
    if result.get("objective") == "mlm":
        return (
            f"evaluation on the held-out test split, protocol {protocol_name(result)}: masked-LM loss on "
            f"{result['target_tokens']:,} masked "
            f"tokens per length (BERT's 15% / 80-10-10 mask, drawn once per span with seed "
            f"{result.get('mask_seed', 0)}, the same tokens at every length) from {result['documents_used']} "
            "documents"
            + (
                f"; a context-free model (the training split's unigram frequencies) scores "
                f"{result['unigram_loss']:.3f} nats on them: a row near that line has not learned to use "
                "context"
                if result.get("unigram_loss") is not None
                else ""
            )
        )
    if result.get("protocol") == "stream":
        return (
            f"evaluation on the held-out test split, protocol {protocol_name(result)}: its "
            f"{result['documents_in_split']:,} documents joined with end-of-text in a stream of "
            f"{result['stream_tokens']:,} tokens, {result['target_tokens']:,} target tokens in "
            f"{result['blocks']} blocks of {result['block']} spread over it, the same at every length, each "
            "block scored by the window of k x L_t tokens that ends with it; the targets belong to "
            f"{result['documents_used']} documents"
        )
    return (
        f"evaluation on the held-out test split, protocol {protocol_name(result)}: "
        f"{result['target_tokens']:,} target tokens per length from {result['documents_used']} documents"
    )


def _trained_precisions(
    configs: dict[tuple[str, int | None], RunConfig], run_dirs: dict[tuple[str, int | None], Path]
) -> str:
    """The precisions the runs trained in: each run's saved config (where ``auto`` was resolved), else its
    row's; rows that differ are named (a sweep may compare fp32 with bf16 training)."""
    rows_in: dict[str, list[str]] = {}  # precision -> the rows trained in it, in sweep order
    for key, cfg in configs.items():
        precision = cfg.train.precision
        saved = run_dirs[key] / "config.toml" if key in run_dirs else None
        if saved is not None and saved.is_file():
            try:
                precision = read_toml(saved)["train"]["precision"]
            except (OSError, UserError, KeyError, TypeError):
                pass  # a damaged config is the run's own problem; the row's precision stands
        if key[0] not in rows_in.setdefault(precision, []):
            rows_in[precision].append(key[0])
    if len(rows_in) == 1:
        return next(iter(rows_in))
    return " / ".join(f"{precision} ({', '.join(rows)})" for precision, rows in rows_in.items())


def sweep_facts(
    sweep: Sweep,
    configs: dict[tuple[str, int | None], RunConfig],
    run_dirs: dict[tuple[str, int | None], Path],
    rows: list[Row],
    wall: float,
    extension_dirs: dict[tuple[str, int, int | None], Path] | None = None,
) -> list[str]:
    """What a reader needs to judge the table: model size, tokens, corpus, tokenizer, seed, time."""
    summaries = {
        n: json.loads((p / "summary.json").read_text())
        for n, p in run_dirs.items()
        if (p / "summary.json").is_file() and n in configs
    }
    params = sorted({s["parameters"]["total"] for s in summaries.values()})
    tokens = sorted({s["tokens"] for s in summaries.values()})
    scored = loss_rows(rows)
    facts = []
    if configs:
        first = next(iter(configs.values()))
        m, d, t = first.model, first.data, first.train
        facts += [
            f"model: {m.flavour}, {m.n_layers} layers, d={m.d_model}, {m.n_heads} heads, "
            f"{', '.join(f'{p / 1e6:.2f}M' for p in params)} parameters",
            f"training: L_t={first.seq_len}, {', '.join(f'{x:,}' for x in tokens)} tokens per model, "
            f"batch {t.batch_size}, lr {t.lr:g} -> {t.end_lr:g}, {_trained_precisions(configs, run_dirs)}, "
            + (f"seeds {', '.join(map(str, sweep.seeds))}" if sweep.seeds else f"seed {t.seed}"),
            f"data: corpus {d.corpus}, tokenizer {d.tokenizer}; "
            + (
                _evaluation_fact(scored[0].result)
                if scored and scored[0].result is not None  # loss_rows: never None
                else "no loss columns (loss = false): the task columns below are the evaluation"
            ),
            (
                "each row trained once per seed: within a seed every row has the same data order, across "
                "seeds the "
                "initialisation and the data order differ and the evaluation targets do not; numbers are "
                "means over "
                "seeds; same budget, no per-method tuning"
            )
            if sweep.seeds
            else "every row trained with the same data order, budget and seed; no per-method tuning",
        ]
    facts += _existing_run_facts(sweep, run_dirs, scored if not configs else [])
    train_wall = sum(s.get("wall_time") or 0.0 for s in summaries.values())
    facts.append(
        f"sweep wall time {wall / 60:.1f} min (this invocation; reused runs cost nothing)"
        + (
            f"; the {len(summaries)} trained runs took {train_wall / 60:.1f} min of training in all, "
            "as their summaries record"
            if summaries
            else ""
        )
    )
    if extension_dirs:
        parents = [
            json.loads((p / "parent.json").read_text())
            for p in extension_dirs.values()
            if (p / "parent.json").is_file()
        ]
        ext_tokens = sorted({p["tokens"] for p in parents})
        facts.append(
            f"extension: {len(extension_dirs)} runs from the trained rows' final checkpoints, "
            f"L_e = {', '.join(str(x) for x in sorted({p['extended_length'] for p in parents}))}, "
            f"{', '.join(f'{x:,}' for x in ext_tokens)} tokens per run (the same for every method), "
            "fresh AdamW, lr continuing from the parent's final one (max(end_lr, 0.1 x lr) -> end_lr); each "
            "L_e column scores the same held-out windows "
            "of L_e tokens for every row, but each column scores its own spans (cut in L_e-token pieces from "
            "the documents long enough for that L_e), so compare rows within a column, not columns with "
            "each other"
        )
    if sweep.notes:
        facts.append(sweep.notes.strip())
    return facts
