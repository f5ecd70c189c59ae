"""benchmarks/figure3_seeds.sh: the segmented-sequences paper's Figure 3 over training seeds. Its parents
are trained as `extrapos compare` trains a sweep's seeds (so cpu/medium's are the medium-seeds sweep's
`rope-seed<s>` runs); end to end on the tiny corpus, twice (the second run skips every finished step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "figure3_seeds.sh"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_parent_is_the_medium_seeds_sweeps_rope_run_of_that_seed(seed):
    """The script trains `--config CONFIG [EXTRA] --set train.seed=<s>` into OUT/rope-seed<s>: for
    cpu/medium that is the very config (and folder name) `extrapos compare medium-seeds` gives its RoPE row's
    seed s (compare/run.py: the seed as the last override)."""
    from extrapos.compare import load_sweep
    from extrapos.compare.sweep import row_config, run_slug
    from extrapos.run.config import load_config

    sweep = load_sweep("medium-seeds")
    assert seed in sweep.seeds
    row = next(r for r in sweep.rows if r.name == "RoPE")
    assert run_slug(row.name, seed) == f"rope-seed{seed}"
    assert load_config("cpu/medium", [f"train.seed={seed}"]).to_toml() == (
        row_config(sweep, row, [f"train.seed={seed}"]).to_toml()
    )
    text = SCRIPT.read_text()
    assert 'parent="$OUT/rope-seed$seed"' in text
    assert 'train=(--config "$CONFIG" "${sets[@]}" --set "train.seed=$seed" --out "$parent")' in text


def test_the_script_refuses_an_empty_seed_list(tmp_path):
    env = {**os.environ, "SEEDS": " ", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "SEEDS names no seed" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_seeds_of_three_runs_end_to_end_and_resumed(tiny_data, tmp_path):
    import torch

    from extrapos.run.config import load_config
    from extrapos.run.precision import with_resolved_precision

    cpu = torch.device("cpu")
    out = tmp_path / "f3"
    extra = tiny_overrides(tiny_data)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "PYTHON": sys.executable,
        "SEEDS": "0 1",
        "CONFIG": "cpu/tiny",
        "OUT": str(out),
        "TOKENS": "1024",  # 2 steps of 4 windows of 4 x 32 tokens
        "MAX_TOKENS": "256",
        "EXTRA": " ".join(extra),
    }
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = [out / f"{kind}-seed{s}" for s in (0, 1) for kind in ("rope", "chunk", "continue")]
    assert all((run / "summary.json").is_file() for run in runs)
    for s in (0, 1):
        # the parent's config is the preset, the overrides and the seed last (as compare builds it)
        cfg = with_resolved_precision(load_config("cpu/tiny", [*extra, f"train.seed={s}"]), cpu)[0]
        assert (out / f"rope-seed{s}" / "config.toml").read_text() == cfg.to_toml()
        for child in ("chunk", "continue"):  # a child keeps its parent's seed
            assert load_config(str(out / f"{child}-seed{s}" / "config.toml")).train.seed == s
    text = (out / "figure" / "median-weight.md").read_text()
    assert text.startswith(
        "# Median attention weight past L_t = 32 (the segmented-sequences paper's Figure 3), 2 seeds"
    )
    for row in ("RoPE parent", "chunk-0.25 x4", "continue"):
        assert f"| {row} |" in text and f"| {row} (seed #2) |" in text
    assert "| layer | head | chunk-0.25 x4 - RoPE parent | seeds of its sign |" in text
    assert f"`{out / 'continue-seed1'}`" in text
    assert (out / "figure" / "median-weight.png").stat().st_size > 0

    # killed after their last checkpoint, before their summary: those two resume, the rest are skipped
    (out / "rope-seed1" / "summary.json").unlink()
    (out / "chunk-seed0" / "summary.json").unlink()
    again = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished, skipped") == 4
    assert f"== {out / 'rope-seed1'}: resuming" in again.stdout
    assert f"== {out / 'chunk-seed0'}: resuming" in again.stdout
    assert all((run / "summary.json").is_file() for run in runs)
    assert (out / "figure" / "median-weight.md").read_text() == text  # the same weights: the same figure
