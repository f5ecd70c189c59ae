"""Messages that named the wrong reason (issue 37, item 10), each refused with the right one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_import_inputs import _refused, base, model  # noqa: F401 (fixtures)

from extrapos.errors import UserError
from extrapos.evaluate.slot import check_result_name


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
