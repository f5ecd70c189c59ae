"""Where the llama training step's time goes: extrapos (llama flavour + RoPE) against transformers'
``LlamaForCausalLM`` on ``bench_peers.py``'s matched shapes, at 1 and 2 threads.

    python benchmarks/profile_llama_step.py          # threads 1 2, 7 timed rounds, 3 profiled steps
    python benchmarks/profile_llama_step.py --threads 1 --rounds 9 --json /tmp/profile.json

For each thread count: the step (forward + backward + fused AdamW, the sides' own ``loss`` as
``bench_peers.py`` runs it) timed in interleaved rounds without the profiler (medians, spreads, the
per-round ratio range), then a few steps of each side under ``torch.profiler``. Every component is
labelled without editing either library: forward hooks open a ``record_function`` range around the
norms, projections, MLPs and embedding modules, the rotary functions and the losses are wrapped; an op
run in forward belongs to the innermost range around it, and the backward node it created (the same
autograd sequence number) is charged to the same component, so each share covers forward and
backward. What no range covers (residual adds, views, the autograd engine between nodes) is "other".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.autograd.profiler import record_function

GROUPS = [
    "embedding",
    "norms",
    "q/k/v/o projections",
    "rotary",
    "attention (SDPA)",
    "MLP projections",
    "SwiGLU activation",
    "head + loss",
    "optimizer (AdamW)",
    "zero_grad",
    "other",
]


class Labels:
    """Forward pre/post hooks that open and close a ``record_function`` range per labelled module."""

    def __init__(self) -> None:
        self.stack: list = []
        self.handles: list = []

    def module(self, m: torch.nn.Module, label: str) -> None:
        def pre(mod, args):
            rf = record_function("c:" + label)
            rf.__enter__()
            self.stack.append(rf)

        def post(mod, args, out):
            self.stack.pop().__exit__(None, None, None)

        self.handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]


def wrap(fn: Callable, label: str) -> Callable:
    def wrapped(*args, **kwargs):
        with record_function("c:" + label):
            return fn(*args, **kwargs)

    return wrapped


def label_extrapos(side, labels: Labels) -> None:
    import extrapos.losses as losses

    m = side.module
    for mod in m.modules():
        name = type(mod).__name__
        if isinstance(mod, torch.nn.RMSNorm):
            labels.module(mod, "norms")
        elif isinstance(mod, torch.nn.Embedding):
            labels.module(mod, "embedding")
        elif name == "Attention":
            labels.module(mod, "attention (SDPA)")
            labels.module(mod.qkv, "q/k/v/o projections")
            labels.module(mod.proj, "q/k/v/o projections")
        elif name == "MLP":
            labels.module(mod, "SwiGLU activation")
            for lin in (mod.gate, mod.up, mod.down):
                labels.module(lin, "MLP projections")
    m.pos.rotate = wrap(m.pos.rotate, "rotary")
    fwd = losses._LinearCrossEntropy.forward
    if not getattr(fwd, "labelled", False):
        new = staticmethod(wrap(fwd, "head + loss"))
        new.__func__.labelled = True
        losses._LinearCrossEntropy.forward = new


def label_hf(side, labels: Labels) -> None:
    import torch.nn.functional as F
    from transformers.models.llama import modeling_llama as ml

    m = side.module
    for mod in m.modules():
        name = type(mod).__name__
        if name == "LlamaRMSNorm":
            labels.module(mod, "norms")
        elif isinstance(mod, torch.nn.Embedding):
            labels.module(mod, "embedding")
        elif name == "LlamaRotaryEmbedding":
            labels.module(mod, "rotary")
        elif name == "LlamaAttention":
            labels.module(mod, "attention (SDPA)")
            for lin in (mod.q_proj, mod.k_proj, mod.v_proj, mod.o_proj):
                labels.module(lin, "q/k/v/o projections")
        elif name == "LlamaMLP":
            labels.module(mod, "SwiGLU activation")
            for lin in (mod.gate_proj, mod.up_proj, mod.down_proj):
                labels.module(lin, "MLP projections")
    labels.module(m.lm_head, "head + loss")
    if not getattr(ml.apply_rotary_pos_emb, "labelled", False):
        ml.apply_rotary_pos_emb = wrap(ml.apply_rotary_pos_emb, "rotary")
        ml.apply_rotary_pos_emb.labelled = True  # type: ignore[attr-defined]
    if not getattr(F.cross_entropy, "labelled", False):
        F.cross_entropy = wrap(F.cross_entropy, "head + loss")
        F.cross_entropy.labelled = True  # type: ignore[attr-defined]


def _label_of(event) -> str | None:
    e = event
    while e is not None:
        if e.name.startswith("c:"):
            return e.name[2:]
        e = e.cpu_parent
    return None


def _in_backward(event) -> bool:
    e = event.cpu_parent
    while e is not None:
        if e.name.startswith("autograd::engine::evaluate_function"):
            return True
        e = e.cpu_parent
    return False


def attribute(events, steps: int) -> dict[str, float]:
    """ms per step per group from one profiled run of ``steps`` steps (see the module doc)."""
    by_seq: dict[int, str] = {}
    out: dict[str, float] = defaultdict(float)
    step_total = 0.0
    for e in events:
        if e.name == "c:step":
            step_total += e.cpu_time_total
    # an op that creates no autograd node still records the next sequence number (a view before the
    # loss records the loss's): the last op to record a number, in start order, is its node's creator
    for e in sorted(events, key=lambda e: e.time_range.start):
        if e.name.startswith("c:") or e.name.startswith("autograd::") or _in_backward(e):
            continue
        label = _label_of(e)
        if label in ("optimizer (AdamW)", "zero_grad"):
            continue  # counted as their whole ranges below
        if getattr(e, "sequence_nr", -1) >= 0 and label is not None:
            by_seq[e.sequence_nr] = label
        if label is not None and label != "step":
            out[label] += e.self_cpu_time_total
    for e in events:
        if e.name.startswith("autograd::engine::evaluate_function"):
            label = by_seq.get(getattr(e, "sequence_nr", -1))
            if label is not None:
                out[label] += e.cpu_time_total
        elif e.name in ("c:optimizer (AdamW)", "c:zero_grad"):
            out[e.name[2:]] += e.cpu_time_total
    out.pop("step", None)  # backward of ops run in the step outside every component: "other"
    attributed = sum(out.values())
    out["other"] = step_total - attributed
    return {k: v / 1e3 / steps for k, v in out.items()} | {"step": step_total / 1e3 / steps}


def run(threads: int, rounds: int, profiled: int, log) -> dict:
    from extrapos.bench.peers import PeerShape, build_side

    torch.set_num_threads(threads)
    shape = PeerShape()
    keys = ["extrapos/llama/rope", "transformers/llama/rope"]
    sides = {k: build_side(k, shape) for k in keys}
    labels = Labels()
    label_extrapos(sides[keys[0]], labels)
    label_hf(sides[keys[1]], labels)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.train_length + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    opts = {k: torch.optim.AdamW(s.module.parameters(), lr=1e-4, fused=True) for k, s in sides.items()}
    for s in sides.values():
        s.module.train()

    def step(key: str) -> float:
        t0 = time.perf_counter()
        with record_function("c:step"):
            sides[key].loss(x, y).backward()
            with record_function("c:optimizer (AdamW)"):
                opts[key].step()
            with record_function("c:zero_grad"):
                opts[key].zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    for k in keys:
        step(k)
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % 2 :] + keys[: r % 2]:
            times[k].append(step(k))
    per_round = [a / b for a, b in zip(times[keys[0]], times[keys[1]])]
    result: dict = {"threads": threads, "times_s": times, "per_round_ratio": per_round, "groups": {}}
    med = {k: statistics.median(v) for k, v in times.items()}
    log(
        f"threads {threads}: step extrapos {med[keys[0]] * 1e3:.0f} ms, "
        f"transformers {med[keys[1]] * 1e3:.0f} ms, "
        f"ratio {med[keys[0]] / med[keys[1]]:.3f} (per round {min(per_round):.3f}-{max(per_round):.3f}), "
        f"spreads {_spread(times[keys[0]]):.2f} / {_spread(times[keys[1]]):.2f}"
    )
    for k in keys:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(profiled):
                step(k)
        result["groups"][k] = attribute(prof.events(), profiled)
    return result


def _spread(t: list[float]) -> float:
    return (max(t) - min(t)) / statistics.median(t)


def table(results: list[dict]) -> str:
    keys = ["extrapos/llama/rope", "transformers/llama/rope"]
    head = "| op group |"
    rule = "|---|"
    for r in results:
        for k in keys:
            head += f" {k.split('/')[0]}, {r['threads']} thr: ms (share) |"
            rule += "---:|"
    lines = [head, rule]
    for grp in GROUPS + ["step"]:
        row = f"| {grp} |"
        for r in results:
            for k in keys:
                gr = r["groups"][k]
                v = gr.get(grp, 0.0)
                row += f" {v:.0f} ({100 * v / gr['step']:.0f}%) |" if grp != "step" else f" {v:.0f} |"
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds (no profiler)")
    ap.add_argument("--profiled", type=int, default=3, help="profiled steps per side")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    log = lambda line: print(line, flush=True)  # noqa: E731
    import transformers

    log(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"capability {torch.backends.cpu.get_cpu_capability()}"
    )
    results = [run(t, args.rounds, args.profiled, log) for t in args.threads]
    log(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
