"""Forward time of every registered positional encoding relative to ``nope``, side by side.

One process, one batch, the same model size for all: each round times one forward of every
encoding in a fresh random order (so drift and thermal effects spread evenly), and the table
reports the median over rounds as a ratio to nope's median, plus the encoding's parameter count.

    python benchmarks/bench_forward.py                      # gpt2-tiny, vocab 8192, 4 x 256, CPU
    python benchmarks/bench_forward.py --backward --rounds 5
    python benchmarks/bench_forward.py --device cuda --batch 16 --seq 1024
    python benchmarks/bench_forward.py --threads 1 --clock cpu   # on a shared, busy machine

``--clock cpu`` measures this process's CPU time instead of wall time: on a machine shared with
other jobs, wall time mostly measures the neighbours; single-threaded CPU time is much steadier.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from extrapos.model import Decoder, count_parameters, model_config
from extrapos.positions import names


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="gpt2-tiny")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--backward", action="store_true", help="time forward + backward instead of forward")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time (steadier on a busy machine; CPU only)",
    )
    ap.add_argument("--only", nargs="*", help="a subset of encodings (nope is always included)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    encodings = ["nope"] + [n for n in (args.only or names()) if n != "nope"]
    cfg_kw = dict(vocab_size=args.vocab, train_length=max(args.seq, model_config(args.size).train_length))
    models, params = {}, {}
    for name in encodings:
        torch.manual_seed(0)
        m = Decoder(model_config(args.size, positions={"name": name}, **cfg_kw)).to(args.device)
        models[name] = m.train(args.backward)
        c = count_parameters(m)
        params[name] = (c["total"], c["positional"])
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    positions = torch.arange(args.seq, device=args.device).expand(args.batch, args.seq)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def once(model) -> float:
        sync()
        t0 = clock()
        if args.backward:
            model(tokens, positions).float().logsumexp(-1).mean().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(tokens, positions)
        sync()
        return clock() - t0

    for m in models.values():  # warm-up: allocator, kernels, lazy init
        once(m)
    times = {n: [] for n in encodings}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(encodings)
        rng.shuffle(order)
        for n in order:
            times[n].append(once(models[n]))

    med = {n: statistics.median(t) for n, t in times.items()}
    kind = "forward+backward" if args.backward else "forward"
    print(
        f"{kind} of {args.size} (vocab {args.vocab}), batch {args.batch} x {args.seq} tokens on "
        f"{args.device}, "
        f"{torch.get_num_threads()} threads, {args.clock} clock, median of {args.rounds} interleaved rounds"
    )
    print(f"{'encoding':<18} {'ms':>8} {'vs nope':>8} {'spread':>7} {'params':>12} {'positional':>11}")
    for n in encodings:
        spread = (max(times[n]) - min(times[n])) / med[n]
        total, pos = params[n]
        print(f"{n:<18} {1e3 * med[n]:8.1f} {med[n] / med['nope']:8.2f} {spread:7.0%} {total:12,} {pos:11,}")
    print("spread = (max - min) / median over rounds; params = whole model, positional = the encoding's own")


if __name__ == "__main__":
    main()
