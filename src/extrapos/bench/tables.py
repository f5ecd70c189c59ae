"""The bench's Markdown: the per-encoding table (CPU or GPU), the peer line and the targets of
issues 15 and 28."""

from __future__ import annotations

from typing import Any

from extrapos.bench.llama_peer import format_peer

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


def target_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, met) for every figure of TARGETS this run measured."""
    rows = []
    k = max(r["settings"]["eval_lengths"])
    for label, what, names, target, higher in TARGETS:
        if what == "peer":
            if not r.get("peer"):
                continue
            vals = {"": r["peer"]["ratio"]}
        elif what == "mfu":  # on a GPU fp32 has no MFU (format_bench)
            vals = {
                n: r["train_fp32"][n]["mfu"]
                for n in names
                if r["train_fp32"].get(n, {}).get("mfu") is not None
            }
        elif what == "train":
            vals = {n: r["train_fp32"][n]["ratio"] for n in names if n in r["train_fp32"]}
        elif what == "decode":
            gen = r["generation"]
            vals = {n: gen[n]["decode_ms"] / gen["nope"]["decode_ms"] for n in names if n in gen}
        else:
            et = r["eval_time"]
            vals = {n: et[n][f"time_ms_{k}x"] / et["nope"][f"time_ms_{k}x"] for n in names if n in et}
        if not vals:
            continue
        worst = min(vals.values()) if higher else max(vals.values())
        fmt = (lambda v: f"{v:.1%}") if what == "mfu" else (lambda v: f"{v:.2f}")
        shown = ", ".join(f"{n} {fmt(v)}" if n else fmt(v) for n, v in vals.items())
        met = worst >= target if higher else worst <= target
        rows.append((label, shown, ("> " if higher else "<= ") + fmt(target), "yes" if met else "no"))
    return rows


def format_targets(r: dict[str, Any]) -> str:
    lines = ["| figure (issues 15, 28) | measured | target | met |", "|---|---|---|---|"]
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


def format_bench(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["machine"]
    bf16_peak = m.get("matmul_peak_gflops_bf16")
    gpu = "gpu" in m
    header = (
        _gpu_header(r)
        if gpu
        else f"Model {s['size']} (vocab {s['vocab']}), L_t = {s['train_length']}, batch {s['batch']}, "
        f"{s['threads']} threads, torch {s['torch']}, CPU capability {m.get('cpu_capability', '?')}; matmul "
        "peak "
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
    lines = [
        header,
        "",
        "| encoding | train fp32 ms (x nope) | MFU fp32 | train bf16 ms (x nope) | MFU bf16 | "
        + ("train peak MB fp32 | train peak MB bf16 | " if gpu else "")
        + " | ".join(f"eval {k}x ms (x)" for k in s["eval_lengths"])
        + " | "
        + " | ".join(f"peak MB {k}x (x)" for k in s["eval_lengths"])
        + " | decode ms/token (x) | cached tok/s | recompute tok/s | cache speedup |",
        "|---|" + "---:|" * (4 + 2 * gpu + 2 * len(s["eval_lengths"]) + 4),
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
    if r.get("peer"):
        lines += ["", format_peer(r["peer"])]
    lines += ["", format_targets(r)]
    lines += ["", format_resolution(r["resolution"]), "", f"bench wall time {r['wall_time_s']:.0f} s"]
    return "\n".join(lines)
