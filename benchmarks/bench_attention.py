"""Attention with each bias encoding: materialized reference vs the fast path (time and peak memory).

    python benchmarks/bench_attention.py                     # table of time / memory and their ratios
    python benchmarks/bench_attention.py --precision         # fold precision at 16k, fp32 and bf16
    python benchmarks/bench_attention.py --lengths 256,1024 --encodings alibi,t5

Head configuration of a small model: B = 1, H = 4, d_h = 32 (d = 128), forward only (no grad),
as in long-context evaluation, one torch thread by default (``--threads``). Every (encoding, length, path)
runs in a fresh subprocess and its
peak memory is the growth of the process's max RSS during the attention call (torch allocations
are invisible to tracemalloc). The reference materializes (B, H, T, T) scores, bias, mask and
weights, so it is skipped where that would exceed ``--ref-limit-gb``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

B, H, DH = 1, 4, 32
ENCODINGS = [
    "none",
    "alibi",
    "cable",
    "cable-nw",
    "cable-official",
    "kerple-log",
    "kerple-power",
    "fire",
    "t5",
    "k-cable",
]


def _setup(name: str, T: int, dtype=None):
    import torch

    from extrapos.positions import EncodingContext, build_encoding

    dtype = dtype or torch.float32
    torch.manual_seed(0)
    ctx = EncodingContext(d_model=H * DH, n_heads=H, head_dim=DH, n_layers=1, train_length=256)
    q, k, v = (torch.randn(B, H, T, DH, dtype=dtype) for _ in range(3))
    if name == "none":
        return q, k, v, None
    enc = build_encoding(name, ctx)
    x = torch.randn(B, T, H * DH)
    with torch.no_grad():
        bias = enc.bias(x, torch.arange(T).expand(B, T), 0, None)
    return q, k, v, bias


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(name: str, T: int, path: str, repeats: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from extrapos.attention import attention, attention_reference

    q, k, v, bias = _setup(name, T)
    fn = attention_reference if path == "ref" else attention
    base = _maxrss_mb()
    times = []
    with torch.no_grad():
        for _ in range(repeats + (1 if repeats > 1 else 0)):  # the first (warm-up) call sets the peak
            t0 = time.perf_counter()
            fn(q, k, v, bias)
            times.append(time.perf_counter() - t0)
            if len(times) == 1:
                peak = _maxrss_mb() - base
    print(json.dumps({"time_s": min(times[1:] or times), "peak_mb": peak}))


def run_one(name: str, T: int, path: str, repeats: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, str(T), path, str(repeats), str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {
            "error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        }
    return json.loads(res.stdout.strip().splitlines()[-1])


def table(encodings: list[str], lengths: list[int], ref_limit_gb: float, threads: int) -> None:
    header = (
        f"{'encoding':<15}{'T':>7}  {'ref ms':>10}{'fast ms':>10}{'speedup':>9}  "
        f"{'ref MB':>9}{'fast MB':>9}{'mem ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for name in encodings:
        for T in lengths:
            repeats = 5 if T <= 1024 else 2 if T <= 4096 else 1
            ref_bytes = 6 * B * H * T * T * 4  # scores, bias, masked scores, weights, ... (fp32)
            ref = run_one(name, T, "ref", repeats, threads) if ref_bytes <= ref_limit_gb * 2**30 else None
            fast = run_one(name, T, "fast", repeats, threads)
            cells = []
            for r in (ref, fast):
                cells.append(
                    "skipped" if r is None else ("error" if "error" in r else f"{1e3 * r['time_s']:.1f}")
                )
            ok = ref is not None and "error" not in ref and "error" not in fast
            speed = f"{ref['time_s'] / fast['time_s']:.2f}x" if ok else "-"
            mem = [("-" if r is None or "error" in r else f"{r['peak_mb']:.0f}") for r in (ref, fast)]
            mratio = f"{ref['peak_mb'] / max(fast['peak_mb'], 1.0):.1f}x" if ok else "-"
            print(
                f"{name:<15}{T:>7}  {cells[0]:>10}{cells[1]:>10}{speed:>9}  "
                f"{mem[0]:>9}{mem[1]:>9}{mratio:>10}",
                flush=True,
            )
            for r in (ref, fast):
                if r is not None and "error" in r:
                    print(f"    error: {r['error']}")


# ---- precision of the fold at long lengths ----------------------------------------------------


def precision(T: int) -> None:
    """Max |error| of folded attention vs a float64 reference, on blocks of query rows."""
    import torch

    from extrapos.attention import attention_reference, folded_attention
    from extrapos.positions.base import FoldedBias

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, DH) for _ in range(3))
    blocks = [(0, 64), (T // 2 - 64, T // 2), (T - 64, T)]
    biases = {}
    _, _, _, alibi = _setup("alibi", T)
    biases["alibi (k_feat = j)"] = alibi
    # CABLE-like features with S_T ~ T (mean increment 1): the scale of a trained model's S is unknown,
    # this makes it as large as ALiBi's positions
    g = torch.nn.functional.softplus(torch.randn(B, H, T))
    S = torch.cumsum(2 * torch.rand(B, H, T), -1)
    biases[f"cable (S_T = {S[..., -1].mean():.0f})"] = FoldedBias(g, S)

    def err(out, qq, kk, vv, bias):
        worst = []
        for s, e in blocks:
            blk = FoldedBias(bias.q_feat[:, :, s:e].double(), bias.k_feat[:, :, :e].double())
            ref = attention_reference(
                qq[:, :, s:e].double(), kk[:, :, :e].double(), vv[:, :, :e].double(), blk
            )
            worst.append((out[:, :, s:e].double() - ref).abs().max().item())
        return "  ".join(f"{w:9.2e}" for w in worst)

    print(f"fold precision at T = {T} (B={B}, H={H}, d_h={DH}); max |out - float64 reference| on query rows")
    print(f"{'bias':<24}{'inputs':<7}{'fold':<30}{'rows 0-63':>10} {'middle 64':>10} {'last 64':>10}")
    for label, bias in biases.items():
        with torch.no_grad():
            for dt in (torch.float32, torch.bfloat16):
                qq, kk, vv = (t.to(dt) for t in (q, k, v))
                name = "fp32" if dt == torch.float32 else "bf16"
                one = {"block": 1 << 30}  # one shift for all queries: the last key's
                variants = [
                    ("default: fp32, block shifts", {}),
                    ("fp32, one shift", one),
                    ("fp32, no shift", {"subtract_reference": False}),
                ]
                if dt == torch.bfloat16:
                    variants += [
                        ("bf16, block shifts", {"fold_dtype": torch.bfloat16}),
                        ("bf16, one shift", {"fold_dtype": torch.bfloat16, **one}),
                        ("bf16, no shift", {"fold_dtype": torch.bfloat16, "subtract_reference": False}),
                    ]
                for vname, kw in variants:
                    out = folded_attention(qq, kk, vv, bias, **kw)
                    print(f"{label:<24}{name:<7}{vname:<30}{err(out, qq, kk, vv, bias)}", flush=True)
                # what a materialized fp32 reference itself achieves on the same rows (for scale)
                if dt == torch.float32:
                    outs = torch.zeros_like(q)
                    for s, e in blocks:
                        blk = FoldedBias(bias.q_feat[:, :, s:e], bias.k_feat[:, :, :e])
                        outs[:, :, s:e] = attention_reference(qq[:, :, s:e], kk[:, :, :e], vv[:, :, :e], blk)
                    print(f"{label:<24}{name:<7}{'(materialized fp32 ref)':<30}{err(outs, qq, kk, vv, bias)}")
    print(f"bf16 output rounding alone is ~{2**-9:.1e} relative (|out| <= ~{math.sqrt(2):.1f} here)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per run (1: stable on a shared machine)"
    )
    ap.add_argument("--lengths", default="256,1024,4096,16384")
    ap.add_argument("--encodings", default=",".join(ENCODINGS))
    ap.add_argument("--ref-limit-gb", type=float, default=8.0)
    ap.add_argument("--precision", action="store_true", help="fold precision at --precision-length instead")
    ap.add_argument("--precision-length", type=int, default=16384)
    args = ap.parse_args()
    if args.worker:
        name, T, path, repeats, threads = args.worker
        worker(name, int(T), path, int(repeats), int(threads))
    elif args.precision:
        precision(args.precision_length)
    else:
        lengths = [int(t) for t in args.lengths.split(",")]
        table(args.encodings.split(","), lengths, args.ref_limit_gb, args.threads)


if __name__ == "__main__":
    main()
