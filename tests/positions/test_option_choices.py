"""String options are choices (``Literal``), refused when the Options is built (issue 45): before a run
writes anything into --out, before a sweep trains its other rows, and in the library as in a config."""

from __future__ import annotations

import pytest

from extrapos.bounds import BoundError, choices
from extrapos.cli import main
from extrapos.errors import UserError
from extrapos.positions.registry import build_options, spec

CASES = [  # encoding, option, a value it refuses, the choices its message lists
    ("rope", "scaling", "bogus", ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")),
    ("kerple-log", "form", "cubic", ("log", "power")),
    ("cable", "variant", "unofficial", ("paper", "official")),
    ("dape", "base", "rope", ("kerple-log", "kerple-power", "t5", "fire")),
]


@pytest.mark.parametrize("name,key,bad,allowed", CASES, ids=[c[0] for c in CASES])
def test_a_string_option_outside_its_choices_is_refused_when_built(name, key, bad, allowed):
    cls = spec(name).cls.Options
    assert choices(cls)[key] == allowed
    with pytest.raises(
        UserError, match=rf"model.positions.{key} .* must be one of '{allowed[0]}'.*got '{bad}'"
    ):
        build_options(name, {key: bad})
    with pytest.raises(BoundError, match=f"option {key} must be one of"):  # the library, without a config
        cls(**{key: bad})
    for value in allowed:  # and every choice builds
        assert getattr(build_options(name, {key: value}), key) == value


def test_train_refuses_a_bad_choice_before_writing_into_out(tmp_path, capsys):
    """`extrapos train --set 'model.positions={name="rope", scaling="bogus"}'` left .lock, config.toml,
    data.json and tokenizer.json in --out before refusing (issue 45); now nothing is written."""
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            "cpu/tiny",
            "--out",
            str(out),
            "--set",
            'model.positions={name="rope", scaling="bogus"}',
        ]
    )
    assert code == 2 and not out.exists()
    assert "model.positions.scaling (an option of encoding 'rope') must be one of" in capsys.readouterr().err


def test_nan_for_an_optional_float_says_finite(tmp_path, capsys):
    """``attention_factor`` (a float or None) given nan says "must be a finite number", as every other
    float option does, not "must be float" (issue 48, item 7)."""
    code = main(
        ["train", "--config", "cpu/tiny", "--out", str(tmp_path / "r"), "--set",
         'model.positions={name="rope", scaling="yarn", attention_factor=nan}']
    )  # fmt: skip
    err = capsys.readouterr().err
    assert (
        code == 2
        and "attention_factor (an option of encoding 'rope') must be a finite number, got nan" in err
    )


def test_every_rope_scaling_name_has_its_entry_in_the_registry():
    """RoPE's scalings are one dictionary (ROPE_SCALINGS, as Hugging Face's ROPE_INIT_FUNCTIONS): each name
    the ``scaling`` option accepts has exactly one entry, and no entry is unreachable."""
    from extrapos.positions.rotary import ROPE_SCALINGS, SCALINGS, RoPE

    assert set(ROPE_SCALINGS) == set(SCALINGS) == {None, *choices(RoPE.Options)["scaling"]}
