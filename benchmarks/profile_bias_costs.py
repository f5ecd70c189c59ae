"""Where the bias encodings' extra time goes, against NoPE, in one run (issue 28): evaluation at 16 x L_t
and cached decoding.

    python benchmarks/profile_bias_costs.py                    # cpu-small (d_h 32), 1 thread
    python benchmarks/profile_bias_costs.py --threads 2 --d-model 256 --heads 4   # d_h 64

Evaluation: one attention layer's call at T = 16 x L_t (no grad), the kernels a folded bias could use,
interleaved rounds, medians as ratios to NoPE's causal fused SDPA, and each variant's largest output
error against the fp64 reference on the same inputs (ALiBi's slopes, positions 0..T-1):

- ``fold`` is what ``attention`` runs (``folded_attention``: width d_h + 1, one shift per block of
  queries, each block's causal mask a float mask);
- ``one call, d_h + 1, one shift`` is the same fold as one causal call shifted by the last key: what the
  fold would cost without its blocks, and the precision the blocks buy back;
- ``one causal call, d_h + 1 (no bias)``: the cost of the extra dimension alone (a zero column);
- ``blocks of 256, float masks, d_h (no bias)``: the blocks' masked calls without the extra dimension,
  the cost of the blocks and their masks alone.

Decoding: the cpu-small model of ``extrapos bench`` (L_t 256, 1,024-token prompt), per token and per
layer: the bias hook (``pos.bias`` on one token with the cache's state), the attention call as the model
makes it (with the cache's keys and key features), the whole step per token (interleaved rounds), and
the number of eager ops one layer issues per token (from torch.profiler: a count, so load-independent).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time

import torch
import torch.nn.functional as F

from extrapos.attention import attention, attention_reference, folded_attention
from extrapos.bench import BenchSettings, interleaved, timing_spread
from extrapos.model import Decoder, model_config
from extrapos.positions.base import FoldedBias

DECODE_NAMES = ["nope", "alibi", "cable", "cable-nw", "fox", "kerple-log", "t5"]


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def eval_kernels(T: int, heads: int, d_head: int, rounds: int) -> list[tuple[str, float, float, float]]:
    """(variant, median ms, spread, max |error| vs fp64) for one layer's attention at T tokens."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, T, d_head, generator=g) for _ in range(3))
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)])
    bias = FoldedBias(
        slopes[None, :, None].expand(1, heads, T), torch.arange(T, dtype=torch.float32).expand(1, heads, T)
    )
    pad = torch.zeros(1, heads, T, 1)
    q1, k1, v1 = torch.cat([q, pad], -1), torch.cat([k, pad], -1), torch.cat([v, pad], -1)
    block = 256
    mask = torch.zeros(block, T).masked_fill_(
        torch.ones(block, T, dtype=torch.bool).triu(T - block + 1), -math.inf
    )

    def blocks_d_head() -> torch.Tensor:
        outs = []
        for s in reversed(range(0, T, block)):
            e = min(s + block, T)
            outs.append(
                F.scaled_dot_product_attention(
                    q[:, :, s:e], k[:, :, :e], v[:, :, :e], attn_mask=mask[block - (e - s) :, T - e :]
                )
            )
        return torch.cat(outs[::-1], dim=2)

    variants = {
        "nope (causal SDPA, d_h)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "fold (what attention runs)": lambda: folded_attention(q, k, v, bias),
        "one call, d_h + 1, one shift": lambda: folded_attention(q, k, v, bias, block=T),
        "one causal call, d_h + 1 (no bias)": lambda: F.scaled_dot_product_attention(
            q1, k1, v1, is_causal=True, scale=d_head**-0.5
        ),
        "blocks of 256, float masks, d_h (no bias)": blocks_d_head,
    }
    biased = {"fold (what attention runs)", "one call, d_h + 1, one shift"}
    with torch.no_grad():
        ref_bias = attention_reference(
            q.double(), k.double(), v.double(), FoldedBias(bias.q_feat.double(), bias.k_feat.double())
        )
        ref_plain = attention_reference(q.double(), k.double(), v.double())
        errors = {}
        for name, fn in variants.items():
            out = fn()[..., :d_head].double()
            errors[name] = float((out - (ref_bias if name in biased else ref_plain)).abs().max())

        def run(name: str) -> float:
            t0 = time.perf_counter()
            variants[name]()
            return time.perf_counter() - t0

        times = interleaved(list(variants), rounds, run)
    return [(n, _median_ms(times[n]), timing_spread(times[n]), errors[n]) for n in variants]


def _prefilled(name: str, s: BenchSettings, d_model: int, heads: int) -> tuple[Decoder, object, torch.Tensor]:
    torch.manual_seed(0)
    cfg = model_config(
        s.size,
        vocab_size=s.vocab,
        train_length=s.train_length,
        d_model=d_model,
        n_heads=heads,
        positions={"name": name},
    )
    model = Decoder(cfg).eval()
    prompt = torch.randint(0, s.vocab, (1, s.context), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache()
    with torch.no_grad():
        model.hidden_states(prompt, torch.arange(s.context).unsqueeze(0), cache)
        for i in range(4):  # the cache buffers grow past the prompt
            model(prompt[:, -1:], torch.tensor([[s.context + i]]), cache)
    return model, cache, prompt[:, -1:]


def _eager_ops_per_layer(model: Decoder, cache, tok: torch.Tensor, at: int) -> float:
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(tok, torch.tensor([[at]]), cache)
    top = [e for e in prof.events() if e.cpu_parent is None]
    return len(top) / model.cfg.n_layers


def decode_costs(names: list[str], d_model: int, heads: int, rounds: int) -> dict[str, dict[str, float]]:
    s = BenchSettings()
    built = {n: _prefilled(n, s, d_model, heads) for n in names}
    x = torch.randn(1, 1, d_model)
    out: dict[str, dict[str, float]] = {n: {} for n in names}
    steps = 32

    def step(name: str) -> float:
        model, cache, tok = built[name]
        at = len(cache)
        t0 = time.perf_counter()
        with torch.no_grad():
            for i in range(steps):
                model(tok, torch.tensor([[at + i]]), cache)
        return (time.perf_counter() - t0) / steps

    def hook(name: str) -> float:
        model, cache, _ = built[name]
        layer = cache.layers[0]
        at = torch.tensor([[len(cache)]])
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(200):
                model.pos.bias(x, at, 0, dict(layer.state))
        return (time.perf_counter() - t0) / 200

    def attend(name: str) -> float:
        model, cache, _ = built[name]
        layer = cache.layers[0]
        H, Dh = model.cfg.n_heads, model.cfg.head_dim
        q = torch.randn(1, H, 1, Dh)
        k, v = layer.k.buf[:, :, : layer.length], layer.v.buf[:, :, : layer.length]
        with torch.no_grad():
            bias = model.pos.bias(x, torch.tensor([[len(cache)]]), 0, dict(layer.state))
            if bias is not None:
                kf = layer.k_feat.buf[:, :, : layer.length]
                bias = dataclasses.replace(bias, k_feat=kf)
            t0 = time.perf_counter()
            for _ in range(200):
                attention(q, k, v, bias)
        return (time.perf_counter() - t0) / 200

    for fn, key in ((step, "step_ms"), (hook, "hook_us"), (attend, "attention_us")):
        for n in names:
            fn(n)
        times = interleaved(names, rounds, fn)
        scale = 1e3 if key == "step_ms" else 1e6
        for n in names:
            out[n][key] = statistics.median(times[n]) * scale
            out[n][key + "_spread"] = timing_spread(times[n])
    for n in names:
        model, cache, tok = built[n]
        out[n]["ops_per_layer"] = _eager_ops_per_layer(model, cache, tok, len(cache))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--encodings", default=",".join(DECODE_NAMES), help="decoding rows; nope must be first")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    d_head = args.d_model // args.heads
    T = 16 * BenchSettings().train_length
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.threads} thread(s), d_model {args.d_model}, {args.heads} heads (d_h {d_head}), "
        f"{args.rounds} rounds\n"
    )
    rows = eval_kernels(T, args.heads, d_head, args.rounds)
    base = rows[0][1]
    print(f"Evaluation at 16 x L_t = {T} tokens, one layer's attention (1 x {args.heads} heads), no grad:\n")
    print("| kernel | ms | x nope | spread | max abs error vs fp64 |")
    print("|---|---:|---:|---:|---:|")
    for name, ms, spread, err in rows:
        print(f"| {name} | {ms:.1f} | {ms / base:.2f} | {spread:.0%} | {err:.1e} |")
    names = args.encodings.split(",")
    costs = decode_costs(names, args.d_model, args.heads, args.rounds)
    ref = costs[names[0]]
    print(
        f"\nCached decoding after a {BenchSettings().context}-token prompt "
        f"(cpu-small layout, d_model {args.d_model}):\n"
    )
    print(
        "| encoding | ms/token (x nope) | bias hook us/layer | attention us/layer (x nope) "
        "| eager ops/layer |"
    )
    print("|---|---:|---:|---:|---:|")
    for n in names:
        c = costs[n]
        print(
            f"| {n} | {c['step_ms']:.3f} ({c['step_ms'] / ref['step_ms']:.2f}) | {c['hook_us']:.1f} | "
            f"{c['attention_us']:.1f} ({c['attention_us'] / ref['attention_us']:.2f}) | "
            f"{c['ops_per_layer']:.0f} |"
        )
    spreads = ", ".join(f"{n} {costs[n]['step_ms_spread']:.0%}" for n in names)
    print(f"\nSpread of the per-token rounds ((max - min) / median): {spreads}")


if __name__ == "__main__":
    main()
