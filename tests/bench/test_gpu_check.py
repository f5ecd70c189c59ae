"""`make gpu-check` (benchmarks/gpu_check.py) on CPU: the stand-in, reduced, writes every section with a
verdict and says on its first line that it is a stand-in; a failing section is reported, not a crash."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = ["dependencies", "doctor", "runs", "resume", "parallel", "eval", "bench"]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_sets_order_and_a_failing_section_is_a_failed_row():
    gc = load_script()
    sets = gc.run_sets("rope", 5, False, {"train.steps": "99", "data.dir": '"/d"'}, train__steps=7)
    assert "model.positions.name=rope" in sets and [s for s in sets if "steps" in s] == ["train.steps=7"]
    assert 'data.dir="/d"' in sets and not any(s.startswith("model.size") for s in sets)
    assert 'model.size="gpt2-tiny"' in gc.run_sets("rope", 5, True, {})  # CUDA: the GPT-2-small shape
    row = gc.guarded(lambda: 1 / 0)
    assert row["ok"] is False and row["error"].startswith("ZeroDivisionError")
    text = "\n".join(gc.md_resume(row) + gc.md_parallel(row) + gc.md_eval(row) + gc.md_bench(row))
    assert text.count("FAILED: ZeroDivisionError") == 4
    deps = gc.dependencies()
    assert deps["ok"] and deps["required"]["torch"] and deps["extrapos"]
    assert {o["package"] for o in deps["optional"]} >= {"matplotlib", "transformers", "tensorboard"}


def test_a_partial_summary_says_which_sections_ran(tmp_path):
    """After each section the summaries are rewritten (a check stopped at a deadline keeps what it
    proved, as the first GPU session needed): sections not reached read "not run", and the overall verdict
    is not ok until every section ran."""
    gc = load_script()
    assert [key for key, _ in gc.SECTIONS] == SECTIONS
    summary = {
        "mode": "GPU",
        "ok": False,
        "finished": False,
        "verdicts": dict.fromkeys(SECTIONS),
        "seconds": 12.0,
        "sizes": {"steps": 6},
        "dependencies": gc.dependencies(),
    }
    summary["verdicts"]["dependencies"] = True
    gc.write_summary(tmp_path, summary, "")
    text = (tmp_path / "summary.md").read_text()
    assert "dependencies ok, doctor not run" in text and "## kill -9 and resume: not run" in text
    assert text.count(": not run") == 6 and "stopped (or still running)" in text
    assert json.loads((tmp_path / "summary.json").read_text())["verdicts"]["doctor"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "summary.md"]  # no temporary left


def test_reduced_stand_in_writes_every_section_with_a_verdict(tiny_data, tmp_path):
    """One family, a few steps, the tiny corpus; world size 2 left out (tests/run/test_distributed.py has it).
    About 30 s on 2 busy cores."""
    out = tmp_path / "gpu-check"
    sets = tiny_overrides(tiny_data)  # its train.steps is the sections' own, which win
    args = [sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--families", "rope"]
    args += ["--steps", "6", "--resume-steps", "8", "--parallel-steps", "3", "--eval-tokens", "512"]
    args += ["--doctor-encodings", "rope", "--no-doctor-speed", "--world2", "no"]
    done = subprocess.run(args + [a for s in sets for a in ("--set", s)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"].startswith("STAND-IN") and summary["ok"] is True
    assert list(summary["verdicts"]) == SECTIONS and all(summary["verdicts"].values())
    for name in SECTIONS[3:]:
        assert summary[name]["ok"] is True and summary[name]["seconds"] > 0, name
    resume = summary["resume"]
    assert resume["died"] and resume["resumed_from"] == 4 and resume["losses_identical"]
    assert resume["weights_identical"] and resume["losses_after_resume"] == 4
    assert resume["criterion"] == "identical"
    modes = [(r["mode"], r["world"], r.get("precision")) for r in summary["parallel"]["rows"]]
    assert modes == [
        ("ddp", 1, "fp32"),
        ("fsdp2", 1, "fp32"),
        ("fsdp2", 1, "bf16"),
        ("ddp", 2, None),
        ("fsdp2", 2, None),
    ]
    assert all(r["max_loss_diff"] == 0.0 for r in summary["parallel"]["rows"][:2])  # fp32 on CPU: identical
    (row,) = summary["eval"]["rows"]
    assert row["lengths"] == [1, 2, 4, 8, 16] and row["train_length"] == 32 and row["peak_mb"] is None
    (bench,) = summary["bench"]["rows"]
    assert 0 < bench["mfu"] <= 1 and bench["step_ms"] > 0
    md = (out / "summary.md").read_text()
    assert md.splitlines()[0].startswith("# gpu-check: STAND-IN")
    for header in (
        "## Dependencies: ok",
        "## extrapos doctor: ok",
        "## Short runs",
        "## kill -9 and resume: ok",
        "## DDP and FSDP2: ok",
        "## Evaluation at 1, 2, 4, 8, 16 x L_t: ok",
        "## Bench: absolute times and MFU: ok",
    ):
        assert header in md, header


def test_resume_passes_identical_or_within_a_repeats_difference_and_says_which():
    """On CPU a resume must be bit-identical; on a GPU whose kernels leave two uninterrupted runs apart
    (the second H200 session: 1.4e-3 and 4.5e-2 in loss), no farther from the reference than the repeat."""
    gc = load_script()
    same = {"losses_identical": True, "weights_identical": True, "max_loss_diff": 0.0}
    assert gc.resume_criterion(same) == "identical"
    apart = {"losses_identical": False, "weights_identical": False, "max_loss_diff": 6e-4}
    assert gc.resume_criterion(apart) is None  # no repeat measured (CPU): it must be identical
    noisy = {"repeat_max_loss_diff": 1.4e-3, "repeat_weights_identical": False}
    assert gc.resume_criterion(apart | noisy) == "within the repeat's difference"
    assert gc.resume_criterion(apart | noisy | {"max_loss_diff": 2e-3}) is None  # farther than the repeat
    repeat_same = {"repeat_max_loss_diff": 0.0, "repeat_weights_identical": True}
    assert gc.resume_criterion(apart | repeat_same) is None  # deterministic kernels held: no excuse
    row = {"ok": True, "steps": 16, "checkpoint_every": 4, "kill_after": 8, "died": True, "resumed_from": 8}
    row |= apart | noisy | {"losses_after_resume": 8, "max_weight_diff": 9e-3}
    row["criterion"] = gc.resume_criterion(row)
    text = "\n".join(gc.md_resume(row))
    assert "`train.deterministic`" in text and "**within the kernels' noise**, not as identical" in text


def test_sections_runs_only_those_asked_and_says_so(tmp_path):
    gc = load_script()
    out = tmp_path / "gc"
    args = [sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu"]
    for bad, says in (
        (["--sections", "resume,benchmark"], "--sections takes some of"),
        (["--sections", "eval"], "add runs"),
    ):
        done = subprocess.run(args + bad, capture_output=True, text=True)
        assert done.returncode == 2 and says in done.stderr and not out.exists()
    summary = {
        "mode": "GPU",
        "ok": True,
        "finished": True,
        "verdicts": dict.fromkeys(SECTIONS) | {"dependencies": True, "bench": True},
        "sections": ["dependencies", "bench"],
        "seconds": 3.0,
        "sizes": {"steps": 6},
        "dependencies": gc.dependencies(),
        "bench": {"ok": True, "error": "stop"},
    }
    gc.write_summary(tmp_path, summary, "")
    text = (tmp_path / "summary.md").read_text()
    assert "dependencies ok, doctor not asked (--sections)" in text and "bench ok" in text
    assert text.count("not asked (--sections)") == 2 * 5 and "not run" not in text
