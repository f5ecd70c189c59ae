"""FIRE's gridded form (``positions.grid = G``) against the exact MLP: the error it introduces and what it
costs, in one run.

    python benchmarks/bench_fire_grid.py                 # 1 thread, grids 256,1024,4096
    python benchmarks/bench_fire_grid.py --threads 2 --grids 1024 --rounds 9

Error: a tiny FIRE model (2 layers, d = 64, L_t = 64) trained for a few hundred steps on sequences
that repeat a random block of random period (the next token is the one P back, so attention has to
find a distance), then the same weights with the grid: max / mean |bias difference| over the visible
pairs of every layer and head at 1x / 4x / 16x L_t (queries past L_t depend on (i - j, i)), and the
difference of the held-out loss. The bound h / 4 sum_m |w1_m W2[h, m]| (h = 1 / (G - 1), FIRE's
docstring) is printed beside the measured maximum.

Cost: the ``extrapos bench`` model (cpu-small, L_t = 256), NoPE, exact FIRE and gridded FIRE with
the same weights, evaluation (no grad) at 4x / 16x L_t and a training step at L_t with L = L_t / 4
(the threshold learned below the training length: 3/4 of the queries past L, the per-pair path under
autograd), interleaved rounds in one process (``extrapos.bench``'s rotation), medians and spreads
((max - min) / median).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from extrapos.attention import bias_block
from extrapos.bench import BenchSettings, interleaved, timing_spread
from extrapos.losses import model_loss_sum
from extrapos.model import Decoder, model_config


def periodic_batch(B: int, T: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """(B, T + 1) tokens: a random block of period P in [4, 24] repeated."""
    rows = []
    for _ in range(B):
        P = int(torch.randint(4, 25, (1,), generator=g))
        block = torch.randint(0, vocab, (P,), generator=g)
        rows.append(block.repeat(T // P + 2)[: T + 1])
    return torch.stack(rows)


def tiny_fire(grid: int = 0, **options) -> Decoder:
    cfg = model_config(
        n_layers=2,
        d_model=64,
        n_heads=4,
        vocab_size=64,
        train_length=64,
        positions={"name": "fire", "grid": grid, **options},
    )
    return Decoder(cfg)


def loss(model: Decoder, tokens: torch.Tensor) -> float:
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(x.shape[1]).expand_as(x)
    return (model_loss_sum(model, x, pos, y, torch.ones(y.shape)) / y.numel()).item()


def train_tiny(steps: int, log) -> Decoder:
    torch.manual_seed(0)
    model = tiny_fire()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for s in range(steps):
        tokens = periodic_batch(16, 64, 64, g)
        x, y = tokens[:, :-1], tokens[:, 1:]
        pos = torch.arange(64).expand(16, -1)
        (model_loss_sum(model, x, pos, y, torch.ones(y.shape)) / y.numel()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s % 100 == 0 or s == steps - 1:
            log(f"  train step {s}: loss {loss(model, tokens):.3f}")
    return model.eval()


@torch.no_grad()
def bias_error(exact: Decoder, gridded: Decoder, T: int) -> tuple[float, float, float]:
    """max and mean |difference| over the visible pairs of every layer and head, and the bound."""
    pos = torch.arange(T)[None]
    x = torch.zeros(1, T, exact.cfg.d_model)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    worst, total, count, bound = 0.0, 0.0, 0, 0.0
    G = gridded.pos.options.grid
    for layer in range(exact.cfg.n_layers):
        a = bias_block(exact.pos.bias(x, pos, layer, None))[0]
        b = bias_block(gridded.pos.bias(x, pos, layer, None))[0]
        d = (a - b).abs()[:, mask]
        worst, total, count = max(worst, d.max().item()), total + d.sum().item(), count + d.numel()
        mlp = exact.pos.mlps[layer]
        kink = (mlp[0].weight[:, 0].abs() * mlp[2].weight.abs()).sum(-1).max().item()
        bound = max(bound, kink / (4 * (G - 1)))
    return worst, total / count, bound


def grad_error(exact: Decoder, other: Decoder, tokens: torch.Tensor) -> tuple[float, float]:
    """|loss difference| and max |gradient difference| / max |gradient| of one training forward and
    backward (autograd: the training path) at the length of ``tokens``."""
    grads, losses = [], []
    for m in (exact, other):
        m.zero_grad(set_to_none=True)
        x, y = tokens[:, :-1], tokens[:, 1:]
        pos = torch.arange(x.shape[1]).expand_as(x)
        value = model_loss_sum(m, x, pos, y, torch.ones(y.shape)) / y.numel()
        value.backward()
        losses.append(value.item())
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
        m.zero_grad(set_to_none=True)
    return abs(losses[1] - losses[0]), ((grads[1] - grads[0]).abs().max() / grads[0].abs().max()).item()


def error_table(grids: list[int], steps: int, log) -> list[dict]:
    exact = train_tiny(steps, log)
    g = torch.Generator().manual_seed(7)
    batch = periodic_batch(4, 256, 64, g)  # 4x L_t: 3/4 of the queries past L
    for name, options in [("piecewise", {"piecewise": True})] + [(f"grid {G}", {"grid": G}) for G in grids]:
        other = tiny_fire(**options)
        other.load_state_dict(exact.state_dict())
        dl, dg = grad_error(exact, other, batch)
        log(
            f"  training step at 4x, exact MLP vs {name}: |loss diff| {dl:.1e}, "
            f"max |grad diff| / max |grad| {dg:.1e}"
        )
    g = torch.Generator().manual_seed(123)
    rows = []
    for k in (1, 4, 16):
        T = 64 * k
        held_out = periodic_batch(8, T, 64, g)
        ref = loss(exact, held_out)
        for G in grids:
            gridded = tiny_fire(G).eval()
            gridded.load_state_dict(exact.state_dict())
            worst, mean, bound = bias_error(exact, gridded, T)
            got = loss(gridded, held_out)
            rows.append(
                dict(length=f"{k}x", T=T, grid=G, bias_max=worst, bias_mean=mean, bound=bound, loss_exact=ref,
                     loss_grid=got, loss_diff=got - ref)
            )  # fmt: skip
            log(
                f"  {k:>2}x grid {G:>5}: bias max {worst:.2e} (bound {bound:.2e}) mean {mean:.2e}; "
                f"loss {ref:.5f} -> {rows[-1]['loss_grid']:.5f} ({rows[-1]['loss_diff']:+.1e})"
            )
    return rows


def cost_table(grid: int, rounds: int, log) -> dict:
    s = BenchSettings()
    models: dict[str, Decoder] = {}
    for name, positions in (
        ("nope", {"name": "nope"}),
        ("fire", {"name": "fire"}),
        ("fire-piecewise", {"name": "fire", "piecewise": True}),
        (f"fire-grid{grid}", {"name": "fire", "grid": grid}),
    ):
        torch.manual_seed(0)
        cfg = model_config(s.size, vocab_size=s.vocab, train_length=s.train_length, positions=positions)
        models[name] = Decoder(cfg)
    for name in list(models)[2:]:
        models[name].load_state_dict(models["fire"].state_dict())
    names = list(models)
    out: dict = {"eval": {}, "train": {}}
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in models.values():
            m.eval()
        for k in (4, 16):
            T = k * s.train_length
            tokens = torch.randint(0, s.vocab, (1, T), generator=g)
            pos = torch.arange(T)[None]

            def run(name: str, tokens=tokens, pos=pos) -> float:
                t0 = time.perf_counter()
                models[name].hidden_states(tokens, pos)
                return time.perf_counter() - t0

            for n in names:
                run(n)
            times = interleaved(names, rounds, run)
            out["eval"][f"{k}x"] = {n: times[n] for n in names}
            _log_times(log, f"eval {k}x (T = {T})", times)
    # training at L_t with the threshold at L_t / 4: three quarters of the queries past L
    for name in names[1:]:
        with torch.no_grad():
            models[name].pos.l_scale.fill_(0.25)
    for m in models.values():
        m.train()
    opts = {n: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for n, m in models.items()}
    tokens = torch.randint(0, s.vocab, (s.batch, s.train_length + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    pos = torch.arange(s.train_length).expand(s.batch, -1)

    def step(name: str) -> float:
        t0 = time.perf_counter()
        (model_loss_sum(models[name], x, pos, y, torch.ones(y.shape)) / y.numel()).backward()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    for n in names:
        step(n)
    times = interleaved(names, rounds, step)
    out["train"] = {n: times[n] for n in names}
    _log_times(log, f"train step (B = {s.batch}, T = {s.train_length}, L = {s.train_length // 4})", times)
    return out


def _log_times(log, title: str, times: dict[str, list[float]]) -> None:
    """Medians, spreads, and the ratios to NoPE and to exact FIRE with the range of their per-round
    ratios (the same interleaved round on both sides)."""
    log(f"  {title}")
    for n, t in times.items():
        med = statistics.median(t)
        cols = f"    {n:<15} {med * 1e3:8.1f} ms  spread {timing_spread(t):.2f}"
        for ref in ("nope", "fire"):
            rounds = [a / b for a, b in zip(t, times[ref])]
            ratio = med / statistics.median(times[ref])
            cols += f"  x {ref} {ratio:5.2f} ({min(rounds):.2f}-{max(rounds):.2f})"
        log(cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grids", default="256,1024,4096", help="grid sizes for the error table")
    ap.add_argument("--grid", type=int, default=1024, help="grid size for the cost table")
    ap.add_argument("--steps", type=int, default=400, help="training steps of the tiny model")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the cost table")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    log = lambda line: print(line, flush=True)  # noqa: E731
    log(
        f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    t0 = time.perf_counter()
    log("error (tiny trained FIRE, exact vs grid):")
    errors = error_table([int(g) for g in args.grids.split(",")], args.steps, log)
    log(f"cost (cpu-small, grid {args.grid}, {args.rounds} interleaved rounds):")
    cost = cost_table(args.grid, args.rounds, log)
    log(f"wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "capability": torch.backends.cpu.get_cpu_capability(),
                    "threads": torch.get_num_threads(),
                    "errors": errors,
                    "cost": cost,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
