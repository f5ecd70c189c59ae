"""Training throughput of the real `extrapos train` loop and its model-FLOPs utilisation (MFU).

MFU = flops_per_token x tokens/s / the matmul peak measured on this machine in the same precision
(extrapos.run.perf.matmul_peak_flops: best of timed 1024 x 1024 matmuls). Runs the CPU default preset
(cpu/small) for a few dozen steps in fp32 and bf16 autocast, eager and torch.compile'd, on the
prepared default corpus, and prints the median of the logged steps (the first steps are warm-up).
Then the training-step ratios of issue 15 (every pairwise-bias encoding vs NoPE, the bench's model
and batch, interleaved repeats, medians: ``extrapos.bench.bench_training``) with their targets.

    python benchmarks/bench_train.py [--steps 40] [--preset cpu/small] [--no-compile] [--no-ratios]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from extrapos import bench
from extrapos.run.config import load_config
from extrapos.run.perf import matmul_peak_flops
from extrapos.training.trainer import read_metrics, train


def measure(preset: str, precision: str, compile_: bool, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            preset,
            [
                f"train.steps={steps}",
                "train.log_every=1",
                f"train.precision={precision}",
                f"train.compile={'true' if compile_ else 'false'}",
                "train.eval_every=0",
                "train.checkpoint_every=0",
            ],
        )
        train(cfg, Path(tmp) / "run", progress=False)
        logged = [m for m in read_metrics(Path(tmp) / "run") if "tokens_per_s" in m]
    steady = logged[len(logged) // 2 :]  # second half: past warm-up (and compilation)
    return {
        "tokens_per_s": statistics.median(m["tokens_per_s"] for m in steady),
        "mfu": statistics.median(m["mfu"] for m in steady),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu/small")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-ratios", action="store_true", help="skip the per-encoding step ratios")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats of the step ratios")
    args = ap.parse_args()
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    print(
        f"matmul peak: fp32 {matmul_peak_flops('cpu', 'fp32') / 1e9:.0f} GFLOP/s, "
        f"bf16 {matmul_peak_flops('cpu', 'bf16') / 1e9:.0f} GFLOP/s"
    )
    print(f"{'preset':12s} {'precision':9s} {'compile':7s} {'tokens/s':>10s} {'MFU':>6s}")
    for precision in ("fp32", "bf16"):
        for compile_ in (False,) if args.no_compile else (False, True):
            r = measure(args.preset, precision, compile_, args.steps)
            print(
                f"{args.preset:12s} {precision:9s} {str(compile_):7s} {r['tokens_per_s']:10,.0f} "
                f"{r['mfu']:6.1%}",
                flush=True,
            )
    if not args.no_ratios:
        names = ["nope", "kerple-log", "kerple-power", "t5", "fire", "k-cable"]
        s = bench.BenchSettings(repeats=args.repeats)
        train = bench.bench_training(names, s, "fp32", lambda: None)
        print(
            f"\ntraining step, {s.size}, L_t {s.train_length}, batch {s.batch}, fp32, median of {s.repeats} "
            "interleaved repeats (spread = (max - min) / median):"
        )
        for n, v in train.items():
            print(
                f"  {n:14s} {v['step_ms']:8.1f} ms  x{v['ratio']:.2f}  MFU {v['mfu']:.1%}  spread "
                f"{v['spread']:.0%}"
            )
        rows = bench.target_rows({"settings": s.__dict__, "train_fp32": train, "eval_time": {}})
        print()
        for label, shown, target, met in rows:
            print(f"  {label}: {shown} (target {target}: {'met' if met == 'yes' else 'NOT met'})")


if __name__ == "__main__":
    main()
