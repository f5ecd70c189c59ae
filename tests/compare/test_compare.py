"""The comparison sweep: identical settings per row, a report, and resumption after an interruption."""

import json
from pathlib import Path

import pytest

from extrapos import compare as compare_mod
from extrapos.compare import compare, load_sweep, sweep_names
from extrapos.errors import UserError
from tests.conftest import tiny_overrides


def _sweep(tmp_path, tiny_data):
    sets = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 4})
    f = tmp_path / "sweep.toml"
    f.write_text(
        'title = "tiny"\ntrain = "cpu/tiny"\nlengths = [1, 2, 4]\nmax_eval_tokens = 128\n'
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "ExPE"\npositions = { name = "expe" }\n'
        '[[rows]]\nname = "ExPE x0.5"\nreuse = "ExPE"\neval = { scale = 0.5 }\n'
    )
    return f


def test_shipped_sweeps_load_and_build_their_configs():
    for name in sweep_names():
        sweep = load_sweep(name)
        for row in sweep.rows:
            if not row.reuse and row.run is None and row.positions is not None:
                cfg = compare_mod.row_config(sweep, row, [])
                assert cfg.model.positions["name"] == row.positions["name"]
    quick = load_sweep("quick")
    assert [r.positions["name"] for r in quick.rows] == [
        "nope",
        "sinusoidal",
        "rope",
        "alibi",
        "cable",
        "expe",
        "exqpe",
    ]


def test_sweep_writes_a_report_and_resumes_after_an_interruption(tmp_path, tiny_data, monkeypatch):
    spec = _sweep(tmp_path, tiny_data)
    out = tmp_path / "out"
    # compare imports train lazily from extrapos.training.trainer
    real_train = compare_mod.__dict__.get("train")
    import extrapos.training.trainer as train_mod

    calls = []
    original = train_mod.train

    def interrupted(cfg, run_dir, **kw):
        calls.append(run_dir.name)
        if run_dir.name == "expe":
            raise KeyboardInterrupt  # the user pressed Ctrl-C during the second row
        return original(cfg, run_dir, **kw)

    monkeypatch.setattr(train_mod, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compare(str(spec), out, progress=False)
    monkeypatch.setattr(train_mod, "train", original)
    rope_ckpt = out / "runs" / "rope" / "checkpoints" / "step-4" / "model.safetensors"
    stamp = rope_ckpt.stat().st_mtime_ns

    report = compare(str(spec), out, progress=False)
    assert rope_ckpt.stat().st_mtime_ns == stamp  # the finished row was reused, not retrained
    text = report.read_text()
    assert "| RoPE |" in text and "| ExPE x0.5 |" in text and "ev=4" in text
    assert (out / "results.csv").is_file() and (out / "plots" / "loss_vs_length.png").is_file()
    rows = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in rows] == ["RoPE", "ExPE", "ExPE x0.5"]
    assert rows[2]["applied"] == {"scale": 0.5} and rows[1]["run"] == rows[2]["run"]
    # paths relative to the comparison or the data cache: the file means the same in a clone (issue 47)
    assert [r["run"] for r in rows] == ["runs/rope", "runs/expe", "runs/expe"]
    text = (out / "results.json").read_text()
    assert str(tmp_path) not in text and not any(Path(r["data_dir"]).is_absolute() for r in rows)
    assert real_train is None


def test_report_rebuilds_from_saved_results(tmp_path, tiny_data):
    from extrapos.cli import main

    spec = _sweep(tmp_path, tiny_data)
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert "| ExPE x0.5 |" in (out / "report.md").read_text()


def test_a_changed_sweep_does_not_reuse_a_run_trained_differently(tmp_path, tiny_data):
    spec = _sweep(tmp_path, tiny_data)
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    spec.write_text(spec.read_text().replace('"train.steps=4"', '"train.steps=5"'))
    with pytest.raises(UserError, match="different config"):
        compare(str(spec), out, progress=False)


def test_report_of_result_files_keeps_runs_apart(tmp_path, tiny_data):
    """Results of one name from several runs (RUN/eval/test.json) are rows named by their runs, each with
    its own numbers; two results that would share a row name are refused, never read as one row."""
    from extrapos.report.render import collect_rows

    spec = _sweep(tmp_path, tiny_data)
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    by_name: dict[str, list] = {}
    for f in sorted((out / "runs").glob("*/eval/*.json")):
        by_name.setdefault(f.name, []).append(f)
    picked = max(by_name.values(), key=len)
    assert len(picked) >= 2  # the same file name in two runs
    rows, _ = collect_rows(picked[:2])
    assert [r.name for r in rows] == [f"{f.parent.parent.name}/{f.stem}" for f in picked[:2]]
    assert rows[0].result["results"][0]["loss"] != rows[1].result["results"][0]["loss"]
    loose = tmp_path / "loose"
    loose.mkdir()
    for i, f in enumerate(picked[:2]):
        (loose / str(i)).mkdir()
        (loose / str(i) / f.name).write_bytes(f.read_bytes())
    with pytest.raises(UserError, match="would both be the row"):
        collect_rows([loose / "0" / picked[0].name, loose / "1" / picked[1].name])
