"""The bench's Markdown: the per-encoding table (CPU or GPU), the peer line and the targets of
issues 15 and 28."""

from __future__ import annotations

from typing import Any

from extrapos.bench.llama_peer import format_peer
from extrapos.bench.noise import WITHHELD, round_ratios, verdict

#: the figures of issues 15 and 28 and their targets: (label, what, encodings, target, higher is better)
TARGETS = [
    ("training step vs NoPE: Kerple log / power", "train", ("kerple-log", "kerple-power"), 1.10, False),
    ("training step vs NoPE: T5 bias", "train", ("t5",), 1.10, False),
    ("training step vs NoPE: FIRE", "train", ("fire",), 1.15, False),
    ("training step vs NoPE: K-CABLE", "train", ("k-cable",), 1.10, False),
    (
        "evaluation time at 16 x L_t vs NoPE, pairwise biases",
        "eval16",
        ("kerple-log", "kerple-power", "fire", "t5", "k-cable"),
        1.5,
        False,
    ),
    (
        "evaluation time at 16 x L_t vs NoPE, folded biases (issue 28)",
        "eval16",
        ("alibi", "cable", "cable-nw", "cable-official", "fox"),
        1.10,
        False,
    ),
    (
        "decode ms/token vs NoPE, bias encodings (issue 28)",
        "decode",
        ("alibi", "cable", "cable-nw", "cable-official", "fox", "kerple-log", "kerple-power", "t5"),
        1.25,
        False,
    ),
    ("training MFU, fp32 (vs the matmul peak measured in this run)", "mfu", ("nope",), 0.65, True),
    ("llama + RoPE training step vs transformers LlamaForCausalLM", "peer", (), 0.90, False),
]


def _paired(rows: dict[str, Any], n: str, key: str) -> list[float] | None:
    """An encoding's per-round ratios to NoPE from the rounds' times under ``key``, when both were kept."""
    mine, base = rows[n].get(key), rows.get("nope", {}).get(key)
    return round_ratios(mine, base) if mine and base and len(mine) == len(base) else None


Figure = tuple[float, list[float] | None]  # a median and its rounds (None: not kept)


def _figures(r: dict[str, Any], what: str, names: tuple[str, ...]) -> dict[str, Figure]:
    """(median figure, per-round figures or None) of every encoding a target names that this run measured."""
    k = max(r["settings"]["eval_lengths"])
    if what == "peer":
        return {"": (r["peer"]["ratio"], r["peer"].get("ratio_rounds"))} if r.get("peer") else {}
    if what == "mfu":  # on a GPU fp32 has no MFU (format_bench)
        tf = r["train_fp32"]
        return {
            n: (tf[n]["mfu"], tf[n].get("mfu_rounds")) for n in names if tf.get(n, {}).get("mfu") is not None
        }
    if what == "train":
        tf = r["train_fp32"]
        return {n: (tf[n]["ratio"], tf[n].get("ratio_rounds")) for n in names if n in tf}
    if what == "decode":
        gen = r["generation"]
        return {
            n: (gen[n]["decode_ms"] / gen["nope"]["decode_ms"], _paired(gen, n, "decode_rounds_ms"))
            for n in names
            if n in gen
        }
    et = r["eval_time"]
    return {
        n: (et[n][f"time_ms_{k}x"] / et["nope"][f"time_ms_{k}x"], _paired(et, n, f"rounds_ms_{k}x"))
        for n in names
        if n in et
    }


def target_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, met) for every figure of TARGETS this run measured. Met is "yes" or "no"
    when every round's figure is on that side of the target (``noise.verdict``), else ``~`` and the
    rounds' range that holds the target; a run saved without its rounds is judged on its medians."""
    rows = []
    for label, what, names, target, higher in TARGETS:
        figures = _figures(r, what, names)
        if not figures:
            continue
        fmt = (lambda v: f"{v:.1%}") if what == "mfu" else (lambda v: f"{v:.2f}")
        shown = ", ".join(f"{n} {fmt(v)}" if n else fmt(v) for n, (v, _) in figures.items())
        rounds = {n: rs if rs else [v] for n, (v, rs) in figures.items()}
        met = verdict(rounds, target, higher)
        if met == WITHHELD:
            held = [
                f"{n} {fmt(min(rs))}-{fmt(max(rs))}".strip()
                for n, rs in rounds.items()
                if min(rs) <= target <= max(rs)
            ]
            met = f"{WITHHELD} (rounds {', '.join(held)})"
        rows.append((label, shown, ("> " if higher else "<= ") + fmt(target), met))
    return rows


def format_targets(r: dict[str, Any]) -> str:
    lines = [
        "| figure (issues 15, 28) | measured (medians) | target "
        "| met (`~`: the rounds' range holds the target) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in target_rows(r)]
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "–"


def _gpu_header(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["machine"]
    peak = m.get("bf16_peak_tflops")
    mfu_text = (
        f"MFU of the bf16 step against the {m['bf16_peak_of']} dense bf16 peak, {peak:.0f} TFLOP/s "
        "(datasheet); no MFU for fp32 (its peak depends on TF32 and is not in the table)"
        if peak
        else f"no MFU: {m['gpu']!r} is not in the table of dense bf16 peaks (perf.GPU_BF16_PEAKS)"
    )
    return (
        f"Model {s['size']} (vocab {s['vocab']}), L_t = {s['train_length']}, batch {s['batch']}, on "
        f"{m['gpu']} ({m['device']}), torch {s['torch']}; each encoding alone on the GPU. Times are "
        "absolute, medians; peak MB is torch.cuda.max_memory_allocated (training: the whole step, weights "
        f"and AdamW state included; evaluation, in {m['eval_precision']}: above the resident weights); "
        f"{mfu_text}. Ratios are to `nope` (lower is better, except speedup)."
        + ("" if r["train_bf16"] else " The bf16 columns are skipped: this GPU has no bf16.")
    )


def _percent(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "–"


def _units(units: dict[str, bool] | None) -> str:
    if units is None:
        return ""
    have = [name for name, key in (("AMX", "amx"), ("AVX-512 BF16", "avx512_bf16")) if units.get(key)]
    return f" ({', '.join(have)})" if have else " (no native bf16 unit)"


def _load(load: dict[str, Any] | None) -> str:
    if not load:
        return ""
    known = [f"{v:.1f}" for v in load["load_samples"] if v is not None]
    return f", load average {' / '.join(known) or '?'} (before, during, after) on {load['cores']} cores"


def _compiled_cells(r: dict[str, Any], n: str) -> list[str]:
    """The compiled steps' cells: ms (x nope) and x eager, per precision measured compiled."""
    cells = []
    for precision in ("fp32", "bf16"):
        rows = r.get(f"train_{precision}_compiled")
        if rows:
            row, eager = rows[n], r[f"train_{precision}"][n]
            cells += [
                f"{row['step_ms']:.1f} ({_num(row['ratio'])})",
                f"{row['step_ms'] / eager['step_ms']:.2f}",
            ]
    return cells


def _num(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "–"


def _paired_line(label: str, rows: dict[str, Any], base: dict[str, Any]) -> str:
    """One step over another per encoding, median ratio and the range of the per-round ratios."""
    parts = []
    for n in rows:
        rounds = round_ratios(rows[n]["rounds_ms"], base[n]["rounds_ms"]) if "rounds_ms" in rows[n] else None
        ratio = rows[n]["step_ms"] / base[n]["step_ms"]
        span = f" ({min(rounds):.2f}-{max(rounds):.2f})" if rounds else ""
        parts.append(f"{n} {ratio:.2f}{span}")
    return f"{label}: " + ", ".join(parts)


def format_bench(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["machine"]
    bf16_peak = m.get("matmul_peak_gflops_bf16")
    gpu = "gpu" in m
    header = (
        _gpu_header(r)
        if gpu
        else f"Model {s['size']} (vocab {s['vocab']}), L_t = {s['train_length']}, batch {s['batch']}, "
        f"{s['threads']} threads, torch {s['torch']}, CPU capability {m.get('cpu_capability', '?')}"
        + _units(m.get("bf16_units"))
        + _load(r.get("load"))
        + ("; times are the thread's CPU time (--clock cpu)" if s.get("clock") == "cpu" else "")
        + "; matmul peak (best of timed bursts at 1024 and 2048 and of the samples between the steps) "
        f"{m['matmul_peak_gflops_fp32']:.0f} GFLOP/s fp32"
        + (f", {bf16_peak:.0f} GFLOP/s bf16" if bf16_peak else "")
        + ". Ratios are to `nope` (lower is better, except speedup)."
        + (
            ""
            if r["train_bf16"]
            else " The bf16 columns are skipped: this CPU has no native bf16 "
            "(emulated bf16 runs ~20x slower than fp32 and would measure nothing a user runs)."
        )
    )
    compiled_columns = len(_compiled_cells(r, next(iter(r["train_fp32"]))))
    lines = [
        header,
        "",
        "| encoding | train fp32 ms (x nope) | MFU fp32 | train bf16 ms (x nope) | MFU bf16 | "
        + ("train peak MB fp32 | train peak MB bf16 | " if gpu else "")
        + " | ".join(f"eval {k}x ms (x)" for k in s["eval_lengths"])
        + " | "
        + " | ".join(f"peak MB {k}x (x)" for k in s["eval_lengths"])
        + " | decode ms/token (x) | cached tok/s | recompute tok/s | cache speedup |"
        + "".join(
            f" train {p} compiled ms (x nope) | compiled / eager {p} |"
            for p in ("fp32", "bf16")
            if r.get(f"train_{p}_compiled")
        ),
        "|---|" + "---:|" * (4 + 2 * gpu + 2 * len(s["eval_lengths"]) + 4 + compiled_columns),
    ]
    tf, tb, et, em, gen = r["train_fp32"], r["train_bf16"], r["eval_time"], r["eval_memory"], r["generation"]
    for n in tf:
        cells = [f"{tf[n]['step_ms']:.1f} ({tf[n]['ratio']:.2f})", _percent(tf[n]["mfu"])]
        cells += (
            [f"{tb[n]['step_ms']:.1f} ({tb[n]['ratio']:.2f})", _percent(tb[n]["mfu"])]
            if tb
            else ["skipped", "-"]
        )
        if gpu:
            cells += [f"{tf[n]['peak_mb']:.0f}", f"{tb[n]['peak_mb']:.0f}" if tb else "-"]
        for k in s["eval_lengths"]:
            cells.append(
                f"{et[n][f'time_ms_{k}x']:.1f} "
                f"({_ratio(et[n][f'time_ms_{k}x'], et['nope'][f'time_ms_{k}x'])})"
            )
        for k in s["eval_lengths"]:
            cells.append(
                f"{em[n][f'peak_mb_{k}x']:.0f} "
                f"({_ratio(em[n][f'peak_mb_{k}x'], em['nope'][f'peak_mb_{k}x'])})"
            )
        cells += [
            f"{gen[n]['decode_ms']:.2f} ({_ratio(gen[n]['decode_ms'], gen['nope']['decode_ms'])})",
            f"{gen[n]['cached_tok_s']:.0f}",
            f"{gen[n]['recompute_tok_s']:.1f}",
            f"{gen[n]['cache_speedup']:.1f}x",
        ]
        cells += _compiled_cells(r, n)
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if "cable" in gen and "alibi" in gen:
        lines += [
            "",
            "CABLE decoding per token / ALiBi's: "
            f"{gen['cable']['decode_ms'] / gen['alibi']['decode_ms']:.2f}",
        ]
    from extrapos.bench.resolution import format_resolution

    lines += [
        "",
        "Spread of the training repeats ((max - min) / median), fp32: "
        + ", ".join(f"{n} {tf[n]['spread']:.0%}" for n in tf if "spread" in tf[n]),
    ]
    if tb and not gpu:  # the precisions ran in the same rounds: their ratio is paired like the encodings'
        lines += ["", _paired_line("bf16 step / fp32 step (per-round range)", tb, tf)]
    load = r.get("load")
    if load and load.get("warning"):
        lines += ["", f"**Warning**: {load['warning']}"]
    if r.get("peer"):
        lines += ["", format_peer(r["peer"])]
    lines += ["", format_targets(r)]
    lines += ["", format_resolution(r["resolution"]), "", f"bench wall time {r['wall_time_s']:.0f} s"]
    return "\n".join(lines)
