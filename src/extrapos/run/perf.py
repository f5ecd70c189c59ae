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


#: Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from the vendors' datasheets, by a pattern of
#: the name ``torch.cuda.get_device_name`` reports; the first match wins. MFU on a GPU is measured
#: against these (PaLM's definition: model FLOPs per second over the hardware's peak), not a matmul
#: timed here as on the CPU.
GPU_BF16_PEAKS: list[tuple[str, str, float]] = [
    (r"H100.*PCIe", "H100 PCIe", 756e12),
    (r"H100.*(HBM3|SXM)", "H100 SXM", 989e12),  # the SXM part reports "NVIDIA H100 80GB HBM3"
    (r"H200", "H200", 989e12),
    (r"A100", "A100", 312e12),
    (r"L40S", "L40S", 362e12),
    (r"\bL4\b", "L4", 121e12),
    (r"\bA10\b", "A10", 125e12),
    (r"RTX 4090", "RTX 4090", 165e12),
]


def gpu_bf16_peak(device_name: str) -> tuple[str, float] | None:
    """(the table's name, dense bf16 peak in FLOP/s) of a GPU, or None when it is not in the table."""
    import re

    for pattern, label, peak in GPU_BF16_PEAKS:
        if re.search(pattern, device_name):
            return label, peak
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None) -> float | None:
    """Model-FLOPs utilisation: achieved model FLOP/s over the peak; None without a peak."""
    return flops_per_token * tokens_per_s / peak_flops if peak_flops else None
