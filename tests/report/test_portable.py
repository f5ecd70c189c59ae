"""Saved results name their runs and data relative to their folder or the data cache (issue 47)."""

from __future__ import annotations

from pathlib import Path

from extrapos.report.portable import portable


def test_paths_become_relative_to_the_folder_or_the_cache(tmp_path):
    folder, cache = tmp_path / "sweep", tmp_path / "cache"
    result = {
        "name": "RoPE",
        "run": str(folder / "runs" / "rope"),
        "data_dir": str(cache / "data" / "sotu-bpe-8192-abc"),
        "results": [{"ev": 1, "loss": 3.25}],
        "seeds": [{"run": [str(folder / "runs" / "rope-seed1")], "data_dir": str(tmp_path / "elsewhere")}],
        "parts": [{"run": "runs/already-relative", "name": "x"}],
    }
    out = portable([result], folder, cache)[0]
    assert out["run"] == "runs/rope" and out["data_dir"] == "$EXTRAPOS_CACHE/data/sotu-bpe-8192-abc"
    assert out["seeds"][0]["run"] == ["runs/rope-seed1"] and out["seeds"][0]["data_dir"] == "../elsewhere"
    assert out["parts"][0]["run"] == "runs/already-relative"
    assert out["results"] == result["results"] and result["run"].startswith(str(folder))  # a copy
    assert not any(Path(v).is_absolute() for v in (out["run"], out["seeds"][0]["data_dir"]))


def test_no_committed_sweep_result_names_a_machines_absolute_path():
    """Every committed results.json of a comparison names its runs and data portably (they named
    /work/runs/... and /root/.cache/... of the machine that ran them)."""
    import json
    import re

    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    files = sorted(results.glob("*/results.json")) + sorted(results.glob("*/*/results.json"))
    assert len(files) >= 10
    for f in files:
        absolute = re.findall(r'"(/[^"]*)"', f.read_text())
        assert not absolute, (f, absolute[:3])
        json.loads(f.read_text())


def test_no_committed_json_under_docs_names_a_machines_absolute_path():
    """Every JSON file under docs/ (comparison results, attention and RULER readings, lm-eval, gpu-run,
    benchmarks), at any key and depth: the readings that are not comparison results named /tmp/...,
    /work/... and /root/... of the machine that made them until they went through ``portable_tree``."""
    import json

    from extrapos.report.portable import is_absolute_path

    def absolute(doc, where=""):
        if isinstance(doc, dict):
            return [p for k, v in doc.items() for p in absolute(v, f"{where}.{k}")]
        if isinstance(doc, list):
            return [p for i, v in enumerate(doc) for p in absolute(v, f"{where}[{i}]")]
        return [f"{where} = {doc}"] if is_absolute_path(doc) else []

    docs = Path(__file__).resolve().parents[2] / "docs"
    files = sorted(docs.rglob("*.json"))
    assert len(files) >= 40
    found = [f"{f.relative_to(docs.parent)}: {p}" for f in files for p in absolute(json.loads(f.read_text()))]
    assert not found, "absolute paths in committed JSON (rewrite with portable_tree):\n" + "\n".join(found)


def test_portable_tree_rewrites_every_absolute_path_and_keeps_the_rest(tmp_path):
    from extrapos.report.portable import portable_tree

    folder, cache = tmp_path / "docs" / "results" / "ruler", tmp_path / "cache"
    doc = {
        "run": str(tmp_path / "runs" / "rope"),
        "request": {"metadata": {"tokenizer": str(folder / "tok")}, "lengths": [1, 2]},
        "rows": [{"data": str(cache / "data" / "x"), "loss": 3.25, "note": "/ alone is no path"}],
        "url": "//example.org/x",
    }
    out = portable_tree(doc, folder, cache)
    assert out["run"] == "../../../runs/rope" and out["request"]["metadata"]["tokenizer"] == "tok"
    assert out["rows"][0] == {"data": "$EXTRAPOS_CACHE/data/x", "loss": 3.25, "note": "/ alone is no path"}
    assert out["url"] == doc["url"] and out["request"]["lengths"] == [1, 2]
