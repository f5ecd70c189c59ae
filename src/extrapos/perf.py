"""Machine speed: the matrix-multiply peak that model-FLOPs utilisation (MFU) is measured against."""

from __future__ import annotations

import functools
import time

import torch


@functools.lru_cache(maxsize=8)
def matmul_peak_flops(
    device: str = "cpu", precision: str = "fp32", n: int = 1024, seconds: float = 0.4
) -> float:
    """FLOP/s of an n x n matmul on this device in this precision (best of a few timed bursts).

    This is the honest ceiling for MFU here: the same machine, the same dtype, the best-shaped
    dense kernel torch has. bf16 uses autocast-equivalent bf16 inputs.
    """
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dev, dtype)
    b = torch.randn(n, n, generator=g).to(dev, dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(3):
        _sync(dev)
        t0 = time.perf_counter()
        reps = 0
        while time.perf_counter() - t0 < seconds / 3:
            a @ b
            reps += 1
        _sync(dev)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
