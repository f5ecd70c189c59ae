"""`make gpu-run` (benchmarks/gpu_run.sh) on CPU: its stand-in runs every stage (install, gpu-check, the
comparison) and leaves at most eight files; a stage past its deadline is stopped, recorded with how far it
got, and the next stage still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_run.sh"
FILES = {
    "gpu-run.md",
    "gpu-run.json",
    "gpu-run.log",
    "gpu-check.md",
    "gpu-check.json",
    "compare-report.md",
    "compare.json",
    "loss_vs_length.png",
}


def _run(tmp_path: Path, tiny_data, *options: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    # the tiny corpus for both stages; no train.steps: the comparison's budget sets each run's tokens
    sets = [f'data.dir="{tiny_data}"', "model.vocab_size=512", "model.train_length=32", "train.threads=1"]
    cmd = [
        "bash",
        str(SCRIPT),
        str(out),
        "--work",
        str(tmp_path / "work"),
        "--wheels",
        str(tmp_path / "none"),
    ]
    cmd += [*options, *(a for s in sets for a in ("--set", s))]
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path), out


def test_stand_in_runs_every_stage_into_at_most_eight_files(tmp_path, tiny_data):
    """The whole script as `make gpu-run` runs it, at CPU sizes: about 60 s on 2 busy cores."""
    done, out = _run(tmp_path, tiny_data)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == FILES
    state = json.loads((out / "gpu-run.json").read_text())
    assert state["mode"].startswith("STAND-IN") and state["finished"] is True
    assert [(s["stage"], s["status"]) for s in state["stages"]] == [
        ("install", "ok"),
        ("gpu-check", "ok"),
        ("compare", "ok"),
    ]
    # the stages imported the package the install stage built from the checkout, not the source tree
    assert state["machine"]["extrapos"] == str(tmp_path / "work" / "site" / "extrapos")
    # ... built from a copy of the checkout, so the build wrote nothing into the checkout itself
    assert (tmp_path / "work" / "source" / "pyproject.toml").is_file()
    check = json.loads((out / "gpu-check.json").read_text())
    assert check["ok"] is True and check["mode"].startswith("STAND-IN")
    compare = json.loads((out / "compare.json").read_text())
    budget = compare["budget"]
    assert budget["rows"] == ["NoPE", "RoPE", "ALiBi", "CABLE", "ExPE"] and budget["budget_seconds"] == 4
    assert budget["tokens_per_run"] == budget["steps_per_run"] * budget["tokens_per_step"] > 0
    assert any(f.startswith("budget: 4 s of training") for f in compare["facts"])
    assert any("scored in fp32" in f for f in compare["facts"])  # the stand-in's eval_precision auto: fp32
    report = (out / "compare-report.md").read_text()
    for row in budget["rows"]:
        assert f"| {row} |" in report
    compare_row = state["stages"][2]
    assert len(compare_row["rows_trained"]) == len(compare_row["rows_scored"]) == 5
    md = (out / "gpu-run.md").read_text()
    assert md.startswith("# gpu-run: STAND-IN") and "5 rows trained, 5 scored" in md
    log = (out / "gpu-run.log").read_text()
    assert "===== gpu-check: ok" in log and "===== compare: ok" in log


def test_a_stage_past_its_deadline_is_stopped_and_the_next_one_runs(tmp_path, tiny_data):
    done, out = _run(
        tmp_path,
        tiny_data,
        "--stages",
        "gpu-check,compare",
        "--gpu-check-seconds",
        "4",
        "--compare-seconds",
        "6",
    )
    assert done.returncode == 1  # not every stage ended ok
    state = json.loads((out / "gpu-run.json").read_text())
    stages = {s["stage"]: s for s in state["stages"]}
    assert list(stages) == ["gpu-check", "compare"]
    assert stages["gpu-check"]["status"] == "deadline" and stages["gpu-check"]["seconds"] < 4 + 12
    assert "last_progress" in stages["gpu-check"]  # its last progress line, if it printed one in time
    assert stages["compare"]["status"] == "deadline" and "rows_started" in stages["compare"]
    assert "| gpu-check | deadline |" in (out / "gpu-run.md").read_text()
    partial = out / "gpu-check.json"  # gpu_check rewrites its summary after every section
    if partial.exists():  # what it finished within its 4 s (the dependencies, on a quiet machine)
        summary = json.loads(partial.read_text())
        assert summary["finished"] is False and None in summary["verdicts"].values()
        assert "not run" in (out / "gpu-check.md").read_text()
    assert {p.name for p in out.iterdir()} <= FILES


def test_a_comparison_stopped_before_its_report_keeps_the_rows_it_scored(tmp_path):
    """On the first GPU the comparison reached its deadline with two of five rows scored: their own
    evaluation files go into compare.json (``scored_rows``) when the sweep's results.json is missing."""
    gr = _gpu_run_module()
    work, out = tmp_path / "work", tmp_path / "out"
    for name, scored in (("nope", True), ("rope", True), ("alibi", False)):
        run = work / "compare" / "runs" / name
        (run / "eval").mkdir(parents=True)
        (run / "config.toml").write_text("")
        (run / "summary.json").write_text("{}")
        if scored:
            (run / "eval" / "stream.json").write_text(json.dumps({"name": "stream", "loss": [3.1, 3.4]}))
    (work / "compare" / "budget.json").write_text(json.dumps({"budget_seconds": 100}))
    out.mkdir()
    row: dict = {}
    gr.collect_compare(work, out, row)
    assert row["rows_trained"] == ["alibi", "nope", "rope"] and row["rows_scored"] == ["nope", "rope"]
    got = json.loads((out / "compare.json").read_text())
    assert got["budget"] == {"budget_seconds": 100}
    assert sorted(got["run_summaries"]) == ["alibi", "nope", "rope"]  # every trained run's summary
    assert got["scored_rows"] == {
        r: {"stream.json": {"name": "stream", "loss": [3.1, 3.4]}} for r in ("nope", "rope")
    }


def _gpu_run_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_run_steps", ROOT / "benchmarks" / "gpu_run.py")
    assert spec and spec.loader
    gr = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gr  # its dataclass looks its module up
    spec.loader.exec_module(gr)
    return gr


def test_each_step_fits_nine_minutes_and_runs_its_own_sweep(tmp_path):
    """`make gpu-run STAGE=second|third`: the later GPU sessions' steps. Each step's deadlines add up to
    at most the first step's 530 s, its sweep is a shipped preset, and on CUDA the later steps train on
    the first table's pinned tokens (no budget probe, so their rows join the published seed 0)."""
    import argparse

    from extrapos.compare import load_sweep

    gr = _gpu_run_module()
    assert list(gr.STEPS) == ["first", "second", "third"]
    for name, step in gr.STEPS.items():
        assert sum(step.deadlines.values()) <= 530, name
        assert list(step.deadlines)[0] == "install", name
        load_sweep(step.sweep)
    first = load_sweep("gpu/first-table")
    seeds = load_sweep("gpu/first-table-seeds")
    assert seeds.seeds == [1, 2] and [r.name for r in seeds.rows] == [r.name for r in first.rows]
    assert "train.tokens=3_473_408" in seeds.set and seeds.budget_seconds is None
    # the published seed 0 trained on exactly these tokens (docs/results/gpu-first-table/budget.json)
    published = json.loads((ROOT / "docs" / "results" / "gpu-first-table" / "budget.json").read_text())
    assert published["tokens_per_run"] == 3_473_408
    assert [r.name for r in load_sweep("gpu/pairwise-table").rows] == ["RoPE", "Kerple", "FIRE"]
    work = tmp_path / "work"

    def command(step: str, stage: str, cuda: bool) -> list[str]:
        args = argparse.Namespace(step=step, set=[], wheels=str(tmp_path), budget_seconds=None)
        return gr.stage_command(stage, args, cuda, work)

    assert "gpu/first-table-seeds" in command("second", "compare", True)
    assert "--budget-seconds" not in command("second", "compare", True)  # pinned tokens on CUDA
    assert command("first", "compare", True)[-2:] == ["--budget-seconds", "100"]
    assert command("second", "compare", False)[-2:] == ["--budget-seconds", "4"]  # the stand-in's size
    check = command("third", "gpu-check", True)  # the bench alone, ALiBi and CABLE timed both ways
    assert check[check.index("--sections") + 1] == "bench" and "nope,alibi,cable" in check
    assert "--resume-steps" in command("first", "gpu-check", True)  # the first step's fast form
    made = {"gpu-check": 2, "compare": 3, "ruler": 2}  # the files each stage brings back
    for name, step in gr.STEPS.items():  # at most eight files come back from a lent machine
        files = 3 + sum(made.get(stage, 0) for stage in step.deadlines) - len(step.leaves_out)
        assert files <= 8, name
    ruler = command("third", "ruler", True)
    assert ruler[2:4] == ["--ruler-stage", str(work / "compare" / "runs")]
    assert ruler[ruler.index("--lengths") + 1] == "1,2,4" and "rank" in ruler


def test_the_ruler_stage_scores_every_trained_run_into_two_files(tmp_path, tiny_data):
    """The third step's last stage on two trained tiny runs (a third, untrained, is skipped): each run's
    ranking-form result is saved in its folder and gathered into ruler.json and ruler.md."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    runs = tmp_path / "work" / "compare" / "runs"
    for name in ("rope", "alibi"):
        sets = tiny_overrides(tiny_data, **{"train.steps": 2, "model.positions.name": f'"{name}"'})
        train(load_config("cpu/tiny", sets), runs / name, progress=False)
    (runs / "fire").mkdir()  # started, never trained
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_run.py"), str(out), "--step", "third"]
    cmd += ["--stages", "ruler", "--work", str(tmp_path / "work")]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    state = json.loads((out / "gpu-run.json").read_text())
    assert state["step"] == "third" and [(s["stage"], s["status"]) for s in state["stages"]] == [
        ("ruler", "ok")
    ]
    assert state["stages"][0]["rows_scored"] == ["alibi", "rope"]
    results = json.loads((out / "ruler.json").read_text())
    assert sorted(results) == ["alibi", "rope"]
    md = (out / "ruler.md").read_text()
    assert "## alibi" in md and "## rope" in md and "copiers" in md
    assert {p.name for p in out.iterdir()} == {
        "gpu-run.md",
        "gpu-run.json",
        "gpu-run.log",
        "ruler.md",
        "ruler.json",
    }
    assert "step third" in (out / "gpu-run.md").read_text()
    refused = subprocess.run(
        [*cmd[:3], "--step", "second", "--stages", "ruler"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "its stages are install, compare" in refused.stderr
