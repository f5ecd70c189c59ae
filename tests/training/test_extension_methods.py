"""Every context-extension method on one RoPE parent (issue 26, item 2): inference-time scalings whose
factor follows each evaluated length (``factor = "ev"``), the same scalings switched on for a fine-tune
at L_e (``extend --rope-scaling``), and the ``extension-methods`` preset that puts them on one table."""

from __future__ import annotations

import json

import pytest

from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, evaluate
from extrapos.run.config import load_config, load_run_config
from extrapos.training.extend import extension_config
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides

L_T = 16


@pytest.fixture(scope="module")
def parent(tiny_data, tmp_path_factory):
    """A finished tiny RoPE run at L_t = 16."""
    out = tmp_path_factory.mktemp("ext-methods") / "rope"
    overrides = tiny_overrides(tiny_data, **{"model.train_length": L_T, "train.steps": 3})
    train(load_config("cpu/tiny", overrides), out, progress=False)
    return out


def test_ev_factor_is_each_lengths_multiple(parent):
    """``factor = "ev"`` scores every length with s = its own window / L_t: the same losses as the explicit
    factor, length by length."""
    for k in (2, 4):
        named = evaluate(
            parent,
            EvalRequest(lengths=[k], max_tokens=64, position_options={"scaling": "yarn", "factor": "ev"}),
            name=f"ev-{k}",
            progress=False,
        )
        explicit = evaluate(
            parent,
            EvalRequest(lengths=[k], max_tokens=64, position_options={"scaling": "yarn", "factor": float(k)}),
            name=f"explicit-{k}",
            progress=False,
        )
        assert named["results"][0]["loss"] == explicit["results"][0]["loss"]
    plain = evaluate(parent, EvalRequest(lengths=[4], max_tokens=64), name="plain", progress=False)
    assert plain["results"][0]["loss"] != named["results"][0]["loss"]  # the scaling did change the model


def test_a_fine_tune_trains_with_the_scaling_at_its_factor(parent):
    cfg, record = extension_config(parent, "full", 4, rope_scaling="yarn", tokens=64)
    assert cfg.model.positions["scaling"] == "yarn" and cfg.model.positions["factor"] == 4.0
    assert record["rope_scaling"] == "yarn" and any("scaling = yarn" in c for c in record["changes"])
    _, plain = extension_config(parent, "full", 4, tokens=64)
    assert "rope_scaling" not in plain  # records of runs without it stay as they were


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"rope_scaling": "longrope"}, "longrope needs per-frequency factors"),
        ({"rope_scaling": "cubic"}, "must be one of linear, ntk, dynamic, yarn, llama3"),
        ({"rope_scaling": "yarn", "rope_interpolation": True}, "give one of them"),
    ],
)
def test_bad_scalings_are_one_sentence(parent, kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        extension_config(parent, "full", 2, tokens=64, **kwargs)


def test_compare_puts_scalings_and_fine_tunes_on_one_table(parent, tiny_data, tmp_path):
    from extrapos.compare import compare

    sets = tiny_overrides(tiny_data, **{"model.train_length": L_T, "train.steps": 2})
    spec = tmp_path / "methods.toml"
    spec.write_text(
        'title = "tiny methods"\ntrain = "cpu/tiny"\nlengths = [2, 4]\nmax_eval_tokens = 64\n'
        f"eval_each_length = true\nextend_tokens = 64\nset = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
        '[[rows]]\nname = "YaRN"\nreuse = "RoPE"\neval = { scaling = "yarn", factor = "ev" }\n'
        '[[rows]]\nname = "YaRN + fine-tune"\n'
        'extend = { from = "RoPE", method = "full", rope_scaling = "yarn", factor = [2] }\n'
    )
    out = tmp_path / "out"
    compare(str(spec), out, progress=False)
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())}
    assert [r["ev"] for r in rows["YaRN"]["results"]] == [2, 4]
    tuned = load_run_config(out / "runs" / "yarn--fine-tune-x2")
    assert tuned.model.positions["scaling"] == "yarn" and tuned.model.positions["factor"] == 2.0
    bad = tmp_path / "bad.toml"
    bad.write_text(spec.read_text().replace('rope_scaling = "yarn"', 'rope_scaling = "longrope"'))
    with pytest.raises(UserError, match="extend.rope_scaling must be one of"):
        compare(str(bad), tmp_path / "bad-out", progress=False)
    assert not (tmp_path / "bad-out" / "runs").exists()  # refused before any row trained


def test_the_preset_loads_with_every_method():
    from extrapos.compare import load_sweep

    sweep = load_sweep("extension-methods")
    scalings = {r.eval.get("scaling") for r in sweep.rows if r.reuse}
    assert scalings == {"linear", "ntk", "dynamic", "yarn", "llama3"}
    assert all(r.eval["factor"] == "ev" for r in sweep.rows if r.reuse)
    tuned = {r.extend.rope_scaling for r in sweep.rows if r.extend is not None}
    assert tuned == {"linear", "ntk", "yarn", "llama3", None}
    methods = {r.extend.method for r in sweep.rows if r.extend is not None and r.extend.rope_scaling is None}
    # continue: the compute-matched control (the same tokens at L_t, no extension)
    assert methods == {"full", "chunk", "pose", "randompos", "continue"}
    assert len({r.extend.tokens for r in sweep.rows if r.extend is not None}) == 1  # one budget for all
    assert list(sweep.seeds) == [0, 1, 2]  # the fine-tunes' margins are read over seeds, not one run
