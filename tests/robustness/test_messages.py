"""Messages that named the wrong reason (issue 37, item 10), each refused with the right one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_import_inputs import _refused, base, model  # noqa: F401 (fixtures)
from test_sweep_inputs import refused

from extrapos.errors import UserError
from extrapos.evaluate.slot import check_result_name
from tests.conftest import encoder_overrides


def test_a_long_name_is_refused_for_its_length():
    with pytest.raises(
        UserError, match="result name of 300 characters is too long .at most 120.; choose a shorter"
    ):
        check_result_name("a" * 300)
    assert check_result_name("a" * 120) == "a" * 120
    with pytest.raises(UserError, match="plain file name"):
        check_result_name("../x")


def test_a_config_json_link_loop_is_named(model, scratch, capsys):  # noqa: F811
    (model / "config.json").unlink()
    os.symlink("config.json", model / "config.json")  # a link to itself
    _refused(model, scratch, capsys, "config.json is a symlink that leads nowhere")


def test_the_rehearsal_config_does_not_call_gpt2_bundled():
    text = (Path(__file__).resolve().parents[2] / "configs" / "cpu" / "rehearsal.toml").read_text()
    assert "(bundled)" not in text and "not bundled" in text


def test_an_encoder_row_with_the_stream_protocol_is_refused_before_training(tiny_data, scratch, cache):
    """It was refused by the evaluation, after the first row had trained (42 s of a tiny sweep)."""
    overrides = [s.replace('"', '\\"') for s in encoder_overrides(tiny_data)]
    sweep = scratch / "sweep.toml"
    sweep.write_text(
        'train = "cpu/tiny"\nlengths = [1]\nprotocol = "stream"\n'
        + "set = ["
        + ", ".join(f'"{o}"' for o in overrides)
        + "]\n"
        + '[[rows]]\nname = "enc"\npositions = { name = "rope" }\n'
    )
    refused(sweep, tiny_data, scratch, cache, ["row 'enc' is an encoder", "documents protocol only"])


def test_report_of_a_compare_killed_before_its_first_result(scratch, cache):
    from harness import assert_user_error

    folder = scratch / "cmp"
    (folder / "runs").mkdir(parents=True)
    (folder / ".extrapos-compare").write_text("")
    assert_user_error(
        ["report", str(folder)], cache=cache, watch=[folder], fragments=["stopped before it wrote rows.json"]
    )
