"""A sweep's time budget (budget_seconds, compare --budget-seconds): each row's measured step turns the
seconds into one token budget for every run, written to OUT/budget.json and reused by a resumed sweep;
bad values are refused before anything trains."""

from __future__ import annotations

import json

import pytest
import torch

from extrapos.compare import budget as budget_mod
from extrapos.compare import compare, load_sweep
from extrapos.errors import UserError
from tests.conftest import tiny_overrides
from tests.robustness.harness import assert_user_error

CPU = torch.device("cpu")
ROWS = (
    '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
    '[[rows]]\nname = "ALiBi"\npositions = { name = "alibi" }\n'
)


def sweep_file(tmp_path, tiny_data, head: str = "budget_seconds = 10\n"):
    sets = [s for s in tiny_overrides(tiny_data) if not s.startswith("train.steps")]
    f = tmp_path / "sweep.toml"
    f.write_text(
        'train = "cpu/tiny"\nlengths = [1, 2]\nmax_eval_tokens = 64\n'
        + head
        + f"set = {json.dumps(sets)}\n"
        + ROWS
    )
    return f


def test_tokens_per_run_split_the_seconds_by_the_measured_steps(tmp_path, tiny_data, monkeypatch):
    steps = {"rope": 0.1, "alibi": 0.3}  # seconds per step of 128 tokens

    def measured(cfg, probe_dir, device, rank, world):
        s = steps[cfg.model.positions["name"]]
        return {
            "step_seconds": s,
            "tokens_per_step": 128,
            "tokens_per_second": 128 / s,
            "warmup_seconds": 0.0,
        }

    monkeypatch.setattr(budget_mod, "_step_times", measured)
    sweep = load_sweep(str(sweep_file(tmp_path, tiny_data)))
    out = tmp_path / "out"
    plan = budget_mod.plan_budget(sweep, sweep.rows, 1, [], out, CPU, say=lambda _: None)
    # 10 s / (0.1 / 128 + 0.3 / 128 s per token) = 3200 tokens = 25 steps of 128
    assert (plan["tokens_per_run"], plan["steps_per_run"]) == (3200, 25)
    assert plan["expected_training_seconds"] == pytest.approx(10.0)
    assert json.loads((out / "budget.json").read_text()) == plan
    fact = budget_mod.budget_fact(plan)
    assert "3,200 tokens (25 steps) per run" in fact and "RoPE 1,280, ALiBi 427" in fact

    # two seeds per row: half the tokens each, whole steps (rounded down); measured anew (other runs)
    (out / "budget.json").unlink()
    assert (
        budget_mod.plan_budget(sweep, sweep.rows, 2, [], out, CPU, say=lambda _: None)["steps_per_run"] == 12
    )

    # the same sweep again: the saved measurement, not a new one (a resumed sweep keeps its runs' budget)
    monkeypatch.setattr(budget_mod, "_step_times", lambda *a: pytest.fail("measured again"))
    assert (
        budget_mod.plan_budget(sweep, sweep.rows, 2, [], out, CPU, say=lambda _: None)["steps_per_run"] == 12
    )
    (out / "runs" / "rope").mkdir(parents=True)
    (out / "runs" / "rope" / "config.toml").write_text("")
    sweep.budget_seconds = 20.0
    with pytest.raises(UserError, match="another budget_seconds"):
        budget_mod.plan_budget(sweep, sweep.rows, 2, [], out, CPU, say=lambda _: None)


def test_a_budget_sweep_trains_equal_tokens_and_resumes_with_them(tmp_path, tiny_data, capsys, console):
    spec = sweep_file(tmp_path, tiny_data, "budget_seconds = 1.5\n")
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    plan = json.loads((out / "budget.json").read_text())
    tokens = {
        json.loads((out / "runs" / r / "summary.json").read_text())["tokens"] for r in ("rope", "alibi")
    }
    assert tokens == {plan["tokens_per_run"]}
    facts = json.loads((out / "facts.json").read_text())
    assert any(f.startswith("budget: 1.5 s of training") for f in facts)
    assert "scored in fp32" in (out / "report.md").read_text()
    capsys.readouterr()
    compare(str(spec), out, progress=False)  # the same command again: nothing measured or trained anew
    said = capsys.readouterr().out
    assert "as measured before" in said and said.count("finished run reused") == 2
    assert json.loads((out / "budget.json").read_text()) == plan


@pytest.mark.parametrize(
    "head,extra,fragments",
    [
        ("budget_seconds = -3\n", [], ["budget_seconds must be a positive number of seconds", "-3"]),
        ("budget_seconds = 0\n", [], ["budget_seconds must be a positive"]),
        ('eval_precision = "fp16"\n', [], ["eval_precision must be fp32, bf16, auto", "'fp16'"]),
        ("", ["--budget-seconds", "0"], ["--budget-seconds must be a positive number of seconds"]),
        ("", ["--budget-seconds", "nan"], ["--budget-seconds must be a positive number of seconds"]),
    ],
)
def test_bad_budgets_and_precisions_are_refused_before_anything_trains(
    tmp_path, tiny_data, head, extra, fragments
):
    spec = sweep_file(tmp_path, tiny_data, head)
    out = tmp_path / "cmp"
    assert_user_error(
        ["compare", str(spec), "--out", str(out), *extra],
        cache=tmp_path / "cache",
        watch=[spec, tiny_data],
        fragments=fragments,
    )
    assert not (out / "runs").exists()
