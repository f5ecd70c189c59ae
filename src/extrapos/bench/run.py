"""One `extrapos bench` invocation: which encodings, then every measurement on the CPU or the GPU."""

from __future__ import annotations

import time
from typing import Any

import torch

from extrapos.bench.gpu import CudaDevice, gpu_settings, run_bench_gpu
from extrapos.bench.llama_peer import bench_peer
from extrapos.bench.measure import (
    BenchSettings,
    bench_eval_memory,
    bench_eval_time,
    bench_generation,
    bench_training,
)
from extrapos.errors import UserError
from extrapos.positions import registry
from extrapos.run.perf import matmul_peak_flops
from extrapos.run.runtime import cpu_has_fast_bf16


def bench_names(encodings: list[str] | None = None) -> list[str]:
    """The encodings a bench measures: every registered one unless asked for some, and NoPE (the ratios'
    denominator) in any case."""
    names = encodings or registry.names()
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        raise UserError(f"unknown encoding {unknown[0]!r}; choose from: {', '.join(registry.names())}.")
    return names if "nope" in names else ["nope"] + names


def run_bench(
    quick: bool = False,
    encodings: list[str] | None = None,
    progress: bool = True,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from extrapos.bench.resolution import position_resolution

    names = bench_names(encodings)
    if torch.device(device).type == "cuda":
        bar = tqdm(total=len(names), disable=not progress, desc="bench", unit="encoding")
        try:
            return run_bench_gpu(
                names, gpu_settings(quick), CudaDevice(torch.device(device)), lambda: bar.update(1)
            )
        finally:
            bar.close()
    s = BenchSettings.for_mode(quick)
    n = len(names)
    total = (
        2 * n * (s.repeats + 1)
        + len(s.eval_lengths) * n * (max(2, s.repeats - 2) + 1)
        + n
        + n * (max(2, s.repeats - 2) + 1)
        + n
        + 2 * 8
    )
    bar = tqdm(total=total, disable=not progress, desc="bench", unit="run")
    tick = lambda: bar.update(1)  # noqa: E731
    t0 = time.perf_counter()
    fast_bf16 = cpu_has_fast_bf16()
    if not fast_bf16:  # emulated bf16 would take ~20x the fp32 time and measure nothing a user runs
        bar.total -= n * (s.repeats + 1)
    result: dict[str, Any] = {
        "settings": s.__dict__ | {"threads": torch.get_num_threads(), "torch": torch.__version__},
        "machine": {
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "matmul_peak_gflops_fp32": matmul_peak_flops("cpu", "fp32") / 1e9,
            "matmul_peak_gflops_bf16": matmul_peak_flops("cpu", "bf16") / 1e9 if fast_bf16 else None,
        },
        "train_fp32": bench_training(names, s, "fp32", tick),
        "train_bf16": bench_training(names, s, "bf16", tick) if fast_bf16 else None,
        "eval_time": bench_eval_time(names, s, tick),
        "eval_memory": bench_eval_memory(names, s, tick),
        "generation": bench_generation(names, s, tick),
        "resolution": position_resolution(train_length=512, multiples=(1, 2, 4, 8, 16)),
        "peer": bench_peer(7, tick),
    }
    bar.close()
    result["wall_time_s"] = time.perf_counter() - t0
    return result
