"""extrapos against transformers, x-transformers and litgpt on matched shapes and parameter counts.

Every pair (``extrapos.bench.peers.PAIRS``) is an extrapos model and a peer library's model with the same
block and positional encoding (RoPE, ALiBi, T5 bias, learned absolute, wherever the peer has it):
training step (forward + backward + fused AdamW), evaluation forward time and peak memory at each
multiple of L_t, and cached decoding ms/token. Interleaved rounds (every model once per round, the
order rotating), medians and interquartile ranges, the ratio per pair with the range of its per-round
ratios; the CPU capability and thread count head the output. A peer library that is not installed is
skipped with one line saying how to install it.

    python benchmarks/bench_peers.py [--rounds 7] [--threads 1] [--out docs/results/peers-bench]
    python benchmarks/bench_peers.py --tiny --rounds 2 --no-memory      # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rounds", type=int, default=7, help="interleaved rounds per measurement (>= 7 for a result)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument(
        "--peers",
        nargs="+",
        default=None,
        help="peer libraries: transformers x-transformers litgpt (default all)",
    )
    ap.add_argument("--encodings", nargs="+", default=None, help="rope alibi t5 learned (default all)")
    ap.add_argument(
        "--all-pairs",
        action="store_true",
        help="also the pairs off by default (transformers GPT-NeoX + RoPE)",
    )
    ap.add_argument("--note", default="", help="a line for the README written by --out (e.g. the commit)")
    ap.add_argument(
        "--out", type=Path, default=None, help="write results.json and README.md into this folder"
    )
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    ap.add_argument(
        "--measure",
        nargs="+",
        choices=["train", "decode", "eval", "memory"],
        default=["train", "decode", "eval", "memory"],
        help="which measurements to run (default all)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        help="render results.json files of one shape (runs of different --measure) as one report",
    )
    shape = ap.add_argument_group("shape (defaults: issue 28's, d 256 x 4 layers, batch 8 x 256)")
    shape.add_argument("--d-model", type=int, default=256)
    shape.add_argument("--layers", type=int, default=4)
    shape.add_argument("--heads", type=int, default=4)
    shape.add_argument("--mlp-hidden", type=int, default=768, help="SwiGLU width of the llama-style blocks")
    shape.add_argument("--vocab", type=int, default=8192)
    shape.add_argument("--batch", type=int, default=8)
    shape.add_argument("--train-length", type=int, default=256, help="L_t")
    shape.add_argument(
        "--multiples", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="evaluation lengths, x L_t"
    )
    shape.add_argument("--context", type=int, default=1024, help="prompt tokens before cached decoding")
    shape.add_argument("--new-tokens", type=int, default=32, help="timed decoding steps per round")
    shape.add_argument(
        "--tiny", action="store_true", help="a tiny shape for smoke runs (overrides the shape)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch  # after argparse: --help stays fast

    from extrapos.bench.peers import PeerShape, format_peers, run_peers, select_pairs
    from extrapos.errors import UserError
    from extrapos.files import atomic_write, ensure_writable_dir

    try:
        if args.threads < 1:
            raise UserError(f"--threads must be at least 1, got {args.threads}.")
        torch.set_num_threads(args.threads)
        shape = PeerShape(
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=args.heads,
            mlp_hidden=args.mlp_hidden,
            vocab=args.vocab,
            batch=args.batch,
            train_length=args.train_length,
            multiples=tuple(args.multiples),
            context=args.context,
            new_tokens=args.new_tokens,
        )
        if args.tiny:
            shape = dataclasses.replace(
                shape,
                d_model=32,
                n_layers=1,
                n_heads=2,
                mlp_hidden=64,
                vocab=256,
                batch=2,
                train_length=16,
                multiples=(1, 2),
                context=24,
                new_tokens=2,
            )
        shape.validate()
        pairs, skipped = select_pairs(args.peers, args.encodings, every=args.all_pairs)
        for line in skipped:
            print(line, file=sys.stderr)
        if args.out is not None:  # a folder that cannot be written fails now, not after the measurement
            ensure_writable_dir(args.out, "the peers benchmark")
        t0 = time.perf_counter()

        def progress(message: str) -> None:
            print(f"[{time.perf_counter() - t0:6.0f} s] {message}", file=sys.stderr, flush=True)

        def write(result: dict) -> None:
            """The JSON and README so far (after every measurement: a run stopped early keeps them)."""
            if args.out is None:
                return
            result["skipped"] = skipped
            atomic_write(args.out / "results.json", json.dumps(result, indent=1) + "\n")
            given = list(argv if argv is not None else sys.argv[1:])
            if "--note" in given:  # the note is printed below the command, not inside it
                del given[given.index("--note") : given.index("--note") + 2]
            command = shlex.join(["python", "benchmarks/bench_peers.py", *given])
            atomic_write(
                args.out / "README.md",
                f"# extrapos against its peers (`{command}`)\n\n"
                + (f"{args.note}\n\n" if args.note else "")
                + f"{format_peers(result, skipped)}\n\nEvery round: [results.json](results.json).\n",
            )

        if args.merge:
            from extrapos.bench.peers import merge_results

            try:
                runs = [json.loads(path.read_text()) for path in args.merge]
            except (OSError, ValueError) as e:
                raise UserError(
                    f"--merge could not read a results.json ({e}); pass the files a run wrote."
                ) from None
            skipped = sorted({line for r in runs for line in r.get("skipped", [])})
            result = merge_results(runs)
            write(result)
        else:
            result = run_peers(
                shape,
                pairs,
                rounds=args.rounds,
                memory=not args.no_memory,
                progress=progress,
                measurements=tuple(args.measure),
                after_phase=write,
            )
    except UserError as e:
        print(e, file=sys.stderr)
        return 2
    print(format_peers(result, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
