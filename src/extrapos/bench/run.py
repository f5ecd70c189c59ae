"""One `extrapos bench` invocation: which encodings, then every measurement on the CPU or the GPU."""

from __future__ import annotations

import time
from typing import Any

import torch

from extrapos.bench.gpu import CudaDevice, gpu_settings, run_bench_gpu
from extrapos.bench.llama_peer import bench_peer
from extrapos.bench.measure import (
    CLOCKS,
    BenchSettings,
    bench_eval_memory,
    bench_eval_time,
    bench_generation,
    bench_steps,
    machine_peak,
    variant_key,
)
from extrapos.bench.noise import load_average, load_facts, load_warning, usable_cores
from extrapos.errors import UserError
from extrapos.model import model_config
from extrapos.positions import registry
from extrapos.run.precision import cpu_bf16_units
from extrapos.run.runtime import cpu_has_fast_bf16


def bench_names(encodings: list[str] | None = None) -> list[str]:
    """The encodings a bench measures: every registered one unless asked for some, and NoPE (the ratios'
    denominator) in any case."""
    names = encodings or registry.names()
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        raise UserError(f"unknown encoding {unknown[0]!r}; choose from: {', '.join(registry.names())}.")
    return names if "nope" in names else ["nope"] + names


#: more torch threads than this is a typo, not a machine (torch refuses far larger counts with a traceback)
MAX_THREADS = 1024


def check_cpu_options(threads: int | None, clock: str) -> None:
    """The CPU bench's --threads and --clock, checked before any measurement."""
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise UserError(f"--threads must be between 1 and {MAX_THREADS}, got {threads}.")
    if clock not in CLOCKS:
        raise UserError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}.")
    if clock == "cpu" and threads != 1:
        raise UserError(
            "--clock cpu times the calling thread's CPU time, which is the whole step only when torch runs "
            "one thread; add --threads 1."
        )


def run_bench(
    quick: bool = False,
    encodings: list[str] | None = None,
    progress: bool = True,
    device: str | torch.device = "cpu",
    threads: int | None = None,
    compile: bool = False,
    size: str | None = None,
    clock: str = "wall",
) -> dict[str, Any]:
    """One bench; on the CPU ``threads`` sets torch's intra-op threads for the run (restored after),
    ``compile`` adds the torch.compile'd step beside the eager one, ``size`` a model preset, ``clock``
    what the timings read (measure.CLOCKS; "cpu" needs one thread)."""
    names = bench_names(encodings)
    if torch.device(device).type == "cuda":
        from tqdm.auto import tqdm

        bar = tqdm(total=len(names), disable=not progress, desc="bench", unit="encoding")
        try:
            return run_bench_gpu(
                names, gpu_settings(quick), CudaDevice(torch.device(device)), lambda: bar.update(1)
            )
        finally:
            bar.close()
    check_cpu_options(threads, clock)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_bench_cpu(names, quick, progress, threads, compile, size, clock)
    finally:
        torch.set_num_threads(before)


def _run_bench_cpu(
    names: list[str],
    quick: bool,
    progress: bool,
    threads: int | None,
    compile: bool,
    size: str | None,
    clock: str = "wall",
) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from extrapos.bench.resolution import position_resolution

    loads = [load_average()]  # before anything runs: the other processes' load alone
    s = BenchSettings.for_mode(quick)
    s.threads, s.compile, s.clock = threads, compile, clock
    if size is not None:
        model_config(size)  # an unknown preset is one sentence naming the known ones
        s.size = size
    fast_bf16 = cpu_has_fast_bf16()
    # emulated bf16 would take ~20x the fp32 time and measure nothing a user runs
    precisions = ["fp32", "bf16"] if fast_bf16 else ["fp32"]
    variants = [(p, c) for c in ([False, True] if compile else [False]) for p in precisions]
    n = len(names)
    total = (
        len(variants) * n * (s.repeats + 1)
        + len(s.eval_lengths) * n * (max(2, s.repeats - 2) + 1)
        + n
        + n * (max(2, s.repeats - 2) + 1)
        + n
        + 2 * 8
    )
    bar = tqdm(total=total, disable=not progress, desc="bench", unit="run")
    tick = lambda: bar.update(1)  # noqa: E731
    n_threads = torch.get_num_threads()
    warning = load_warning(loads, n_threads, usable_cores())
    if warning:  # said now, so a user can stop a run that would measure the other processes
        bar.write(f"extrapos bench: {warning}")
    t0 = time.perf_counter()
    peaks = {p: machine_peak(p, clock) for p in precisions}
    steps = bench_steps(names, s, variants, tick, peak_floor=peaks)
    loads.append(load_average())
    for p in precisions:  # the best sample of the run, when it beat the bursts before it
        peaks[p] = max([peaks[p]] + [row["peak_gflops"] * 1e9 for row in steps[variant_key(p)].values()])
    result: dict[str, Any] = {
        "settings": s.__dict__ | {"threads": n_threads, "torch": torch.__version__},
        "machine": {
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "bf16_units": cpu_bf16_units(),
            "matmul_peak_gflops_fp32": peaks["fp32"] / 1e9,
            "matmul_peak_gflops_bf16": peaks["bf16"] / 1e9 if fast_bf16 else None,
        },
        "train_fp32": steps["train_fp32"],
        "train_bf16": steps.get("train_bf16"),
        **{key: rows for key, rows in steps.items() if key.endswith("_compiled")},
        "eval_time": bench_eval_time(names, s, tick),
    }
    loads.append(load_average())
    result |= {
        "eval_memory": bench_eval_memory(names, s, tick),
        "generation": bench_generation(names, s, tick),
        "resolution": position_resolution(train_length=512, multiples=(1, 2, 4, 8, 16)),
        "peer": bench_peer(7, tick, clock),
    }
    loads.append(load_average())
    result["load"] = load_facts(loads, n_threads)
    bar.close()
    result["wall_time_s"] = time.perf_counter() - t0
    return result
