"""`extrapos bench`: speed and memory of every encoding, as ratios to NoPE measured in one run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="speed and memory of every encoding, as ratios to nope")
    p.add_argument("--quick", action="store_true", help="fewer repeats and a shorter context (a few minutes)")
    p.add_argument("--encodings", default=None, help="comma-separated subset (nope is always included)")
    p.add_argument("--out", default=None, help="write the markdown table here (and the JSON beside it)")
    p.add_argument(
        "--bf16-runs",
        nargs="*",
        default=None,
        metavar="RUN",
        help="also evaluate these runs in fp32 and bf16 autocast (the ExPE/ExQPE resolution check)",
    )
    p.add_argument(
        "--resolution-only", action="store_true", help="print only the bf16 position-resolution table"
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when present), cpu, cuda or cuda:N; on a GPU: GPT-2 small, absolute times, "
        "max_memory_allocated, MFU against the GPU's bf16 peak",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for the run (default: torch's, one per core); on a shared machine a step "
        "with as many threads as cores waits for the other processes, so 1 gives steadier ratios",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time the training step under torch.compile (CPU: inductor's C++ backend; compiling "
        "takes a minute or more per encoding)",
    )
    p.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="what the CPU timings read: wall time, or (with --threads 1) the thread's CPU time, which on a "
        "busy machine leaves out the time a step waited for a core",
    )
    p.add_argument(
        "--size", default=None, help="model preset (default cpu-small; gpt2-tiny is the d 512 x 6 model)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def check_bench_out(out: Path) -> None:
    """``--out`` and the JSON beside it: new, or a table and JSON a bench wrote (its JSON holds the
    settings and the machine)."""
    from extrapos.owned import check_owned_file, json_with_keys

    bench_json = json_with_keys("settings", "machine")
    check_owned_file(out.with_suffix(".json"), "--out", "extrapos bench", bench_json)
    check_owned_file(out, "--out", "extrapos bench", lambda _: bench_json(out.with_suffix(".json")))


def run(args: argparse.Namespace) -> int:
    from extrapos.bench import format_bench, run_bench
    from extrapos.bench.resolution import (
        bf16_eval_delta,
        format_bf16_delta,
        format_resolution,
        position_resolution,
    )
    from extrapos.bench.run import check_cpu_options
    from extrapos.model import model_config
    from extrapos.run.runtime import resolve_device

    # the flags are checked before minutes of measurement, and whatever the run measures
    check_cpu_options(args.threads, args.clock)
    if args.size is not None:
        model_config(args.size)  # an unknown preset is one sentence naming the known ones
    if args.resolution_only:
        print(format_resolution(position_resolution()))
        if args.bf16_runs:
            print(format_bf16_delta(bf16_eval_delta(args.bf16_runs, progress=not args.no_progress)))
        return 0
    if args.out:  # before the measurements: the table and its JSON replace only a bench's own files
        check_bench_out(Path(args.out))
    names = [n.strip() for n in args.encodings.split(",")] if args.encodings else None
    device = resolve_device(args.device, "--device")
    r = run_bench(
        args.quick,
        names,
        progress=not args.no_progress,
        device=device,
        threads=args.threads,
        compile=args.compile,
        size=args.size,
        clock=args.clock,
    )
    if args.bf16_runs:
        r["bf16_eval"] = bf16_eval_delta(args.bf16_runs, progress=not args.no_progress)
    text = format_bench(r)
    if args.bf16_runs:
        text += "\n\nEvaluation loss in fp32 vs bf16 autocast:\n\n" + format_bf16_delta(r["bf16_eval"])
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(r, indent=1))
        print(f"-> {out}")
    return 0
