"""benchmarks/bench_compile.py: eager against compiled steps of a preset, one paired row per precision."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from tests.conftest import tiny_overrides

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_compile.py"


def test_it_prints_a_paired_eager_and_compiled_row(tiny_data, capsys):
    spec = importlib.util.spec_from_file_location("bench_compile", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    sets = [f"--set={s}" for s in tiny_overrides(tiny_data, **{"model.train_length": 16})]
    assert module.main(["--config", "cpu/tiny", *sets, "--precisions", "fp32", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    row = re.search(
        r"^\| fp32 \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \(([0-9.]+)-([0-9.]+)\) \| (\d+) \|$", out, re.M
    )
    assert row, out
    eager, compiled, ratio, low, high = (float(row.group(i)) for i in range(1, 6))
    assert eager > 0 and compiled > 0 and low <= high
    assert abs(ratio - compiled / eager) < 0.05 * ratio + 0.02  # the medians' ratio
    assert module.main(["--rounds", "0"]) == 2  # a bad count is one sentence, exit 2
