"""The training step of this checkout against the same step at an older commit, in one process (issue 39:
did the bias encodings' training get slower since the docs' bench run, de19168?).

    python benchmarks/step_against_commit.py --commit de19168
    python benchmarks/step_against_commit.py --commit de19168 --encodings nope t5 fox --rounds 9

The commit's ``src/extrapos`` is extracted (``git archive``) into a temporary folder as the package
``extrapos_then`` (its imports rewritten), so both versions build the bench's model (``extrapos bench``:
cpu-small, vocab 8192, L_t 256, batch 8, fused AdamW, the trainer's fused head + loss) from the same
seed side by side. Three answers per encoding:

- the eager ops one step issues, counted by ``torch.profiler`` (a count: independent of the load), and
  whether the two versions issue the same ops in the same numbers;
- whether the losses of the profiled step are bit-identical;
- the step timed in interleaved rounds (every round runs every version of every encoding, the order
  rotating) on the thread's CPU time at one thread (``--clock cpu`` of the bench), with the per-round
  ratio now / then and each version's ratio to its own NoPE.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
THEN = "extrapos_then"


def extract(commit: str, into: Path) -> None:
    """The commit's src/extrapos as the package THEN under ``into``."""
    archive = into / "src.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--output", str(archive), commit, "src/extrapos"], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (into / "src" / "extrapos").rename(into / THEN)
    pattern = re.compile(r"\b(from|import) extrapos(\.|\b)")
    for path in (into / THEN).rglob("*.py"):
        path.write_text(pattern.sub(rf"\1 {THEN}\2", path.read_text()))


def build(package: str, encoding: str):
    model_mod = importlib.import_module(f"{package}.model")
    losses = importlib.import_module(f"{package}.losses")
    torch.manual_seed(0)
    cfg = model_mod.model_config("cpu-small", vocab_size=8192, train_length=256, positions={"name": encoding})
    model = model_mod.Decoder(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 8192, (8, 257), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos, mask = torch.arange(256).expand(8, -1), torch.ones(y.shape)

    def step() -> float:
        loss = losses.model_loss_sum(model, x, pos, y, mask) / mask.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def op_counts(step) -> tuple[Counter, float]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = step()
    return Counter(e.name for e in prof.events()), loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="de19168")
    ap.add_argument(
        "--encodings", nargs="+", default=["nope", "t5", "fox", "kerple-log", "kerple-power", "fire"]
    )
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if "nope" not in args.encodings:
        args.encodings.insert(0, "nope")
    with tempfile.TemporaryDirectory() as tmp:
        extract(args.commit, Path(tmp))
        sys.path.insert(0, tmp)
        steps = {
            (v, e): build(p, e) for v, p in (("then", THEN), ("now", "extrapos")) for e in args.encodings
        }
        load0 = os.getloadavg()[0]
        print(
            f"this checkout against {args.commit}: CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"1 thread, torch {torch.__version__}, {args.rounds} interleaved rounds, thread CPU time"
        )
        print("\n| encoding | eager ops then / now | same ops | same loss |")
        print("|---|---:|---|---|")
        for e in args.encodings:
            for version in ("then", "now"):
                steps[(version, e)]()  # warm-up
            (a, la), (b, lb) = op_counts(steps[("then", e)]), op_counts(steps[("now", e)])
            same = "yes" if a == b else f"no: {dict((a - b) + (b - a))}"
            print(f"| {e} | {sum(a.values())} / {sum(b.values())} | {same} | {'yes' if la == lb else 'no'} |")
        keys = list(steps)
        times: dict = {k: [] for k in keys}
        for r in range(args.rounds):
            for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
                t0 = time.thread_time()
                steps[k]()
                times[k].append(time.thread_time() - t0)

        def ratio(a: list[float], b: list[float]) -> str:
            rounds = [x / y for x, y in zip(a, b)]
            med = statistics.median(a) / statistics.median(b)
            return f"{med:.2f} ({min(rounds):.2f}-{max(rounds):.2f})"

        print(
            "\n| encoding | then ms | now ms | now / then (rounds) | then x nope (rounds) "
            "| now x nope (rounds) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for e in args.encodings:
            then, now = times[("then", e)], times[("now", e)]
            print(
                f"| {e} | {statistics.median(then) * 1e3:.0f} | {statistics.median(now) * 1e3:.0f} | "
                f"{ratio(now, then)} | {ratio(then, times[('then', 'nope')])} | "
                f"{ratio(now, times[('now', 'nope')])} |"
            )
        print(f"\nload average before / after: {load0:.1f} / {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
