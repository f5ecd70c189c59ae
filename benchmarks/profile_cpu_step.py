"""Where a CPU training step's time goes, by op family (issue 39): GEMMs, attention, norms and
activations, casts, embedding, head + loss, optimizer, data, elementwise, the rest.

    python benchmarks/profile_cpu_step.py                  # cpu-small and gpt2-tiny, fp32 and bf16
    python benchmarks/profile_cpu_step.py --models cpu-small --precisions fp32 \
        --encodings nope kerple-log t5 fire fox

Each step is the bench's (``extrapos bench``: vocab 8192, L_t 256, batch 8, fused AdamW, the trainer's
head fused with the loss in fp32; under bf16 autocast the plain head and loss) plus the batch cut from
an in-memory token array, as the trainer's sampler does. ``torch.profiler`` records a few steps after a
warm-up. The model's attention call, its head + loss, the optimizer and the batch are labelled ranges:
an op inside one, or run by the backward node such an op created (the same autograd sequence number),
is charged to it; a cast (``aten::to`` and its backward) to "casts"; every other op by its name
(FAMILIES). The step is timed without the profiler on the *CPU time of the calling thread*
(``time.thread_time``) at one thread, because on a shared machine the wall clock mostly measures the
other processes; the profiler's op times are wall times, so the table gives each family's share of
the profiled op time and that share of the step's CPU time. The matmul peak is measured on the same
clock (best of several bursts at n = 1024 and 2048), and the step's model FLOP/s (``flops_per_token``)
is given as a fraction of it. The CPU capability, its bf16 units and the load average head the output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from extrapos.bench.measure import BenchSettings, bench_model
from extrapos.losses import model_loss_sum
from extrapos.model import flops_per_token
from extrapos.run.precision import cpu_bf16_units
from extrapos.run.runtime import autocast

#: (family, pattern on the aten op's name), for the ops outside every labelled range: first match wins
FAMILIES = [
    (
        "GEMMs",
        r"^aten::(mm|addmm|bmm|baddbmm|addbmm|_addmm_activation|linear|matmul)$|mkldnn.*(matmul|linear)",
    ),
    ("norms / activations", r"layer_norm|rms_norm|gelu|silu|tanh|sigmoid"),
    ("casts", r"^aten::(to|_to_copy|type_as)$"),
    ("embedding", r"embedding"),
    ("autograd engine", r"^autograd::|Backward\d*$"),
    (
        "copies / layout",
        r"^aten::(copy_|clone|contiguous|cat|stack|flip|unfold|as_strided.*|index.*|gather)$",
    ),
    (
        "elementwise",
        r"^aten::(add|add_|sub|sub_|mul|mul_|div|div_|neg|abs|log|log1p|exp|pow|sqrt|rsqrt|"
        r"clamp.*|round|where|sum|mean|fill_|zero_|ones_like|zeros_like|full|empty.*|arange|cumsum|max|min)$",
    ),
]
#: the labelled ranges: every op run inside one (forward) or by the backward node it created is charged
#: to it whole, whatever its name
RANGES = ["attention", "head + loss", "optimizer", "data"]
ORDER = RANGES[:1] + [f for f, _ in FAMILIES] + RANGES[1:] + ["other ops"]
CASTS = ("aten::to", "aten::_to_copy", "autograd::engine::evaluate_function: ToCopyBackward0")


def family(name: str) -> str:
    for fam, pattern in FAMILIES:
        if re.search(pattern, name):
            return fam
    return "other ops"


def labelled(fn, label: str):
    def wrapped(*args, **kwargs):
        with record_function("r:" + label):
            return fn(*args, **kwargs)

    return wrapped


def label_ranges() -> None:
    """The model's attention call and its head + loss in labelled ranges (the names model.py calls; the
    head's own matmul too, which under autocast runs before the loss)."""
    import extrapos.model as model_module

    if not getattr(model_module.Decoder.logits, "labelled", False):
        head = labelled(model_module.Decoder.logits, "head + loss")
        head.labelled = True  # type: ignore[attr-defined]
        model_module.Decoder.logits = head  # type: ignore[method-assign]

    for name, label in (
        ("attention", "attention"),
        ("linear_cross_entropy_sum", "head + loss"),
        ("masked_loss_sum", "head + loss"),
    ):
        fn = getattr(model_module, name)
        if not getattr(fn, "labelled", False):
            wrapped = labelled(fn, label)
            wrapped.labelled = True  # type: ignore[attr-defined]
            setattr(model_module, name, wrapped)


def _range_of(event) -> str | None:
    """The innermost labelled range (or cast) around a forward op, else None."""
    e = event
    while e is not None:
        if e.name.startswith("r:"):
            return e.name[2:]
        if e.name in CASTS:
            return "casts"
        if e.name.startswith("Optimizer."):
            return "optimizer"
        e = e.cpu_parent
    return None


def _backward_node(event):
    e = event
    while e is not None:
        if e.name.startswith("autograd::engine::evaluate_function"):
            return e
        e = e.cpu_parent
    return None


def attribute(events, steps: int) -> dict[str, float]:
    """ms per step by family: each op's self time to its range (forward: the range around it; backward: the
    range of the forward op that created its node, by autograd sequence number), else its name's family."""
    by_seq: dict[int, str | None] = {}
    # an op that creates no node records the next sequence number too: the last one in start order wins
    for e in sorted(events, key=lambda e: e.time_range.start):
        if _backward_node(e) is None and getattr(e, "sequence_nr", -1) >= 0:
            by_seq[e.sequence_nr] = _range_of(e)
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name.startswith("r:"):
            out[e.name[2:]] += e.self_cpu_time_total
            continue
        node = _backward_node(e)
        if node is None:
            label = _range_of(e)
        elif node.name in CASTS:
            label = "casts"
        else:
            label = by_seq.get(getattr(node, "sequence_nr", -1))
        out[label or family(e.name)] += e.self_cpu_time_total
    return {k: v / 1e3 / steps for k, v in out.items()}


def load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def matmul_peak(precision: str) -> float:
    """FLOP/s of n x n matmuls by this thread's CPU time, best of several bursts at 1024 and 2048."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    best = 0.0
    for n in (1024, 2048):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b
        reps = 4 if n == 1024 else 1
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(reps):
                a @ b
            best = max(best, 2 * n**3 * reps / max(time.thread_time() - t0, 1e-9))
    return best


class Step:
    """One training step of a bench model, its batch cut from a token array like the trainer's."""

    def __init__(self, size: str, encoding: str, precision: str, batch: int):
        self.s = BenchSettings(size=size, batch=batch)
        self.model = bench_model(encoding, self.s)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.precision = precision
        g = torch.Generator().manual_seed(0)
        self.stream = torch.randint(0, self.s.vocab, (batch * (self.s.train_length + 1) * 16,), generator=g)
        self.starts = torch.randint(0, len(self.stream) - self.s.train_length - 1, (10_000,), generator=g)
        self.n = 0

    def batch(self):
        with record_function("r:data"):
            i = self.starts[self.n * self.s.batch : (self.n + 1) * self.s.batch].tolist()
            self.n = (self.n + 1) % (len(self.starts) // self.s.batch)
            rows = torch.stack([self.stream[j : j + self.s.train_length + 1] for j in i]).long()
            x, y = rows[:, :-1], rows[:, 1:]
            pos = torch.arange(self.s.train_length).expand(len(i), -1)
            return x, pos, y, torch.ones(y.shape)

    def __call__(self) -> float:
        x, pos, y, mask = self.batch()
        with autocast(torch.device("cpu"), self.precision):
            loss = model_loss_sum(self.model, x, pos, y, mask) / mask.numel()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    @property
    def flops(self) -> float:
        return flops_per_token(self.model.cfg, self.s.train_length) * self.s.batch * self.s.train_length


def profile_step(step: Step, steps: int) -> dict[str, float]:
    """ms per step by family (``attribute``) over ``steps`` profiled steps. The profiler's op times are
    wall times, so they are reported as shares and scaled to the step's CPU time by the caller."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return attribute(prof.events(), steps)


def time_steps(step: Step, rounds: int) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    for _ in range(rounds):
        t0, w0 = time.thread_time(), time.perf_counter()
        step()
        cpu.append(time.thread_time() - t0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["cpu-small", "gpt2-tiny"])
    ap.add_argument("--encodings", nargs="+", default=["nope"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--rounds", type=int, default=5, help="timed steps (no profiler)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    label_ranges()
    loads = [load()]
    peaks = {p: matmul_peak(p) for p in args.precisions}
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, bf16 units {cpu_bf16_units()}, 1 thread, "
        f"torch {torch.__version__}; matmul peak (thread CPU time) "
        + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items())
        + f"; load average {loads[0]}"
    )
    results = []
    for size in args.models:
        for enc in args.encodings:
            for prec in args.precisions:
                step = Step(size, enc, prec, args.batch)
                for _ in range(2):
                    step()
                cpu, wall = time_steps(step, args.rounds)
                fams = profile_step(step, args.steps)
                ms = statistics.median(cpu) * 1e3
                row = {
                    "model": size,
                    "encoding": enc,
                    "precision": prec,
                    "step_cpu_ms": ms,
                    "step_cpu_ms_rounds": [c * 1e3 for c in cpu],
                    "step_wall_ms": statistics.median(wall) * 1e3,
                    "gflops": step.flops / (ms / 1e3) / 1e9,
                    "peak_fraction": step.flops / (ms / 1e3) / peaks[prec],
                    "families_ms": fams,
                    "load": load(),
                }
                results.append(row)
                print(
                    f"{size} {enc} {prec}: step {ms:.0f} ms CPU ({row['step_wall_ms']:.0f} ms wall), "
                    f"{row['gflops']:.0f} GFLOP/s = {row['peak_fraction']:.0%} of the {prec} peak, "
                    f"load {row['load']}",
                    file=sys.stderr,
                    flush=True,
                )
    print(format_families(results))
    loads.append(load())
    print(f"\nload average before / after: {loads[0]} / {loads[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks": peaks, "loads": loads, "results": results}, f, indent=1)
    return 0


def format_families(results: list[dict]) -> str:
    """One column per profiled step: each family's share of the profiled op time, and that share of the
    step's CPU time in ms."""
    heads = [f"{r['model']} {r['encoding']} {r['precision']}" for r in results]
    lines = [
        "| family: ms of the step (share) | " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for fam in ORDER:
        cells = []
        for r in results:
            share = r["families_ms"].get(fam, 0.0) / sum(r["families_ms"].values())
            cells.append(f"{share * r['step_cpu_ms']:.0f} ({share:.0%})")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    lines.append(
        "| **step, thread CPU time (median)** | "
        + " | ".join(f"{r['step_cpu_ms']:.0f}" for r in results)
        + " |"
    )
    lines.append("| model GFLOP/s | " + " | ".join(f"{r['gflops']:.0f}" for r in results) + " |")
    lines.append(
        "| fraction of the matmul peak | " + " | ".join(f"{r['peak_fraction']:.0%}" for r in results) + " |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
