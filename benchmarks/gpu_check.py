"""`make gpu-check`: what a GPU can prove in minutes, in one JSON and one Markdown summary.

On a CUDA machine: `extrapos doctor` (every encoding's training step and cached decode in bf16 against the
float64 reference, the GPT-2-small step time), then a short GPT-2-small-shaped run (6 layers, d 512,
L_t 1024, bf16, ``--steps`` steps, default 200) per encoding family with its loss required to fall.

Without CUDA it runs a **stand-in**, labelled as such in both summaries: the same doctor on the CPU paths
(fp32) and the same per-family runs at cpu-tiny size for ``--steps`` steps (default 20), so the script
itself is exercised on every machine; nothing in a stand-in says anything about a GPU.

Not yet in it (issue 27 lists them; they need a GPU to mean anything): kill -9 and resume identical on
the GPU, FSDP2 / DDP over NCCL, evaluation at 1..16x of L_t = 1024 with peak memory per encoding, the
bench's MFU against a measured bf16 matmul peak.

    python benchmarks/gpu_check.py [--out gpu-check] [--steps N] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

#: one encoding per family (issue 27): rotary, linear bias, CABLE, kernelized, MLP bias, buckets, ExPE
FAMILIES = ["rope", "alibi", "cable", "kerple-log", "fire", "t5", "expe"]


def family_run(name: str, out: Path, steps: int, cuda: bool) -> dict:
    """A short training run of ``name``: the first and last logged losses, and whether the loss fell."""
    from extrapos.config import load_config
    from extrapos.train import train

    sets = [f"model.positions.name={name}", f"train.steps={steps}", "train.log_every=1", "train.eval_every=0"]
    sets += ["train.checkpoint_every=0"]
    if cuda:  # a GPT-2-small-shaped body at the papers' L_t, in bf16
        sets += ['model.size="gpt2-tiny"', "model.train_length=1024", 'train.precision="bf16"']
    t0 = time.perf_counter()
    train(load_config("cpu/tiny", sets), out / name, progress=False)
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("loss") is not None]  # training lines, not eval lines
    head, tail = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    return {"encoding": name, "steps": steps, "first": head, "last": tail, "fell": tail < head,
            "seconds": time.perf_counter() - t0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="where the summaries and runs go")
    ap.add_argument("--steps", type=int, default=None, help="steps per family (default 200 on CUDA, 20 else)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated encodings to train")
    args = ap.parse_args(argv)

    import torch

    from extrapos.doctor import doctor, format_report

    cuda = torch.cuda.is_available() and args.device != "cpu"
    steps = args.steps or (200 if cuda else 20)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mode = "GPU" if cuda else "STAND-IN (no CUDA device: CPU paths only; nothing here is about a GPU)"
    print(f"gpu-check: {mode}", file=sys.stderr)
    report = doctor(args.device)
    runs = [family_run(name, out / "runs", steps, cuda) for name in args.families.split(",") if name]
    summary = {"mode": mode, "doctor": report.to_dict(), "runs": runs,
               "ok": report.ok and all(r["fell"] for r in runs)}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# gpu-check: {mode}", "", "## extrapos doctor", "", format_report(report), "",
             f"## Short runs ({steps} steps each): the loss must fall", "",
             "| encoding | loss, first 3 steps | last 3 steps | fell | seconds |",
             "|---|---:|---:|---|---:|"]  # fmt: skip
    for r in runs:
        fell = "yes" if r["fell"] else "NO"
        row = f"| {r['encoding']} | {r['first']:.3f} | {r['last']:.3f} | {fell} | {r['seconds']:.1f} |"
        lines.append(row)
    lines += ["", "ok" if summary["ok"] else "FAILED: see the rows above"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
