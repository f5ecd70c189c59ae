"""The bench on one GPU: GPT-2 small, each encoding alone on the card, absolute times,
``torch.cuda.max_memory_allocated`` and MFU against the GPU's dense bf16 peak."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from extrapos.bench.measure import BenchSettings, bench_model, timing_spread
from extrapos.losses import model_loss_sum
from extrapos.model import flops_per_token
from extrapos.run.perf import gpu_bf16_peak, mfu


class CudaDevice:
    """What the GPU bench asks CUDA: its name, bf16 support, synchronisation and the allocator's
    counters (``torch.cuda.max_memory_allocated``). One object, so the tests stand in for it on CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def name(self) -> str:
        return torch.cuda.get_device_name(self.device)

    def bf16(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def max_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def free(self) -> None:
        torch.cuda.empty_cache()


def gpu_settings(quick: bool) -> BenchSettings:
    """GPT-2 small (124M) at L_t = 1024 (quick: 512): big enough that a GPU is busy, so the times and
    the MFU mean something, small enough for one 24 GB card."""
    full = BenchSettings(
        size="gpt2-small",
        vocab=50304,
        train_length=1024,
        batch=8,
        eval_lengths=(1, 4, 16),
        context=4096,
        new_tokens=64,
        repeats=5,
        steps_per_repeat=5,
    )
    if not quick:
        return full
    return replace(
        full,
        train_length=512,
        eval_lengths=(1, 4, 8),
        context=2048,
        new_tokens=32,
        repeats=3,
        steps_per_repeat=3,
        quick=True,
    )


def gpu_training(
    name: str, s: BenchSettings, precision: str, cuda: CudaDevice, peak: float | None
) -> dict[str, float | None]:
    """One encoding's training step on the GPU, alone on the card: absolute time, the allocator's peak
    (weights, gradients, AdamW state and activations: ``max_memory_allocated``), MFU against ``peak``."""
    from extrapos.run.runtime import autocast

    dev = cuda.device
    model = bench_model(name, s).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, s.vocab, (s.batch, s.train_length + 1), generator=g).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(s.train_length, device=dev).expand(s.batch, -1)
    mask = torch.ones(y.shape, device=dev)

    def step() -> None:
        with autocast(dev, precision):
            loss = model_loss_sum(model, x, pos, y, mask) / mask.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: compilation (FlexAttention), AdamW state, the allocator's pools
        step()
    cuda.sync()
    cuda.reset_peak()
    times = []
    for _ in range(s.repeats):
        cuda.sync()
        t0 = time.perf_counter()
        for _ in range(s.steps_per_repeat):
            step()
        cuda.sync()
        times.append((time.perf_counter() - t0) / s.steps_per_repeat)
    sec = statistics.median(times)
    tok_s = s.batch * s.train_length / sec
    out = {
        "step_ms": sec * 1e3,
        "tokens_per_s": tok_s,
        "spread": timing_spread(times),
        "peak_mb": cuda.max_allocated() / 2**20,
        "mfu": mfu(flops_per_token(model.cfg, s.train_length), tok_s, peak),
    }
    return out  # the model and its optimizer go with this frame; the caller empties the cache


@torch.no_grad()
def _gpu_eval_and_generation(
    name: str, s: BenchSettings, precision: str, cuda: CudaDevice
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(evaluation time per length, the allocator's peak above the resident weights per length, decoding)
    of one encoding at batch 1, in ``precision``."""
    from extrapos.inference.generate import generate_tokens
    from extrapos.run.runtime import autocast

    dev = cuda.device
    model = bench_model(name, s).to(dev).eval()
    g = torch.Generator().manual_seed(1)
    times, memory = {}, {}
    for k in s.eval_lengths:
        T = k * s.train_length
        tokens = torch.randint(0, s.vocab, (1, T), generator=g).to(dev)
        pos = torch.arange(T, device=dev).unsqueeze(0)

        def forward(tokens: torch.Tensor = tokens, pos: torch.Tensor = pos) -> float:
            cuda.sync()
            t0 = time.perf_counter()
            with autocast(dev, precision):
                model.hidden_states(tokens, pos)
            cuda.sync()
            return time.perf_counter() - t0

        forward()  # warm-up (compilation for this shape)
        resident = cuda.allocated()
        cuda.reset_peak()
        times[f"time_ms_{k}x"] = statistics.median(forward() for _ in range(max(2, s.repeats - 2))) * 1e3
        memory[f"peak_mb_{k}x"] = (cuda.max_allocated() - resident) / 2**20
    prompt = torch.randint(0, s.vocab, (s.context,), generator=g).tolist()

    def decode(use_cache: bool, n: int) -> float:
        with autocast(dev, precision):
            it = generate_tokens(model, prompt, n + 1, temperature=0, use_cache=use_cache)
            next(it)  # the prefill and the first token, untimed
            cuda.sync()
            t0 = time.perf_counter()
            for _ in it:
                pass
        cuda.sync()
        return (time.perf_counter() - t0) / n

    decode(True, 2)  # warm-up
    cached, recomputed = decode(True, s.new_tokens), decode(False, max(4, s.new_tokens // 4))
    generation = {
        "cached_tok_s": 1 / cached,
        "recompute_tok_s": 1 / recomputed,
        "cache_speedup": recomputed / cached,
        "decode_ms": cached * 1e3,
    }
    return times, memory, generation


def run_bench_gpu(
    names: list[str], s: BenchSettings, cuda: CudaDevice, progress: Callable[[], object] = lambda: None
) -> dict[str, Any]:
    """The bench on one GPU: every encoding alone on the card, one after the other (the interleaving
    that keeps CPU ratios honest on a shared machine would keep every model resident at once).
    Absolute times, ``max_memory_allocated``, and MFU of the bf16 step against the GPU's dense bf16
    peak (``perf.GPU_BF16_PEAKS``; a GPU not in the table gets no MFU, and the report says why)."""
    from extrapos.bench.resolution import position_resolution

    t0 = time.perf_counter()
    gpu = cuda.name()
    known = gpu_bf16_peak(gpu)
    bf16 = cuda.bf16()
    precision = "bf16" if bf16 else "fp32"
    result: dict[str, Any] = {
        "settings": s.__dict__ | {"threads": torch.get_num_threads(), "torch": torch.__version__},
        "machine": {
            "device": str(cuda.device),
            "gpu": gpu,
            "bf16_peak_tflops": known[1] / 1e12 if known else None,
            "bf16_peak_of": known[0] if known else None,
            "eval_precision": precision,
        },
        "train_fp32": {},
        "train_bf16": {} if bf16 else None,
        "eval_time": {},
        "eval_memory": {},
        "generation": {},
        "peer": None,
    }
    for n in names:
        # fp32 (TF32 where torch allows it) has no peak in the table: its MFU is left out
        result["train_fp32"][n] = gpu_training(n, s, "fp32", cuda, None)
        cuda.free()
        if bf16:
            result["train_bf16"][n] = gpu_training(n, s, "bf16", cuda, known[1] if known else None)
            cuda.free()
        times, memory, generation = _gpu_eval_and_generation(n, s, precision, cuda)
        cuda.free()
        result["eval_time"][n], result["eval_memory"][n], result["generation"][n] = times, memory, generation
        progress()
    for key in ("train_fp32", "train_bf16"):
        rows = result[key] or {}
        base = rows.get("nope", {}).get("step_ms")
        for n in rows:
            rows[n]["ratio"] = rows[n]["step_ms"] / base if base else None
    result["resolution"] = position_resolution(train_length=512, multiples=(1, 2, 4, 8, 16))
    result["wall_time_s"] = time.perf_counter() - t0
    return result
