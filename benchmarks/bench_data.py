"""Data-layer speed: preparing the default corpus, and sampler throughput from the memmap.

Prints figures (not a timed test). Targets on a 2-core CPU: prepare sotu with a freshly trained
bpe:8192 in < 60 s; ContiguousSampler > 1M tokens/s.

    python benchmarks/bench_data.py [--corpus sotu] [--tokenizer bpe:8192] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from extrapos.data import ContiguousSampler, open_split, prepare_data


def bench_prepare(corpus: str, tokenizer: str, workdir: Path) -> Path:
    started = time.perf_counter()
    out = prepare_data(corpus, tokenizer, workdir / "prepared", progress=False)  # fresh dir: no reuse
    seconds = time.perf_counter() - started
    split = open_split(out, "train")
    total = sum(s["num_tokens"] for s in split.manifest["splits"].values())
    print(
        f"prepare {corpus} with {tokenizer} (trained fresh): {seconds:.1f} s "
        f"({total:,} tokens, {total / seconds:,.0f} tokens/s incl. training, {os.cpu_count()} cores)"
    )
    return out


def bench_sampler(
    data_dir: Path, seq_len: int, batch_size: int, seconds: float, packed: bool = False
) -> None:
    sampler = ContiguousSampler(open_split(data_dir, "train"), seq_len, batch_size, seed=0, packed=packed)
    sampler.next_batch()  # warm the page cache and the epoch order
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        sampler.next_batch()
        batches += 1
    elapsed = time.perf_counter() - started
    rate = batches * batch_size * seq_len / elapsed
    mode = "packed" if packed else "in-document"
    print(
        f"sampler {mode:<11} seq_len={seq_len:<5} batch={batch_size:<3}: {rate / 1e6:6.1f} M tokens/s "
        f"({batches / elapsed:,.0f} batches/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="sotu")
    parser.add_argument("--tokenizer", default="bpe:8192")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per sampler measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = bench_prepare(args.corpus, args.tokenizer, Path(tmp))
        for seq_len, batch_size in [(64, 32), (512, 16), (2048, 8)]:
            bench_sampler(out, seq_len, batch_size, args.seconds)
        bench_sampler(out, 512, 16, args.seconds, packed=True)


if __name__ == "__main__":
    main()
