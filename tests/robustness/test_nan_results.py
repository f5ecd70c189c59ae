"""A result whose loss is NaN or infinite, from option values that pass validation, is never saved as if it
were valid (issue 24, the last note's leftover): one sentence naming the options, nothing written.

``files.finite_json`` is the check; the writers of results call it (``evaluate`` and ``tasks.common``
write their JSON through it).
"""

from __future__ import annotations

import json
import math

import pytest

from extrapos.cli import main
from extrapos.errors import UserError
from extrapos.files import finite_json
from tests.conftest import tiny_overrides


def test_a_finite_result_is_the_json_it_always_was():
    result = {"results": [{"loss": 6.25, "ppl": 518.0}], "name": "test"}
    assert json.loads(finite_json(result, {"base": 500.0})) == result


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_is_refused_naming_the_options(bad):
    result = {"results": [{"window": 16, "loss": bad}]}
    with pytest.raises(UserError) as refused:
        finite_json(result, {"scaling": "yarn", "attention_factor": 1e30}, "evaluation")
    sentence = str(refused.value)
    assert "scaling=yarn, attention_factor=1e+30" in sentence and "nothing was written" in sentence
    assert sentence.endswith(".") and ". " not in sentence


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    out = tmp_path_factory.mktemp("nan") / "run"
    overrides = tiny_overrides(tiny_data, **{"train.steps": 2, "model.n_layers": 1, "model.train_length": 16})
    train(load_config("cpu/tiny", overrides), out, progress=False)
    return out


def test_eval_refuses_an_option_that_would_overflow_before_scoring(run, capsys):
    """YaRN's attention_factor = 1e30 overflowed the logits to a NaN loss, which the result slot refused
    to save (finite_json, above); the option's plausibility bound now refuses it before any scoring."""
    args = ["eval", str(run), "--lengths", "1", "--max-tokens", "64", "--no-progress", "--name", "overflow"]
    code = main([*args, "--rope-scaling", "yarn", "--position-option", "attention_factor=1e30"])
    err = capsys.readouterr().err
    assert not (run / "eval" / "overflow.json").exists()
    assert code == 2 and "attention_factor" in err and "(0, 16]" in err
