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

SRC = Path(__file__).resolve().parents[1] / "src" / "extrapos"


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
