"""`extrapos bench`: the cost of every encoding, side by side, as ratios to NoPE.

One invocation measures, with the same model size and batch for every encoding:

- the training step (forward + backward + AdamW) at L_t = 256, fp32 and bf16 autocast, with its
  model-FLOPs utilisation against the matmul peak measured here in the same precision;
- evaluation time at 1x, 4x and 16x L_t, and evaluation peak memory;
- generation tokens/s at 1k tokens of context, with the KV cache and by recomputing the prefix;
- the bf16 position-resolution diagnostic of ExPE / ExQPE (see diagnostics.py).

Timings are interleaved (every repeat visits every encoding) and reported as medians, so a noisy
machine slows all encodings alike and the ratios survive. Peak memory on CPU has no allocator
counter, so it is the peak growth of the resident set during the forward, sampled by a thread, in a
fresh child process per encoding: it counts everything the process really touched, kernel scratch
buffers included.

On a GPU (``run_bench_gpu``): GPT-2 small, each encoding alone on the card, absolute times,
``torch.cuda.max_memory_allocated`` and MFU against the GPU's dense bf16 peak (docs/architecture.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from extrapos.errors import UserError
from extrapos.losses import model_loss_sum
from extrapos.model import Decoder, flops_per_token, model_config
from extrapos.perf import gpu_bf16_peak, matmul_peak_flops, mfu
from extrapos.positions import registry
from extrapos.runtime import cpu_has_fast_bf16


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


def _model(name: str, s: BenchSettings, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    options = (
        {"interpolate_to": s.train_length * max(s.eval_lengths + (s.context // s.train_length + 1,))}
        if name == "learned"
        else {}
    )
    cfg = model_config(
        s.size, vocab_size=s.vocab, train_length=s.train_length, positions={"name": name, **options}
    )
    return Decoder(cfg)


def _precision_ctx(precision: str):
    from extrapos.runtime import autocast

    return autocast(torch.device("cpu"), precision)


def _spread(times: list[float]) -> float:
    """(max - min) / median of the repeats: how much the machine moved during the measurement."""
    return (max(times) - min(times)) / statistics.median(times)


def _interleaved(names: list[str], repeats: int, fn) -> dict[str, list[float]]:
    """Run fn(name) -> seconds for every name, ``repeats`` rounds, names in a rotating order."""
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(fn(n))
    return times


_PEAK = "__matmul_peak__"


def _matmul_rate(precision: str, n: int = 1024, reps: int = 4) -> float:
    """FLOP/s of ``reps`` n x n matmuls right now (one sample of the peak, see bench_training)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def bench_training(
    names: list[str], s: BenchSettings, precision: str, progress
) -> dict[str, dict[str, float]]:
    models = {n: _model(n, s) for n in names}
    # what the trainer runs: fused AdamW, the head fused with the loss in fp32 (losses.py)
    opts = {n: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for n, m in models.items()}
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, s.vocab, (s.batch, s.train_length + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(s.train_length).expand(s.batch, -1)
    mask = torch.ones(y.shape)

    def step(name: str) -> float:
        m, opt = models[name], opts[name]
        t0 = time.perf_counter()
        for _ in range(s.steps_per_repeat):
            with _precision_ctx(precision):
                loss = model_loss_sum(m, x, pos, y, mask) / mask.numel()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        progress()
        return (time.perf_counter() - t0) / s.steps_per_repeat

    # the matmul peak is measured between the steps too: on a shared machine a peak taken once, at a
    # quiet (or busy) moment, would put MFU above 100 % (or below 30 %); the median of these is the peak
    rates: list[float] = []

    def step_or_peak(name: str) -> float:
        if name != _PEAK:
            return step(name)
        rates.append(_matmul_rate(precision))
        return 0.0

    step_names = list(names)
    for n in step_names:  # warm-up: first-call allocations and lazy inits out of the timings
        step(n)
    times = _interleaved(step_names + [_PEAK], s.repeats, step_or_peak)
    peak = max(statistics.median(rates), 1.0)
    out = {}
    for n in names:
        sec = statistics.median(times[n])
        tok_s = s.batch * s.train_length / sec
        out[n] = {
            "step_ms": sec * 1e3,
            "tokens_per_s": tok_s,
            "spread": _spread(times[n]),
            "peak_gflops": peak / 1e9,
            "mfu": flops_per_token(models[n].cfg, s.train_length) * tok_s / peak,
        }
    base = out.get("nope", {}).get("step_ms")
    for n in out:
        out[n]["ratio"] = out[n]["step_ms"] / base if base else None
    return out


@torch.no_grad()
def bench_eval_time(names: list[str], s: BenchSettings, progress) -> dict[str, dict[str, float]]:
    models = {n: _model(n, s).eval() for n in names}
    g = torch.Generator().manual_seed(1)
    result: dict[str, dict[str, float]] = {n: {} for n in names}
    for k in s.eval_lengths:
        T = k * s.train_length
        tokens = torch.randint(0, s.vocab, (1, T), generator=g)
        pos = torch.arange(T).unsqueeze(0)

        def run(name: str, tokens=tokens, pos=pos) -> float:
            t0 = time.perf_counter()
            models[name].hidden_states(tokens, pos)
            progress()
            return time.perf_counter() - t0

        for n in names:
            run(n)
        times = _interleaved(names, max(2, s.repeats - 2), run)
        for n in names:
            result[n][f"time_ms_{k}x"] = statistics.median(times[n]) * 1e3
    return result


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth_mb(fn) -> float:
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


def _child_memory(name: str, s: BenchSettings) -> dict[str, float]:
    """Peak RSS growth (MB) of evaluating each length (batch 1, no grad), in this fresh process."""
    model = _model(name, s).eval()
    g = torch.Generator().manual_seed(1)
    out = {}
    with torch.no_grad():
        model.hidden_states(torch.randint(0, s.vocab, (1, 16), generator=g), torch.arange(16).unsqueeze(0))
        for k in sorted(s.eval_lengths):
            T = k * s.train_length
            tokens, pos = torch.randint(0, s.vocab, (1, T), generator=g), torch.arange(T).unsqueeze(0)
            out[f"peak_mb_{k}x"] = peak_rss_growth_mb(lambda t=tokens, p=pos: model.hidden_states(t, p))
    return out


def bench_eval_memory(names: list[str], s: BenchSettings, progress) -> dict[str, dict[str, float]]:
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
def bench_generation(names: list[str], s: BenchSettings, progress) -> dict[str, dict[str, float]]:
    from extrapos.generate import generate_tokens

    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, s.vocab, (s.context,), generator=g).tolist()
    models = {n: _model(n, s).eval() for n in names}

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
                t0 = time.perf_counter()
            logits = m(tok, torch.tensor([[s.context + i]]), cache)
            tok = logits[:, -1:].argmax(-1)
        progress()
        return (time.perf_counter() - t0) / s.new_tokens

    def recompute(name: str) -> float:
        t0 = time.perf_counter()
        for _ in generate_tokens(
            models[name], prompt, max(4, s.new_tokens // 4), temperature=0, use_cache=False
        ):
            pass
        progress()
        return (time.perf_counter() - t0) / max(4, s.new_tokens // 4)

    for n in names:
        cached_decode(n)
    cached = _interleaved(names, max(2, s.repeats - 2), cached_decode)
    slow = _interleaved(names, 1, recompute)
    out = {}
    for n in names:
        c, r = statistics.median(cached[n]), statistics.median(slow[n])
        out[n] = {
            "cached_tok_s": 1 / c,
            "recompute_tok_s": 1 / r,
            "cache_speedup": r / c,
            "decode_ms": c * 1e3,
        }
    return out


#: the shape of the peer comparison (issue 15): Llama + RoPE, d 256, 4 layers, 4 heads, MLP 768,
#: vocab 8192, tied embeddings, batch 8 x 256, forward + backward + AdamW, fp32
PEER_SHAPE = {
    "d_model": 256,
    "n_layers": 4,
    "n_heads": 4,
    "mlp_hidden": 768,
    "vocab": 8192,
    "batch": 8,
    "seq": 256,
}


def bench_peer(rounds: int = 7, progress=None) -> dict[str, Any] | None:
    """extrapos llama + RoPE vs Hugging Face ``LlamaForCausalLM`` of the same shape, one training step
    each (fp32, fused AdamW on both sides), interleaved rounds, medians; None without transformers.

    Each side runs its own usual loss: extrapos the trainer's (the head fused with the loss,
    losses.py), Hugging Face its logits and an fp32 cross-entropy over them.
    """
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    from extrapos.model import count_parameters

    p = PEER_SHAPE
    torch.manual_seed(0)
    ours = Decoder(
        model_config(
            flavour="llama",
            n_layers=p["n_layers"],
            d_model=p["d_model"],
            n_heads=p["n_heads"],
            mlp_hidden=p["mlp_hidden"],
            vocab_size=p["vocab"],
            tie_embeddings=True,
            train_length=p["seq"],
            positions={"name": "rope"},
        )
    )
    hf_cfg = LlamaConfig(
        vocab_size=p["vocab"],
        hidden_size=p["d_model"],
        intermediate_size=p["mlp_hidden"],
        num_hidden_layers=p["n_layers"],
        num_attention_heads=p["n_heads"],
        num_key_value_heads=p["n_heads"],
        max_position_embeddings=p["seq"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
    )
    hf = LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa", dtype=torch.float32).train()
    n_ours = count_parameters(ours)["total"]
    n_hf = sum(t.numel() for t in {id(t): t for t in hf.parameters()}.values())
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, p["vocab"], (p["batch"], p["seq"] + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(p["seq"]).expand(p["batch"], -1)
    mask = torch.ones(y.shape)
    opts = {
        "extrapos": torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True),
        "transformers": torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=True),
    }

    def step(name: str) -> float:
        t0 = time.perf_counter()
        if name == "extrapos":
            loss = model_loss_sum(ours, x, pos, y, mask) / mask.numel()
        else:
            logits = hf(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        if progress:
            progress()
        return time.perf_counter() - t0

    names = ["extrapos", "transformers"]
    for n in names:  # warm-up
        step(n)
    times = _interleaved(names, max(7, rounds), step)
    med = {n: statistics.median(t) for n, t in times.items()}
    import transformers

    return {
        "shape": p,
        "rounds": max(7, rounds),
        "params_extrapos": n_ours,
        "params_transformers": n_hf,
        "transformers": transformers.__version__,
        **{f"{n}_ms": med[n] * 1e3 for n in names},
        **{f"{n}_spread": _spread(times[n]) for n in names},
        "ratio": med["extrapos"] / med["transformers"],
    }


def format_peer(r: dict[str, Any]) -> str:
    p = r["shape"]
    return (
        f"llama + RoPE training step (d {p['d_model']}, {p['n_layers']} layers, {p['n_heads']} heads, MLP "
        f"{p['mlp_hidden']}, vocab {p['vocab']}, tied, batch {p['batch']} x {p['seq']}, fp32, fwd + bwd + "
        "AdamW; "
        f"{r['params_extrapos']:,} vs {r['params_transformers']:,} parameters), median of {r['rounds']} "
        f"interleaved rounds, CPU capability {torch.backends.cpu.get_cpu_capability()}: extrapos "
        f"{r['extrapos_ms']:.0f} ms (spread {r['extrapos_spread']:.0%}), transformers {r['transformers']} "
        f"LlamaForCausalLM {r['transformers_ms']:.0f} ms (spread {r['transformers_spread']:.0%}), "
        f"ratio {r['ratio']:.2f}"
    )


#: the figures of issues 15 and 28 and their targets: (label, what, encodings, target, higher is better)
TARGETS = [
    ("training step vs NoPE: Kerple log / power", "train", ("kerple-log", "kerple-power"), 1.10, False),
    ("training step vs NoPE: T5 bias", "train", ("t5",), 1.10, False),
    ("training step vs NoPE: FIRE", "train", ("fire",), 1.15, False),
    ("training step vs NoPE: K-CABLE", "train", ("k-cable",), 1.10, False),
    (
        "evaluation time at 16 x L_t vs NoPE, pairwise biases",
        "eval16",
        ("kerple-log", "kerple-power", "fire", "t5", "k-cable"),
        1.5,
        False,
    ),
    (
        "evaluation time at 16 x L_t vs NoPE, folded biases (issue 28)",
        "eval16",
        ("alibi", "cable", "cable-nw", "cable-official", "fox"),
        1.10,
        False,
    ),
    (
        "decode ms/token vs NoPE, bias encodings (issue 28)",
        "decode",
        ("alibi", "cable", "cable-nw", "cable-official", "fox", "kerple-log", "kerple-power", "t5"),
        1.25,
        False,
    ),
    ("training MFU, fp32 (vs the matmul peak measured in this run)", "mfu", ("nope",), 0.65, True),
    ("llama + RoPE training step vs transformers LlamaForCausalLM", "peer", (), 0.90, False),
]


def target_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, met) for every figure of TARGETS this run measured."""
    rows = []
    k = max(r["settings"]["eval_lengths"])
    for label, what, names, target, higher in TARGETS:
        if what == "peer":
            if not r.get("peer"):
                continue
            vals = {"": r["peer"]["ratio"]}
        elif what == "mfu":  # on a GPU fp32 has no MFU (format_bench)
            vals = {
                n: r["train_fp32"][n]["mfu"]
                for n in names
                if r["train_fp32"].get(n, {}).get("mfu") is not None
            }
        elif what == "train":
            vals = {n: r["train_fp32"][n]["ratio"] for n in names if n in r["train_fp32"]}
        elif what == "decode":
            gen = r["generation"]
            vals = {n: gen[n]["decode_ms"] / gen["nope"]["decode_ms"] for n in names if n in gen}
        else:
            et = r["eval_time"]
            vals = {n: et[n][f"time_ms_{k}x"] / et["nope"][f"time_ms_{k}x"] for n in names if n in et}
        if not vals:
            continue
        worst = min(vals.values()) if higher else max(vals.values())
        fmt = (lambda v: f"{v:.1%}") if what == "mfu" else (lambda v: f"{v:.2f}")
        shown = ", ".join(f"{n} {fmt(v)}" if n else fmt(v) for n, v in vals.items())
        met = worst >= target if higher else worst <= target
        rows.append((label, shown, ("> " if higher else "<= ") + fmt(target), "yes" if met else "no"))
    return rows


def format_targets(r: dict[str, Any]) -> str:
    lines = ["| figure (issues 15, 28) | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in target_rows(r)]
    return "\n".join(lines)


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

    from extrapos.diagnostics import position_resolution

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


# ---- on a GPU ---------------------------------------------------------------------------------------


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


def _gpu_training(name: str, s: BenchSettings, precision: str, cuda: CudaDevice, peak: float | None):
    """One encoding's training step on the GPU, alone on the card: absolute time, the allocator's peak
    (weights, gradients, AdamW state and activations: ``max_memory_allocated``), MFU against ``peak``."""
    from extrapos.runtime import autocast

    dev = cuda.device
    model = _model(name, s).to(dev)
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
        "spread": _spread(times),
        "peak_mb": cuda.max_allocated() / 2**20,
        "mfu": mfu(flops_per_token(model.cfg, s.train_length), tok_s, peak),
    }
    return out  # the model and its optimizer go with this frame; the caller empties the cache


@torch.no_grad()
def _gpu_eval_and_generation(name: str, s: BenchSettings, precision: str, cuda: CudaDevice):
    """(evaluation time per length, the allocator's peak above the resident weights per length, decoding)
    of one encoding at batch 1, in ``precision``."""
    from extrapos.generate import generate_tokens
    from extrapos.runtime import autocast

    dev = cuda.device
    model = _model(name, s).to(dev).eval()
    g = torch.Generator().manual_seed(1)
    times, memory = {}, {}
    for k in s.eval_lengths:
        T = k * s.train_length
        tokens = torch.randint(0, s.vocab, (1, T), generator=g).to(dev)
        pos = torch.arange(T, device=dev).unsqueeze(0)

        def forward(tokens=tokens, pos=pos) -> float:
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
    names: list[str], s: BenchSettings, cuda: CudaDevice, progress=lambda: None
) -> dict[str, Any]:
    """The bench on one GPU: every encoding alone on the card, one after the other (the interleaving
    that keeps CPU ratios honest on a shared machine would keep every model resident at once).
    Absolute times, ``max_memory_allocated``, and MFU of the bf16 step against the GPU's dense bf16
    peak (``perf.GPU_BF16_PEAKS``; a GPU not in the table gets no MFU, and the report says why)."""
    from extrapos.diagnostics import position_resolution

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
        result["train_fp32"][n] = _gpu_training(n, s, "fp32", cuda, None)
        cuda.free()
        if bf16:
            result["train_bf16"][n] = _gpu_training(n, s, "bf16", cuda, known[1] if known else None)
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


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "–"


def _gpu_header(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["machine"]
    peak = m.get("bf16_peak_tflops")
    mfu_text = (
        f"MFU of the bf16 step against the {m['bf16_peak_of']} dense bf16 peak, {peak:.0f} TFLOP/s "
        "(datasheet); no MFU for fp32 (its peak depends on TF32 and is not in the table)"
        if peak
        else f"no MFU: {m['gpu']!r} is not in the table of dense bf16 peaks (perf.GPU_BF16_PEAKS)"
    )
    return (
        f"Model {s['size']} (vocab {s['vocab']}), L_t = {s['train_length']}, batch {s['batch']}, on "
        f"{m['gpu']} ({m['device']}), torch {s['torch']}; each encoding alone on the GPU. Times are "
        "absolute, medians; peak MB is torch.cuda.max_memory_allocated (training: the whole step, weights "
        f"and AdamW state included; evaluation, in {m['eval_precision']}: above the resident weights); "
        f"{mfu_text}. Ratios are to `nope` (lower is better, except speedup)."
        + ("" if r["train_bf16"] else " The bf16 columns are skipped: this GPU has no bf16.")
    )


def _percent(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "–"


def format_bench(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["machine"]
    bf16_peak = m.get("matmul_peak_gflops_bf16")
    gpu = "gpu" in m
    header = (
        _gpu_header(r)
        if gpu
        else f"Model {s['size']} (vocab {s['vocab']}), L_t = {s['train_length']}, batch {s['batch']}, "
        f"{s['threads']} threads, torch {s['torch']}, CPU capability {m.get('cpu_capability', '?')}; matmul "
        "peak "
        f"{m['matmul_peak_gflops_fp32']:.0f} GFLOP/s fp32"
        + (f", {bf16_peak:.0f} GFLOP/s bf16" if bf16_peak else "")
        + ". Ratios are to `nope` (lower is better, except speedup)."
        + (
            ""
            if r["train_bf16"]
            else " The bf16 columns are skipped: this CPU has no native bf16 "
            "(emulated bf16 runs ~20x slower than fp32 and would measure nothing a user runs)."
        )
    )
    lines = [
        header,
        "",
        "| encoding | train fp32 ms (x nope) | MFU fp32 | train bf16 ms (x nope) | MFU bf16 | "
        + ("train peak MB fp32 | train peak MB bf16 | " if gpu else "")
        + " | ".join(f"eval {k}x ms (x)" for k in s["eval_lengths"])
        + " | "
        + " | ".join(f"peak MB {k}x (x)" for k in s["eval_lengths"])
        + " | decode ms/token (x) | cached tok/s | recompute tok/s | cache speedup |",
        "|---|" + "---:|" * (4 + 2 * gpu + 2 * len(s["eval_lengths"]) + 4),
    ]
    tf, tb, et, em, gen = r["train_fp32"], r["train_bf16"], r["eval_time"], r["eval_memory"], r["generation"]
    for n in tf:
        cells = [f"{tf[n]['step_ms']:.1f} ({tf[n]['ratio']:.2f})", _percent(tf[n]["mfu"])]
        cells += (
            [f"{tb[n]['step_ms']:.1f} ({tb[n]['ratio']:.2f})", _percent(tb[n]["mfu"])]
            if tb
            else ["skipped", "-"]
        )
        if gpu:
            cells += [f"{tf[n]['peak_mb']:.0f}", f"{tb[n]['peak_mb']:.0f}" if tb else "-"]
        for k in s["eval_lengths"]:
            cells.append(
                f"{et[n][f'time_ms_{k}x']:.1f} "
                f"({_ratio(et[n][f'time_ms_{k}x'], et['nope'][f'time_ms_{k}x'])})"
            )
        for k in s["eval_lengths"]:
            cells.append(
                f"{em[n][f'peak_mb_{k}x']:.0f} "
                f"({_ratio(em[n][f'peak_mb_{k}x'], em['nope'][f'peak_mb_{k}x'])})"
            )
        cells += [
            f"{gen[n]['decode_ms']:.2f} ({_ratio(gen[n]['decode_ms'], gen['nope']['decode_ms'])})",
            f"{gen[n]['cached_tok_s']:.0f}",
            f"{gen[n]['recompute_tok_s']:.1f}",
            f"{gen[n]['cache_speedup']:.1f}x",
        ]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if "cable" in gen and "alibi" in gen:
        lines += [
            "",
            "CABLE decoding per token / ALiBi's: "
            f"{gen['cable']['decode_ms'] / gen['alibi']['decode_ms']:.2f}",
        ]
    from extrapos.diagnostics import format_resolution

    lines += [
        "",
        "Spread of the training repeats ((max - min) / median), fp32: "
        + ", ".join(f"{n} {tf[n]['spread']:.0%}" for n in tf if "spread" in tf[n]),
    ]
    if r.get("peer"):
        lines += ["", format_peer(r["peer"])]
    lines += ["", format_targets(r)]
    lines += ["", format_resolution(r["resolution"]), "", f"bench wall time {r['wall_time_s']:.0f} s"]
    return "\n".join(lines)


if __name__ == "__main__":  # the memory child: python -m extrapos.bench --memory-child NAME --settings JSON
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--memory-child", required=True)
    ap.add_argument("--settings", required=True)
    a = ap.parse_args()
    raw = json.loads(a.settings)
    raw["eval_lengths"] = tuple(raw["eval_lengths"])
    print(json.dumps(_child_memory(a.memory_child, BenchSettings(**raw))))
