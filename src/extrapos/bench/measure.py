"""The CPU measurements of `extrapos bench`: one model per encoding at the same size and batch, timed in
interleaved repeats (every repeat visits every encoding, medians), and peak memory in fresh child
processes."""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from extrapos.bench.noise import round_ratios
from extrapos.losses import model_loss_sum
from extrapos.model import Decoder, flops_per_token, model_config


@dataclass
class BenchSettings:
    size: str = "cpu-small"
    vocab: int = 8192
    train_length: int = 256
    batch: int = 8
    eval_lengths: tuple[int, ...] = (1, 4, 16)
    context: int = 1024
    new_tokens: int = 32
    repeats: int = 5
    steps_per_repeat: int = 2
    quick: bool = False
    d_model: int | None = None  # the preset's width unless set (benchmarks/bench_precision.py)
    threads: int | None = None  # torch intra-op threads (None: torch's default, one per core)
    compile: bool = False  # also time the training step under torch.compile
    clock: str = "wall"  # wall | cpu: the timings' clock (CLOCKS)

    @classmethod
    def for_mode(cls, quick: bool) -> BenchSettings:
        if quick:
            return cls(
                batch=4,
                eval_lengths=(1, 4, 16),
                context=512,
                new_tokens=16,
                repeats=3,
                steps_per_repeat=1,
                quick=True,
            )
        return cls()


#: what a timing reads: "wall" (``perf_counter``), or "cpu": the calling thread's CPU time, which at one
#: thread (torch's kernels and the autograd engine then run on the calling thread) is the work itself,
#: without the time the step waited for a core that other processes held: on a shared machine the wall
#: clock mostly measures them (issue 39: a 2-thread step 5.4x slower than a 1-thread one at load ~5)
CLOCKS = {"wall": "perf_counter", "cpu": "thread_time"}


def clock_now(clock: str = "wall") -> float:
    """Seconds on ``clock`` (``CLOCKS``: the wall clock, or this thread's CPU time)."""
    return getattr(time, CLOCKS[clock])()


def bench_model(name: str, s: BenchSettings, seed: int = 0) -> Decoder:
    """The model every bench measurement of encoding ``name`` runs: the settings' size, vocabulary and L_t,
    its weights drawn from ``seed`` (a learned table sized for the longest length measured)."""
    torch.manual_seed(seed)
    options = (
        {"interpolate_to": s.train_length * max(s.eval_lengths + (s.context // s.train_length + 1,))}
        if name == "learned"
        else {}
    )
    width = {"d_model": s.d_model} if s.d_model else {}
    cfg = model_config(
        s.size, vocab_size=s.vocab, train_length=s.train_length, positions={"name": name, **options}, **width
    )
    return Decoder(cfg)


def _precision_ctx(precision: str) -> torch.autocast | nullcontext[None]:
    from extrapos.run.runtime import autocast

    return autocast(torch.device("cpu"), precision)


def timing_spread(times: list[float]) -> float:
    """(max - min) / median of the repeats: how much the machine moved during the measurement."""
    return (max(times) - min(times)) / statistics.median(times)


def interleaved(names: list[str], repeats: int, fn: Callable[[str], float]) -> dict[str, list[float]]:
    """Run fn(name) -> seconds for every name, ``repeats`` rounds, names in a rotating order."""
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(fn(n))
    return times


_PEAK = "__matmul_peak__"

#: the sizes a peak sample tries: AMX's bf16 tiles reach their rate at 2048 (~940 vs ~420 GFLOP/s at
#: 1024 on one Xeon thread, issue 39), AVX-512 fp32 at 1024 and below
PEAK_SIZES = (1024, 2048)


def matmul_rate(precision: str, n: int = 1024, reps: int = 4, clock: str = "wall") -> float:
    """FLOP/s of ``reps`` n x n matmuls right now (one sample of the peak, see bench_training)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0 = clock_now(clock)
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / max(clock_now(clock) - t0, 1e-9)


def _peak_sample(precision: str, clock: str = "wall") -> float:
    """The best rate over PEAK_SIZES right now: fp32 and bf16 sampled alike (issue 39: a bf16 peak taken
    at one size understated what AMX reaches)."""
    return max(
        matmul_rate(precision, n=n, reps=max(1, 4 * (1024 // n) ** 3), clock=clock) for n in PEAK_SIZES
    )


def machine_peak(precision: str, clock: str = "wall", samples: int = 5) -> float:
    """The matmul peak in FLOP/s: the best of ``samples`` peak samples, fp32 and bf16 alike."""
    return max(_peak_sample(precision, clock) for _ in range(samples))


def variant_key(precision: str, compiled: bool = False) -> str:
    """The result key of one training variant: train_fp32, train_bf16, train_fp32_compiled, ..."""
    return f"train_{precision}" + ("_compiled" if compiled else "")


def bench_steps(
    names: list[str],
    s: BenchSettings,
    variants: list[tuple[str, bool]],
    progress: Callable[[], object],
    peak_floor: dict[str, float] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """The training step of every encoding in every (precision, compiled) variant, all interleaved in the
    same rounds (so fp32 / bf16 and eager / compiled ratios are paired like the encodings' ratios), with
    matmul peak samples of each precision in every round; ``peak_floor``: FLOP/s by precision measured
    before (the peak is the best of those and the samples). By variant_key, then encoding."""
    models = {n: bench_model(n, s) for n in names}
    # what the trainer runs: fused AdamW, the head fused with the loss in fp32 (losses.py); one model and
    # optimizer per encoding serve every variant (the values do not change a step's time)
    opts = {n: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for n, m in models.items()}
    compiled = {n: torch.compile(m) for n, m in models.items()} if any(c for _, c in variants) else {}
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, s.vocab, (s.batch, s.train_length + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(s.train_length).expand(s.batch, -1)
    mask = torch.ones(y.shape)
    runs = {f"{variant_key(p, c)}/{n}": (n, p, c) for p, c in variants for n in names}

    def step(run: str) -> float:
        name, precision, use_compiled = runs[run]
        m, opt = (compiled if use_compiled else models)[name], opts[name]
        t0 = clock_now(s.clock)
        for _ in range(s.steps_per_repeat):
            with _precision_ctx(precision):
                loss = model_loss_sum(m, x, pos, y, mask) / mask.numel()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        progress()
        return (clock_now(s.clock) - t0) / s.steps_per_repeat

    # the matmul peak is sampled between the steps too, and each round's MFU is that round's step against
    # the best sample of the run: a peak taken once, at a quiet (or busy) moment, says little on a shared
    # machine, and the best sample is the closest to what the machine can do
    precisions = sorted({p for p, _ in variants})
    rates: dict[str, list[float]] = {p: [] for p in precisions}
    peaks = {f"{_PEAK}/{p}": p for p in precisions}

    def step_or_peak(run: str) -> float:
        if run not in peaks:
            return step(run)
        rates[peaks[run]].append(_peak_sample(peaks[run], s.clock))
        return 0.0

    for run in runs:  # warm-up: first-call allocations, lazy inits and compilation out of the timings
        step(run)
    times = interleaved(list(runs) + list(peaks), s.repeats, step_or_peak)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run, (n, p, c) in runs.items():
        peak = max(max(rates[p]), (peak_floor or {}).get(p, 0.0), 1.0)
        per_token = flops_per_token(models[n].cfg, s.train_length)
        rounds_ms = [t * 1e3 for t in times[run]]
        sec = statistics.median(times[run])
        tok_s = s.batch * s.train_length / sec
        out.setdefault(variant_key(p, c), {})[n] = {
            "step_ms": sec * 1e3,
            "rounds_ms": rounds_ms,
            "tokens_per_s": tok_s,
            "spread": timing_spread(times[run]),
            "peak_gflops": peak / 1e9,
            "mfu": per_token * tok_s / peak,
            "mfu_rounds": [per_token * s.batch * s.train_length / t / peak for t in times[run]],
        }
    for rows in out.values():  # ratio is None without a NoPE row
        base = rows["nope"] if "nope" in rows else None
        for row in rows.values():
            row["ratio"] = row["step_ms"] / base["step_ms"] if base else None
            row["ratio_rounds"] = round_ratios(row["rounds_ms"], base["rounds_ms"]) if base else None
    return out


def bench_training(
    names: list[str], s: BenchSettings, precision: str, progress: Callable[[], object], compiled: bool = False
) -> dict[str, dict[str, Any]]:
    """The training step of every encoding in one precision (see bench_steps)."""
    return bench_steps(names, s, [(precision, compiled)], progress)[variant_key(precision, compiled)]


@torch.no_grad()
def bench_eval_time(
    names: list[str], s: BenchSettings, progress: Callable[[], object]
) -> dict[str, dict[str, Any]]:
    models = {n: bench_model(n, s).eval() for n in names}
    g = torch.Generator().manual_seed(1)
    result: dict[str, dict[str, Any]] = {n: {} for n in names}
    for k in s.eval_lengths:
        T = k * s.train_length
        tokens = torch.randint(0, s.vocab, (1, T), generator=g)
        pos = torch.arange(T).unsqueeze(0)

        def run(name: str, tokens: torch.Tensor = tokens, pos: torch.Tensor = pos) -> float:
            t0 = clock_now(s.clock)
            models[name].hidden_states(tokens, pos)
            progress()
            return clock_now(s.clock) - t0

        for n in names:
            run(n)
        times = interleaved(names, max(2, s.repeats - 2), run)
        for n in names:
            result[n][f"time_ms_{k}x"] = statistics.median(times[n]) * 1e3
            result[n][f"rounds_ms_{k}x"] = [t * 1e3 for t in times[n]]  # the rounds, for the verdicts
    return result


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth_mb(fn: Callable[[], object]) -> float:
    """Peak growth of the resident set while ``fn()`` runs, sampled every 0.5 ms by a thread
    (torch kernels release the GIL, so the sampler sees the peaks)."""
    base = _rss_bytes()
    peak = [base]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.0005)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()
    return (max(peak[0], _rss_bytes()) - base) / 2**20


def child_memory(name: str, s: BenchSettings) -> dict[str, float]:
    """Peak RSS growth (MB) of evaluating each length (batch 1, no grad), in this fresh process."""
    model = bench_model(name, s).eval()
    g = torch.Generator().manual_seed(1)
    out = {}
    with torch.no_grad():
        model.hidden_states(torch.randint(0, s.vocab, (1, 16), generator=g), torch.arange(16).unsqueeze(0))
        for k in sorted(s.eval_lengths):
            T = k * s.train_length
            tokens, pos = torch.randint(0, s.vocab, (1, T), generator=g), torch.arange(T).unsqueeze(0)
            out[f"peak_mb_{k}x"] = peak_rss_growth_mb(functools.partial(model.hidden_states, tokens, pos))
    return out


def bench_eval_memory(
    names: list[str], s: BenchSettings, progress: Callable[[], object]
) -> dict[str, dict[str, float]]:
    out = {}
    for n in names:
        cmd = [
            sys.executable,
            "-m",
            "extrapos.bench",
            "--memory-child",
            n,
            "--settings",
            json.dumps(s.__dict__),
        ]
        # a fixed mmap threshold stops glibc from keeping freed large blocks, so each length starts clean
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"memory measurement of {n} failed:\n{proc.stderr[-2000:]}")
        out[n] = json.loads(proc.stdout.strip().splitlines()[-1])
        progress()
    return out


@torch.no_grad()
def bench_generation(
    names: list[str], s: BenchSettings, progress: Callable[[], object]
) -> dict[str, dict[str, Any]]:
    from extrapos.inference.generate import generate_tokens

    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, s.vocab, (s.context,), generator=g).tolist()
    models = {n: bench_model(n, s).eval() for n in names}

    def cached_decode(name: str) -> float:
        """Seconds per generated token with the cache, in steady state: prefill and the first few
        steps (where the cache buffers grow past the prompt and fresh pages fault in) untimed."""
        m = models[name]
        cache = m.new_cache()
        m.hidden_states(torch.tensor([prompt]), torch.arange(s.context).unsqueeze(0), cache)
        tok = torch.tensor([[prompt[-1]]])
        warm = 4
        for i in range(warm + s.new_tokens):
            if i == warm:
                t0 = clock_now(s.clock)
            logits = m(tok, torch.tensor([[s.context + i]]), cache)
            tok = logits[:, -1:].argmax(-1)
        progress()
        return (clock_now(s.clock) - t0) / s.new_tokens

    def recompute(name: str) -> float:
        t0 = clock_now(s.clock)
        for _ in generate_tokens(
            models[name], prompt, max(4, s.new_tokens // 4), temperature=0, use_cache=False
        ):
            pass
        progress()
        return (clock_now(s.clock) - t0) / max(4, s.new_tokens // 4)

    for n in names:
        cached_decode(n)
    cached = interleaved(names, max(2, s.repeats - 2), cached_decode)
    slow = interleaved(names, 1, recompute)
    out = {}
    for n in names:
        c, r = statistics.median(cached[n]), statistics.median(slow[n])
        out[n] = {
            "cached_tok_s": 1 / c,
            "recompute_tok_s": 1 / r,
            "cache_speedup": r / c,
            "decode_ms": c * 1e3,
            "decode_rounds_ms": [t * 1e3 for t in cached[n]],
        }
    return out
