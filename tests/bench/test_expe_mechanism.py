"""benchmarks/expe_mechanism.py end to end in its --quick form: it trains, scores every scale, and writes the
JSON (its structure, not its verdict, is checked), the report and the plot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "expe_mechanism.py"


def _script():
    spec = importlib.util.spec_from_file_location("expe_mechanism", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations through the module
    spec.loader.exec_module(module)
    return module


def test_columns_are_binned_by_value_or_by_index():
    m = _script()
    # L_t = 4, 16 positions: scale 0.5 puts values 0, 0.5, ..., 7.5, so value in [4, 8) is index 8..15
    assert m.columns_where(4, 16, 0.5, 1, 2, "value").tolist() == list(range(8, 16))
    assert m.columns_where(4, 16, 0.5, 1, 2, "index").tolist() == list(range(4, 8))
    assert m.columns_where(4, 16, 1.0, 0, 1, "value").tolist() == [0, 1, 2, 3]
    assert m.columns_where(4, 16, 0.25, 4, 8, "value").tolist() == []  # past the window's values
    losses = np.array([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0], [0.0, 0.0, 1.0]])
    sums, counts = m.doc_sums(losses, np.array([3, 7, 3]), np.array([1, 2]))
    assert sums.tolist() == [6.0, 13.0] and counts.tolist() == [4.0, 2.0]


def test_quick_run_writes_the_json_report_and_plot(tmp_path, tiny_data):
    m = _script()
    out = tmp_path / "mech"
    assert (
        m.main(["--out", str(out), "--quick", "--data", str(tiny_data), "--set", "model.vocab_size=512"]) == 0
    )
    doc = json.loads((out / "mechanism.json").read_text())
    assert doc["quick"] is True and doc["L_t"] == 16 and doc["scales"] == [1.0, 0.5, 0.25, 2.0]
    assert doc["run"] == "runs/expe"  # relative to the folder, as committed results are
    assert [e["scale"] for e in doc["evaluations"]] == doc["scales"]
    for e in doc["evaluations"]:
        assert [r["ev"] for r in e["lengths"]] == [1, 2, 4, 8, 16]
        assert all(np.isfinite(r["loss"]) for r in e["lengths"])
        pp = e["per_position"]
        assert len(pp["loss"]) == len(pp["index_mid"]) == len(pp["value_mid"]) > 1
        assert pp["value_mid"] == [i * e["scale"] for i in pp["index_mid"]]
    bins = doc["bins"]
    # values reach 32 L_t (scale 2 in 16 L_t windows), indices 16 L_t
    assert [r["lo"] for r in bins["by_value"]] == [0, 1, 2, 4, 8, 16]
    assert [r["lo"] for r in bins["by_index"]] == [0, 1, 2, 4, 8]
    # scale 0.25 reaches values up to 4 L_t: its value bins past that hold nothing, its index bins all do
    assert bins["by_value"][4]["scales"]["0.25"] is None and bins["by_index"][-1]["scales"]["0.25"]
    assert (
        bins["by_value"][-1]["scales"]["2.0"]["tokens"] > 0 and bins["by_value"][-1]["scales"]["1.0"] is None
    )
    assert set(bins["to_scale_1"][0]["scales"]) == {"0.5", "0.25", "2.0"}
    assert [r["scale"] for r in bins["inside_outside"]] == doc["scales"]
    # the evaluation's per-position buckets are the token losses the script binned itself
    assert doc["per_position_check_max_abs"] < 1e-4
    assert doc["wall_seconds"]["total"] > 0 and doc["wall_seconds"]["evaluate"] > 0
    # each length of each scale once, keyed by its largest value k x scale
    cells = [(m["max_value"], x, c["ev"]) for m in doc["max_value_change"] for x, c in m["scales"].items()]
    assert len(cells) == 4 * 5 and all(v == ev * float(x) for v, x, ev in cells)
    report = (out / "report.md").read_text()
    assert "| scale | ev=1 |" in report and "| value | x1 | x0.5 | x0.25 | x2 |" in report
    assert "| largest value | x1 | x0.5 | x0.25 | x2 |" in report
    png = out / "mechanism.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second invocation reuses the run and the saved evaluations
    assert (
        m.main(["--out", str(out), "--quick", "--data", str(tiny_data), "--set", "model.vocab_size=512"]) == 0
    )
    assert (
        json.loads((out / "mechanism.json").read_text())["evaluations"][0]["lengths"]
        == doc["evaluations"][0]["lengths"]
    )
