"""The Evaluator protocol (``evaluate/evaluator.py``): every evaluation is one class registered by name, and
the sweep's task columns and the commands look evaluators up by name (issue 38, item 2)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from extrapos.compare.tasks import TASKS
from extrapos.evaluate import EvalRequest
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import REGISTERED, Scoring, column_name, evaluator, loss_evaluator, names
from extrapos.run.config import load_config
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides

SRC = Path(__file__).resolve().parents[2] / "src" / "extrapos"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_registered_evaluator_is_one_class_with_a_typed_request(name):
    if name == "lm-eval":
        pytest.importorskip("lm_eval")  # the eval extra
    ev = evaluator(name)
    assert ev.name == name and callable(ev.score)
    assert dataclasses.is_dataclass(ev.request_type)


def test_every_task_column_of_a_sweep_is_a_registered_evaluator():
    pytest.importorskip("lm_eval")  # the eval extra: the lm-eval column's evaluator imports it
    assert set(TASKS) <= set(names())
    assert all(callable(evaluator(task).column) for task in TASKS)


def test_an_unknown_name_names_the_registered_ones():
    with pytest.raises(KeyError, match="registered: eval, mlm"):
        evaluator("perplexity")


def test_compare_holds_no_branch_per_evaluator():
    """compare/tasks.score looks the column's evaluator up: no ``task == "passkey"`` left in the file."""
    tree = ast.parse((SRC / "compare" / "tasks.py").read_text())
    compared = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and c.value in TASKS for c in [node.left, *node.comparators])
    ]
    assert compared == []


def test_a_column_name_keys_the_request():
    a = column_name("passkey-rank", [1, 2], {"scale": 0.5}, None, {"trials": 2})
    assert a.startswith("passkey-rank-ev1_2-scale0.5-") and len(a.rsplit("-", 1)[1]) == 8
    assert column_name("passkey-rank", [1, 2], {"scale": 0.5}, None, {"trials": 3}) != a
    assert column_name("lm-eval", [], {}, 64, {"tasks": ["x"]}).split("-")[2] == "base64"


@pytest.fixture(scope="module")
def run_dir(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("evaluator") / "rope"
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 2}))
    train(cfg, out, progress=False)
    return out


def test_the_registered_loss_evaluator_writes_what_evaluate_writes(run_dir):
    from extrapos.evaluate import evaluate

    run = Run(run_dir)
    assert loss_evaluator(run).name == "eval"
    req = EvalRequest(lengths=[1, 2], max_tokens=64)
    got = drive(loss_evaluator(run), run, req, Shard(), Scoring(name="registered", progress=False))
    direct = evaluate(run_dir, req, name="direct", progress=False)
    assert got["result_key"] == direct["result_key"] and got["results"] == direct["results"]
    assert json.loads((run_dir / "eval" / "registered.json").read_text())["results"] == got["results"]


def test_cli_eval_holds_no_branch_per_evaluator():
    """cli/eval.py asks the run's loss evaluator; it never reads is_encoder nor names eval or mlm itself."""
    text = (SRC / "cli" / "eval.py").read_text()
    assert "is_encoder" not in text and 'evaluator("mlm")' not in text and 'evaluator("eval")' not in text


def test_every_evaluator_only_scores_and_the_driver_writes():
    """No evaluator module writes its own result: ``slot.write`` is called by the driver alone."""
    modules = [REGISTERED[n].split(":")[0] for n in REGISTERED]
    for module in modules:
        path = SRC.parent / (module.replace(".", "/") + ".py")
        assert "slot.write(" not in path.read_text(), path
    assert "slot.write(" in (SRC / "evaluate" / "driver.py").read_text()


def test_a_refusal_after_the_slot_lets_the_name_go(run_dir, monkeypatch):
    """A refused estimate (after the slot was opened and its lock taken) releases the lock: the next
    request of the name is scored, not left waiting."""
    from extrapos.errors import UserError
    from extrapos.evaluate.next_token import NextTokenEvaluator

    def refuse(self, prepared, how):
        raise UserError("too big")

    req = EvalRequest(lengths=[1], max_tokens=32)
    monkeypatch.setattr(NextTokenEvaluator, "estimate", refuse)
    with pytest.raises(UserError, match="too big"):
        drive(NextTokenEvaluator(), Run(run_dir), req, Shard(), Scoring(name="released", progress=False))
    monkeypatch.undo()
    got = drive(NextTokenEvaluator(), Run(run_dir), req, Shard(), Scoring(name="released", progress=False))
    again = drive(NextTokenEvaluator(), Run(run_dir), req, Shard(), Scoring(name="released", progress=False))
    assert again == got  # the saved result is reused by the driver
