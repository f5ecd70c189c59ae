"""`extrapos bench` measures every registered encoding: each stage runs, at toy sizes, for the newest ones."""

import math

import pytest
import torch

from extrapos import bench
from extrapos.bench.resolution import position_resolution
from extrapos.errors import UserError
from extrapos.positions import registry

NEW = ["xpos", "cope", "fox", "dape"]  # issue 17


def test_the_default_bench_covers_the_registry():
    assert bench.bench_names() == registry.names() and set(NEW) <= set(bench.bench_names())
    assert bench.bench_names(["cope", "fox"]) == ["nope", "cope", "fox"]  # NoPE: the ratios' denominator
    with pytest.raises(UserError, match="unknown encoding 'rotary'"):
        bench.bench_names(["rotary"])


def test_every_stage_runs_for_the_new_encodings(monkeypatch):
    # the machine's peak is not tested here (patched where bench_training looks it up)
    monkeypatch.setattr(bench.measure, "matmul_rate", lambda precision, **size: 1e9)
    s = bench.BenchSettings(
        size="cpu-tiny",
        vocab=64,
        train_length=16,
        batch=2,
        eval_lengths=(1, 4),
        context=40,
        new_tokens=3,
        repeats=2,
        steps_per_repeat=1,
    )
    names = bench.bench_names(NEW)
    tick = lambda: None  # noqa: E731
    r = {
        "settings": s.__dict__ | {"threads": torch.get_num_threads(), "torch": torch.__version__},
        "machine": {"matmul_peak_gflops_fp32": 1.0},
        "train_fp32": bench.bench_training(names, s, "fp32", tick),
        "train_bf16": None,
        "eval_time": bench.bench_eval_time(names, s, tick),
        "eval_memory": {n: bench.child_memory(n, s) for n in names},  # in this process: no fresh child
        "generation": bench.bench_generation(names, s, tick),
        "resolution": position_resolution(train_length=16, multiples=(1, 2)),
        "peer": None,
        "wall_time_s": 1.0,
    }
    for n in names:
        figures = [
            r["train_fp32"][n]["step_ms"],
            r["eval_time"][n]["time_ms_4x"],
            r["generation"][n]["cached_tok_s"],
            r["generation"][n]["recompute_tok_s"],
        ]
        assert all(math.isfinite(v) and v > 0 for v in figures), n
        assert set(r["eval_memory"][n]) == {"peak_mb_1x", "peak_mb_4x"}
    table = bench.format_bench(r)
    for n in NEW:
        assert f"\n| {n} | " in table
    # issue 28's figures: decoding per token and the folded biases' evaluation, as ratios to NoPE
    rows = {label: shown for label, shown, _, _ in bench.target_rows(r)}
    gen, et = r["generation"], r["eval_time"]
    assert rows["decode ms/token vs NoPE, bias encodings (issue 28)"] == (
        f"fox {gen['fox']['decode_ms'] / gen['nope']['decode_ms']:.2f}"
    )
    assert rows["evaluation time at 16 x L_t vs NoPE, folded biases (issue 28)"] == (
        f"fox {et['fox']['time_ms_4x'] / et['nope']['time_ms_4x']:.2f}"
    )
