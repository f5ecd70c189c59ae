"""Peak memory and time of importing a random ~125M GPT-2 (GPT-2 small shape) into an extrapos run.

    python benchmarks/bench_hf_import.py [--layers 12 --d 768 --vocab 50257]

Builds the model with transformers, ``save_pretrained``s it (with a small trained tokenizer), then
imports it in a fresh subprocess and reports that process's peak resident set (``VmHWM`` of
/proc/self/status; ``ru_maxrss`` of a child started from this big parent reports the parent's peak,
Linux keeps it across exec) next to the size of the fp32 weights, and the peak of a process that only
imported the same libraries.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import torch
from extrapos.integrations import hf
from extrapos.run.directory import load_run  # noqa: F401  (same imports in both modes)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if sys.argv[1] == "import":
    hf.import_pretrained(sys.argv[2], sys.argv[3])
elapsed = time.perf_counter() - t
status = {
    l.split(":")[0]: l.split(":")[1].strip()
    for l in open("/proc/self/status")
    if l.startswith(("VmHWM", "RssAnon", "RssFile"))
}
print(json.dumps({"peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "before_kb": base,
                  "seconds": elapsed, **status}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    args = p.parse_args()
    import torch
    import transformers as T

    from extrapos.data.tokenizer import train_bpe

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hf"
        cfg = T.GPT2Config(
            n_layer=args.layers, n_embd=args.d, n_head=args.heads, vocab_size=args.vocab, n_positions=1024
        )
        model = T.GPT2LMHeadModel(cfg)
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(src)
        del model
        train_bpe(["hello world " * 100], 300).save(src)
        weights = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        runs = {}
        for mode in ("baseline", "import"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, str(src), str(Path(tmp) / "run")],
                check=True,
                capture_output=True,
                text=True,
            )
            runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        # VmHWM, not ru_maxrss: a child's ru_maxrss keeps the parent's peak from before exec
        peak = int(runs["import"]["VmHWM"].split()[0]) * 1024
        base = int(runs["baseline"]["VmHWM"].split()[0]) * 1024
        print(
            json.dumps(
                {
                    "parameters": n_params,
                    "weights_file_bytes": weights,
                    "torch": torch.__version__,
                    "peak_rss_bytes": peak,
                    "baseline_rss_bytes": base,
                    "peak_over_weights": round(peak / weights, 3),
                    "(peak - baseline) / weights": round((peak - base) / weights, 3),
                    "import_seconds": round(runs["import"]["seconds"], 2),
                    "child": runs,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
