"""Which precision a training run computes in: fp32, bf16 autocast, or ``auto``, chosen by the machine.

On a GPU with bf16 the choice is bf16 (tensor cores; every GPU run of extrapos uses it). On a CPU bf16
pays only where the CPU multiplies bf16 natively (AMX tiles or AVX-512 BF16's dot products; on AVX2
alone bf16 is emulated and ~20x slower than fp32) *and* the model is wide enough: autocast casts every
weight and activation that enters a matmul, work that grows with d_model while the matmuls grow with
d_model^2, so on a narrow model the casts cost what the faster products save, or more. Measured side
by side, fp32 and bf16 steps interleaved (``benchmarks/bench_precision.py``, docs/results/cpu-profile.md):
on an AMX Xeon (issue 39, 2 threads) bf16 was 1.17-1.38x slower at d 128 (cpu-small) and 1.66x faster
at d 512; on an AVX-512 BF16 EPYC (no AMX, 1 thread, the thread's CPU time) 1.01x at d 128, 0.74x at
d 256 and 0.58x at d 512, and, once the head was fused with the loss under autocast too, 0.72x, 0.62x
and 0.56x. The Xeon's d 128 figure predates that fusion and d 256 was not measured there, so auto takes
bf16 from d_model 256 up and keeps cpu-small in fp32 until the Xeon says otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from extrapos.run.config import RunConfig

#: the precisions train.precision accepts
PRECISIONS = ("fp32", "bf16", "auto")

#: auto picks bf16 on a native-bf16 CPU from this model width up (the measurement in the module's text)
AUTO_BF16_MIN_D_MODEL = 256


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_bf16_units() -> dict[str, bool]:
    """The CPU's native bf16 units: AMX tiles and AVX-512 BF16, as torch's own dispatch sees them
    (``torch.cpu._is_amx_tile_supported``, ``torch.cpu._is_avx512_bf16_supported``: cpuinfo underneath);
    /proc/cpuinfo's flags where this torch lacks those queries."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if amx is not None and avx512_bf16 is not None:
        return {"amx": bool(amx()), "avx512_bf16": bool(avx512_bf16())}
    flags = _cpuinfo_flags()
    return {"amx": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags}


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 / AMX); on AVX2 alone bf16 matmuls are
    emulated and about 20x slower than fp32. torch's capability string says "AVX512" on an AVX-512 CPU
    with or without the bf16 units (an AMX Xeon included), so the units are asked for there."""
    capability = torch.backends.cpu.get_cpu_capability().upper()
    if "AMX" in capability or "BF16" in capability:
        return True
    if capability == "AVX512":
        units = cpu_bf16_units()
        return units["amx"] or units["avx512_bf16"]
    return False


def auto_precision(device: torch.device, d_model: int) -> tuple[str, str]:
    """(precision, why) that ``train.precision = "auto"`` picks for a model of width d_model here."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "a GPU with bf16"
        return "fp32", "a GPU without bf16"
    if device.type != "cpu":
        return "fp32", f"{device.type}: no measured bf16 path"
    capability = torch.backends.cpu.get_cpu_capability()
    if not cpu_has_fast_bf16():
        return "fp32", f"this CPU ({capability}) emulates bf16 (~20x slower than fp32)"
    units = [name for name, key in (("AMX", "amx"), ("AVX-512 BF16", "avx512_bf16")) if cpu_bf16_units()[key]]
    cpu = f"{capability}, {' + '.join(units) or 'bf16 by its capability'}"
    if d_model < AUTO_BF16_MIN_D_MODEL:
        return "fp32", (
            f"d_model {d_model} < {AUTO_BF16_MIN_D_MODEL}: bf16's casts cost what its matmuls save, or "
            f"more, on a model this narrow, even on this native-bf16 CPU ({cpu})"
        )
    return "bf16", f"a native-bf16 CPU ({cpu}) and d_model {d_model} >= {AUTO_BF16_MIN_D_MODEL}"


def resolve_precision(requested: str, device: torch.device, d_model: int) -> str:
    """The precision a run computes in: ``requested`` unless it is "auto"."""
    return auto_precision(device, d_model)[0] if requested == "auto" else requested


def with_resolved_precision(cfg: RunConfig, device: torch.device) -> tuple[RunConfig, str | None]:
    """``cfg`` with train.precision = "auto" replaced by the precision it picks on ``device`` (config.toml
    then records what the run computed in, and a resume on another machine kind is refused rather than
    silently switching precision mid-run), and a line saying the choice; ``cfg`` itself otherwise."""
    if cfg.train.precision != "auto":
        return cfg, None
    precision, why = auto_precision(device, cfg.model.d_model)
    resolved = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
    return resolved, f"train.precision = auto -> {precision}: {why}"


#: the models `extrapos doctor` reports auto's choice for: cpu-small and the d 512 x 6 model
DOCTOR_MODELS = {"cpu-small": 128, "gpt2-tiny": 512}


def precision_facts(device: torch.device) -> dict[str, Any]:
    """What `extrapos doctor` reports: auto's choice on this device for each of DOCTOR_MODELS."""
    return {
        f"{name} (d_model {d})": dict(zip(("precision", "why"), auto_precision(device, d)))
        for name, d in DOCTOR_MODELS.items()
    }
