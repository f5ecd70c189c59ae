"""The peers benchmark (benchmarks/bench_peers.py, extrapos.bench.peers): matched models, its arithmetic, the
skip line of a missing peer, its memory measurement, and a tiny end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from extrapos.bench import peers
from extrapos.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_peers.py"
TINY = peers.PeerShape(
    d_model=32,
    n_layers=2,
    n_heads=2,
    mlp_hidden=64,
    vocab=128,
    batch=2,
    train_length=8,
    multiples=(1, 2),
    context=16,
    new_tokens=4,
)


def _script():
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _installed(pair: peers.Pair) -> peers.Pair:
    if not peers.peer_available(pair.peer):
        pytest.skip(peers.skip_line(pair.peer))
    return pair


@pytest.mark.parametrize("pair", peers.PAIRS, ids=lambda p: p.name)
def test_pairs_have_matched_parameter_counts_and_decode_like_their_forward(pair):
    """Both sides of a pair have the same parameters (x-transformers: plus its GLU projection's bias,
    which no option removes), and each side's cached decoding gives its own full forward's logits, so
    every timed path computes what it claims to."""
    _installed(pair)
    ours, theirs = peers.build_side(pair.extrapos_key, TINY), peers.build_side(pair.name, TINY)
    extra = 2 * TINY.mlp_hidden * TINY.n_layers if pair.peer == "x-transformers" else 0
    assert theirs.parameters() == ours.parameters() + extra
    tokens = torch.randint(0, TINY.vocab, (1, 12), generator=torch.Generator().manual_seed(0))
    for side in (ours, theirs):
        side.module.eval()
        with torch.no_grad():
            full = side.logits(tokens)
            assert side.hidden(tokens).shape == (1, 12, TINY.d_model)
            cache = side.prefill(tokens[:, :8], 12)
            for i in range(8, 12):
                step = side.step(cache, tokens[:, i : i + 1], i)
                torch.testing.assert_close(step[0, -1], full[0, i], atol=1e-4, rtol=1e-4)
            side.end_decoding()  # the model forwards past the decoding's length again (litgpt)
            longest = torch.randint(0, TINY.vocab, (1, TINY.max_length))
            assert side.hidden(longest).shape == (1, TINY.max_length, TINY.d_model)


def test_pair_ratio_arithmetic():
    r = peers.pair_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert r["ratio"] == 2.0 and r["round_min"] == r["round_max"] == 2.0 and r["beyond_noise"]
    straddling = peers.pair_ratio([0.9, 1.0, 1.3], [1.0, 1.0, 1.0])
    assert straddling["ratio"] == 1.0 and not straddling["beyond_noise"]
    assert (straddling["round_min"], straddling["round_max"]) == (0.9, 1.3)
    faster = peers.pair_ratio([1.0, 1.0, 3.0], [2.0, 4.0, 4.0])  # medians 1 / 4, every round below 1
    assert faster["ratio"] == 0.25 and faster["beyond_noise"]
    s = peers.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    with pytest.raises(ValueError):
        peers.pair_ratio([1.0], [1.0, 2.0])


def test_interleaved_rounds_rotate_the_order():
    seen = []
    times = peers.interleave(["a", "b", "c"], 3, lambda k: seen.append(k) or 1.0)
    assert seen == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


def test_a_missing_peer_is_skipped_with_the_line_that_installs_it():
    pairs, skipped = peers.select_pairs(available=lambda lib: lib != "litgpt")
    assert pairs and all(p.peer != "litgpt" for p in pairs)
    assert skipped == ["litgpt is not installed, its pairs are skipped: pip install litgpt"]
    assert all(p.default for p in pairs)  # GPT-NeoX only with every=True
    assert any(p.block == "neox" for p in peers.select_pairs(every=True, available=lambda lib: True)[0])
    with pytest.raises(UserError, match="unknown peer 'flash'"):
        peers.select_pairs(["flash"])
    with pytest.raises(UserError, match="no peer pair for the encoding 'fire'"):
        peers.select_pairs(encodings=["fire"])


def test_the_script_prints_the_skip_line_and_refuses_an_empty_run(monkeypatch, capsys):
    monkeypatch.setattr(peers, "peer_available", lambda lib: lib != "litgpt")
    assert _script().main(["--peers", "litgpt", "--tiny", "--rounds", "2", "--no-memory"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == peers.skip_line("litgpt")
    assert err[-1].startswith("no pair to measure")


def test_bad_options_are_one_sentence(capsys):
    script = _script()
    assert script.main(["--tiny", "--rounds", "1", "--no-memory"]) == 2
    assert "--rounds must be at least 2" in capsys.readouterr().err
    assert script.main(["--heads", "3", "--no-memory"]) == 2
    assert "change --d-model or --heads" in capsys.readouterr().err


def test_help_lists_the_options():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    for option in ("--rounds", "--threads", "--peers", "--multiples", "--out", "--no-memory"):
        assert option in out.stdout


def test_peak_memory_sees_torch_allocations():
    """A 64 MiB tensor made and freed inside the measured call shows as >= 64 MiB of growth, which
    tracemalloc (Python allocations only) would not see."""
    if not peers.hwm_available():
        pytest.skip("no /proc/self/clear_refs here")
    grown = peers.peak_growth_mb(lambda: torch.ones(2**24).sum())
    assert 63 <= grown < 256
    assert peers.peak_growth_mb(lambda: None) < 8


def test_tiny_run_end_to_end(tmp_path, capsys):
    """Two rounds of every measurement on one pair: the JSON holds every round and the ratios, the
    README names the CPU capability and the thread count."""
    if not peers.peer_available("transformers"):
        pytest.skip(peers.skip_line("transformers"))
    out = tmp_path / "peers"
    args = ["--tiny", "--rounds", "2", "--threads", "1", "--peers", "transformers", "--encodings", "rope"]
    assert _script().main([*args, "--no-memory", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert [p["pair"] for p in result["pairs"]] == ["transformers/llama/rope"]
    models = result["models"]
    for key in ("extrapos/llama/rope", "transformers/llama/rope"):
        assert len(models[key]["train_s"]) == len(models[key]["decode_s"]) == 2
        assert set(models[key]["eval_s"]) == {"1", "2"}
    pair = result["pairs"][0]
    a, b = models["extrapos/llama/rope"]["train_s"], models["transformers/llama/rope"]["train_s"]
    assert pair["train"]["ratio"] == pytest.approx((a[0] + a[1]) / (b[0] + b[1]))  # medians of two
    readme = (out / "README.md").read_text()
    assert f"CPU capability {torch.backends.cpu.get_cpu_capability()}, 1 torch thread(s)" in readme
    assert "| transformers/llama/rope |" in readme and "### Cached decoding" in readme
    assert "CPU capability" in capsys.readouterr().out
    assert result["complete"] and "Partial run" not in readme

    # a run stopped after its first measurement renders what it has, and says so
    for model in result["models"].values():
        del model["eval_s"], model["decode_s"]
    for row in result["pairs"]:
        del row["eval"], row["decode"]
    partial = peers.format_peers({**result, "complete": False})
    assert "**Partial run**" in partial and "### Training step" in partial
    assert "### Evaluation forward" not in partial and "### Cached decoding" not in partial


def test_memory_child_measures_every_length():
    if not peers.hwm_available():
        pytest.skip("no /proc/self/clear_refs here")
    shape = peers.PeerShape(**{**TINY.__dict__, "multiples": (1, 64)})
    mb = peers.memory_child("extrapos/llama/alibi", shape, threads=1)
    assert set(mb) == {"1", "64"} and all(isinstance(v, float) for v in mb.values())


def test_runs_of_different_measurements_merge_into_one_report(tmp_path):
    """--measure splits a run (training here, decoding there); --merge renders them as one report with
    the ratios of each, and refuses runs of another shape."""
    if not peers.peer_available("transformers"):
        pytest.skip(peers.skip_line("transformers"))
    script = _script()
    base = ["--tiny", "--rounds", "2", "--peers", "transformers", "--encodings", "rope", "--no-memory"]
    assert script.main([*base, "--measure", "train", "--out", str(tmp_path / "a")]) == 0
    assert script.main([*base, "--measure", "decode", "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    assert "decode" not in a["pairs"][0] and "train" in a["pairs"][0]
    files = [str(tmp_path / d / "results.json") for d in ("a", "b")]
    assert script.main(["--merge", *files, "--out", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    row = merged["pairs"][0]
    assert row["train"] == a["pairs"][0]["train"] and "decode" in row and "eval" not in row
    assert row["values"]["extrapos"]["train_s"] == a["models"]["extrapos/llama/rope"]["train_s"]
    readme = (tmp_path / "m" / "README.md").read_text()
    assert "### Training step" in readme and "### Cached decoding" in readme
    assert "### Evaluation forward" not in readme
    other = {**a, "shape": {**a["shape"], "d_model": 64}}
    with pytest.raises(UserError, match="one shape only"):
        peers.merge_results([a, other])
