"""fp32 against bf16 autocast training steps, side by side, at several model widths (issue 39): the
measurement behind ``train.precision = "auto"`` (run/precision.py).

    python benchmarks/bench_precision.py                              # cpu-small, d 256, gpt2-tiny; 1 thread
    python benchmarks/bench_precision.py --threads 2 --models cpu-small gpt2-tiny --repeats 7

Each model is the bench's (``extrapos bench``: NoPE, vocab 8192, L_t 256, the trainer's fused AdamW and
fused head + loss), its fp32 and bf16 steps in the same interleaved rounds (``bench_steps``), so each
round gives a paired bf16 / fp32 ratio: a ratio below 1 in every round means bf16 pays here. A model
is a preset name, or PRESET:WIDTH for the preset at another d_model (``cpu-small:256``). The CPU
capability, its bf16 units, the threads and the load average (before and after) head the output.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from extrapos.bench.measure import BenchSettings, bench_steps
from extrapos.bench.noise import load_average, round_ratios
from extrapos.model import Decoder, model_config
from extrapos.run.precision import auto_precision, cpu_bf16_units, cpu_has_fast_bf16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["cpu-small", "cpu-small:256", "gpt2-tiny"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="cpu",
        help="the thread's CPU time (default; needs --threads 1) or wall time",
    )
    args = ap.parse_args(argv)
    if args.threads < 1 or args.batch < 1 or args.repeats < 1:
        print("--threads, --batch and --repeats must be at least 1.", file=sys.stderr)
        return 2
    if args.clock == "cpu" and args.threads != 1:
        print(
            "--clock cpu needs --threads 1 (the thread's CPU time is the whole step only then).",
            file=sys.stderr,
        )
        return 2
    if not cpu_has_fast_bf16():
        print(
            "this CPU has no native bf16: bf16 is emulated (~20x slower), nothing to compare.",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    loads = [load_average()]
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, bf16 units {cpu_bf16_units()}, "
        f"{args.threads} thread(s), torch {torch.__version__}, batch {args.batch} x 256, "
        f"{args.repeats} interleaved rounds, {args.clock} clock"
    )
    print("\n| model | params | fp32 step ms | bf16 step ms | bf16 / fp32 (rounds) | auto picks |")
    print("|---|---:|---:|---:|---:|---|")
    for model in args.models:
        size, _, width = model.partition(":")
        s = BenchSettings(
            size=size,
            d_model=int(width) if width else None,
            batch=args.batch,
            repeats=args.repeats,
            clock=args.clock,
        )
        t0 = time.perf_counter()
        steps = bench_steps(["nope"], s, [("fp32", False), ("bf16", False)], lambda: None)
        fp32, bf16 = steps["train_fp32"]["nope"], steps["train_bf16"]["nope"]
        rounds = round_ratios(bf16["rounds_ms"], fp32["rounds_ms"])
        span = f"{min(rounds):.2f}-{max(rounds):.2f}"
        cfg = model_config(size, vocab_size=s.vocab, **({"d_model": int(width)} if width else {}))
        params = sum(p.numel() for p in Decoder(cfg).parameters())
        print(
            f"| {size} d {cfg.d_model} x {cfg.n_layers} | {params / 1e6:.1f}M | {fp32['step_ms']:.0f} | "
            f"{bf16['step_ms']:.0f} | {bf16['step_ms'] / fp32['step_ms']:.2f} ({span}) | "
            f"{auto_precision(torch.device('cpu'), cfg.d_model)[0]} |",
            flush=True,
        )
        print(f"  ({time.perf_counter() - t0:.0f} s, load {load_average()})", file=sys.stderr, flush=True)
    loads.append(load_average())
    print(f"\nload average before / after: {' / '.join(f'{v:.1f}' for v in loads if v is not None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
