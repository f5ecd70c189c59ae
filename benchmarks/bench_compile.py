"""Eager against compiled training steps of a config preset, side by side (issue 39): the measurement behind
cpu/medium's ``train.compile = true``.

    python benchmarks/bench_compile.py --config cpu/medium --precisions fp32 bf16     # 1 thread, CPU time
    python benchmarks/bench_compile.py --config cpu/small --set model.train_length=256 --rounds 7

Each precision builds two Trainers on the preset's own data (its step: data, precision, document mask,
fused head + loss, fused AdamW), one eager and one with ``train.compile = true``, warms each up (the
compiled one compiles then; that time is printed), then times their steps in alternating rounds, so each
round gives a paired compiled / eager ratio. One thread and the thread's CPU time by default: on a shared
machine the wall clock mostly measures the other processes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from extrapos.bench.noise import load_average
from extrapos.run.config import load_config
from extrapos.training.trainer import Trainer


def _load() -> str:
    value = load_average()
    return "n/a" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="cpu/medium", help="a config preset or .toml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per trainer (compilation)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.warmup < 1 or args.threads < 1:
        print("--rounds, --warmup and --threads must be at least 1.", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(
        f"{args.config} {' '.join(args.set)}; CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.threads} thread(s), torch {torch.__version__}, {args.rounds} alternating rounds, "
        f"{'thread CPU' if args.threads == 1 else 'wall'} time, load average {_load()}"
    )
    print("\n| precision | eager step ms | compiled step ms | compiled / eager (rounds) | first compile s |")
    print("|---|---:|---:|---:|---:|")
    scratch = Path(tempfile.mkdtemp(prefix="extrapos-bench-compile-"))
    try:
        for precision in args.precisions:
            trainers, compile_s = {}, 0.0
            steps = args.warmup + args.rounds
            for compiled in (False, True):
                cfg = load_config(
                    args.config,
                    [*args.set, f'train.precision="{precision}"', f"train.compile={str(compiled).lower()}"],
                )
                cfg = replace(cfg, train=replace(cfg.train, steps=steps, tokens=None, epochs=None))
                run_dir = scratch / f"{precision}-{compiled}"
                run_dir.mkdir()
                t0 = time.perf_counter()
                trainer = Trainer(cfg, run_dir, torch.device("cpu"), 0, 1, progress=False)
                for i in range(args.warmup):
                    trainer.train_step(i)
                if compiled:
                    compile_s = time.perf_counter() - t0
                trainers[compiled] = trainer
            times: dict[bool, list[float]] = {False: [], True: []}
            for r in range(args.rounds):
                for compiled in (False, True) if r % 2 == 0 else (True, False):
                    c = clock()
                    trainers[compiled].train_step(args.warmup + r)
                    times[compiled].append(clock() - c)
            ratios = [c / e for c, e in zip(times[True], times[False])]
            eager, comp = statistics.median(times[False]), statistics.median(times[True])
            print(
                f"| {precision} | {eager * 1000:.1f} | {comp * 1000:.1f} | {comp / eager:.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}) | {compile_s:.0f} |",
                flush=True,
            )
            del trainers
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nload average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
