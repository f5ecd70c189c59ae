"""extrapos llama + RoPE against Hugging Face's LlamaForCausalLM of the same shape, one training step each.

d 256, 4 layers, 4 heads, MLP 768, vocab 8192, tied embeddings, batch 8 x 256, forward + backward +
AdamW (fused on both sides), fp32, one process; the two steps alternate for ``--rounds`` rounds
(at least 7) and the medians are compared (extrapos / transformers: below 1 is faster). Needs the
optional ``transformers`` (the dev extra installs it). ``extrapos bench`` runs the same measurement.

    python benchmarks/bench_peer.py [--rounds 9] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

import torch

from extrapos.bench import bench_peer, format_peer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = bench_peer(args.rounds)
    if r is None:
        print("transformers is not installed: pip install transformers (or the dev extra)", file=sys.stderr)
        return 2
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print(format_peer(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
