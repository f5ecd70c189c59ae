"""Every numeric option within a plausible range, checked by the options themselves (issue 37, items 6-7;
issue 38, item 4).

YaRN's ``beta_fast=0`` was a division by zero (exit 70), ``beta_fast=-1e30`` a math domain error; a factor
of 1e30 or a base of 1e308 gave finite, meaningless losses; ``Decoder(model_config('cpu-tiny',
positions={'name': 'rope', 'base': 0}))`` built a model whose logits were all NaN while the CLI refused the
same value. Each encoding's ``Options`` now declares its ``BOUNDS`` (``extrapos/bounds.py``): the library
and the CLI refuse the same values with the same sentence, and an imported config.json's values are
checked at import, naming the field. docs/robustness.md's table is the declared bounds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from harness import PREFIX
from test_import_inputs import _llama, _refused, base, model  # noqa: F401 (fixtures)

from extrapos.bounds import Bound
from extrapos.cli import main
from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions.registry import names, spec


def _outside(bound: Bound) -> list[float]:
    """Values just outside ``bound`` and far outside it."""
    values = []
    if bound.low is not None:
        values += [bound.low if bound.low_open else bound.low - 1, -1e30]
    if bound.high is not None:
        values += [bound.high if bound.high_open else bound.high * 10 + 1, 1e30]
    return values


def _cases() -> list[tuple[str, str, float]]:
    cases = []
    for name in names():
        for key, bound in spec(name).cls.Options.BOUNDS.items():
            cases += [(name, key, value) for value in _outside(bound)]
    return cases


CROSS = [  # rules between options
    ("rope", {"scaling": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 1.0}, "beta_fast"),
    ("rope", {"scaling": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast"),
    ("rope", {"scaling": "linear", "factor": 0.5}, "factor"),
    (
        "rope",
        {"scaling": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
        "high_freq_factor",
    ),
    ("xpos", {"scaling": "yarn", "factor": 2.0, "beta_fast": 0.5}, "beta_fast"),
]


def _library_refusal(name: str, options: dict) -> str:
    with pytest.raises(UserError) as caught:
        Decoder(model_config("cpu-tiny", positions={"name": name, **options}))
    return str(caught.value)


def _cli_refusal(name: str, options: dict, tmp_path: Path, capsys) -> str:
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"name": name, **options}.items())
    out = tmp_path / "run"
    code = main(["train", "--config", "cpu/tiny", "--out", str(out), "--set", f"model.positions={{{table}}}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not out.exists(), err
    (line,) = err.strip().splitlines()
    assert line.startswith(PREFIX)
    return line[len(PREFIX) :]


def test_every_encoding_declares_bounds_for_its_numeric_options():
    for name in names():
        options = spec(name).cls.Options
        numeric = {
            f.name
            for f in dataclasses.fields(options)
            if re.fullmatch(r"(int|float)( \| None)?", str(f.type))
        }
        assert numeric <= set(options.BOUNDS), f"{name}: no bound for {sorted(numeric - set(options.BOUNDS))}"


@pytest.mark.parametrize("name,key,value", _cases(), ids=[f"{n}-{k}={v:g}" for n, k, v in _cases()])
def test_library_and_cli_refuse_the_same_values(name, key, value, tmp_path, capsys):
    library = _library_refusal(name, {key: value})
    assert f"model.positions.{key}" in library and "must be" in library
    assert _cli_refusal(name, {key: value}, tmp_path, capsys) == library


@pytest.mark.parametrize("name,options,key", CROSS, ids=[f"{n}-{k}" for n, _, k in CROSS])
def test_rules_between_options(name, options, key, tmp_path, capsys):
    library = _library_refusal(name, options)
    assert f"model.positions.{key}" in library
    assert _cli_refusal(name, options, tmp_path, capsys) == library


def _wrong_types() -> list[tuple[str, str, object]]:
    """One value of the wrong type for every typed option of every encoding (a string for a number or a
    switch, a number for a string), and an option the encoding does not have."""
    cases: list[tuple[str, str, object]] = []
    for name in names():
        for f in dataclasses.fields(spec(name).cls.Options):
            kind = str(f.type)
            if re.fullmatch(r"(int|float|bool)( \| None)?", kind):
                cases.append((name, f.name, "x"))
            elif re.fullmatch(r"str( \| None)?", kind):
                cases.append((name, f.name, 1))
        cases.append((name, "no_such_option", 1))
    return cases


@pytest.mark.parametrize(
    "name,key,value", _wrong_types(), ids=[f"{n}-{k}={v!r}" for n, k, v in _wrong_types()]
)
def test_library_and_cli_refuse_the_same_types_and_names(name, key, value, tmp_path, capsys):
    library = _library_refusal(name, {key: value})
    assert key in library
    assert _cli_refusal(name, {key: value}, tmp_path, capsys) == library


MODEL_VALUES = [  # the model section's own rules (model.py's ModelConfig.validate), not an encoding's
    ("norm_eps", 0.0),
    ("norm_eps", 1.5),
    ("init_std", -0.1),
    ("n_kv_heads", 0),
    ("mlp_hidden", 0),
    ("dropout", 1.0),
    ("n_layers", 0),
    ("sliding_window", 0),
]


@pytest.mark.parametrize("key,value", MODEL_VALUES, ids=[f"{k}={v}" for k, v in MODEL_VALUES])
def test_library_and_cli_refuse_the_same_model_values(key, value, tmp_path, capsys):
    with pytest.raises(UserError) as caught:
        Decoder(model_config("cpu-tiny", **{key: value}))
    library = str(caught.value)
    assert key in library
    out = tmp_path / "run"
    code = main(["train", "--config", "cpu/tiny", "--out", str(out), "--set", f"model.{key}={value}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not out.exists(), err
    (line,) = err.strip().splitlines()
    assert line == PREFIX + library


def test_set_options_refuses_and_keeps_the_previous_value():
    decoder = Decoder(model_config("cpu-tiny", positions={"name": "rope"}))
    with pytest.raises(UserError, match="factor"):
        decoder.pos.set_options(scaling="yarn", factor=1e30)
    assert decoder.pos.options.factor == 1.0 and decoder.pos.options.scaling is None


IMPORTED = [
    ("rope_theta 1e308", _llama(rope_theta=1e308), "rope_theta"),
    (
        "yarn factor 1e30",
        _llama(rope_scaling={"rope_type": "yarn", "factor": 1e30, "attention_factor": 1e30}),
        "rope_scaling.factor",
    ),
    (
        "yarn beta_fast 1e30",
        _llama(rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 1e30}),
        "rope_scaling.beta_fast",
    ),
    (
        "yarn attention_factor 1e30",
        _llama(rope_scaling={"rope_type": "yarn", "factor": 2.0, "attention_factor": 1e30}),
        "rope_scaling.attention_factor",
    ),
    (
        "dynamic factor 1e9",
        _llama(rope_scaling={"rope_type": "dynamic", "factor": 1e9}),
        "rope_scaling.factor",
    ),
]


@pytest.mark.parametrize("config,field", [c[1:] for c in IMPORTED], ids=[c[0] for c in IMPORTED])
def test_imported_values_are_bounded_naming_the_field(model, scratch, capsys, config, field):  # noqa: F811
    (model / "config.json").write_text(json.dumps(config))
    _refused(model, scratch, capsys, "config.json's " + field, "must be within")


def test_the_docs_table_is_the_declared_bounds():
    text = (Path(__file__).resolve().parents[2] / "docs" / "robustness.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            for encoding in cells[0].replace(" (and its ablations)", "").split(", "):
                rows[(encoding, cells[1].strip("`"))] = cells[2]
    documented = {}  # an Options class -> the name the table lists it under (expe's ablations share one)
    for name in names():
        if any(encoding == name for encoding, _ in rows):
            documented.setdefault(spec(name).cls.Options, name)
    for name in names():
        options = spec(name).cls.Options
        for key, bound in options.BOUNDS.items():
            listed = documented.get(options)
            assert listed is not None, f"docs/robustness.md lists no bounds of {name}"
            assert rows.get((listed, key)) == bound.range, (
                f"docs/robustness.md: {name} {key} is not {bound.range}"
            )
