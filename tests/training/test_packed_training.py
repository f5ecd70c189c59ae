"""Training on documents shorter than the window: what share of the split a run reaches, said up front,
and packed, document-masked runs end to end."""

from __future__ import annotations

import pytest

from extrapos.run.config import load_config
from extrapos.training import trainer as train_mod
from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def short_data(tmp_path_factory):
    """Web-length documents (sotu-short, median ~270 GPT-2 tokens) under a small trained BPE."""
    from extrapos.data import prepare_data

    out = tmp_path_factory.mktemp("short") / "sotu-short"
    return prepare_data("sotu-short", "bpe:512", out, max_docs=120, progress=False)


def run(short_data, tmp_path, capsys, length=128, **extra):
    overrides = tiny_overrides(short_data, **{"model.train_length": length, "train.steps": 3, **extra})
    train_mod.train(load_config("cpu/tiny", overrides), tmp_path / "run", progress=False)
    return capsys.readouterr().out


def test_unpacked_run_on_short_documents_warns_in_one_sentence(short_data, tmp_path, capsys, console):
    out = run(short_data, tmp_path, capsys, length=1024)  # a 512-token BPE: ~2.5x GPT-2's tokens
    warning = [line for line in out.splitlines() if "predicts" in line]
    assert len(warning) == 1 and warning[0].startswith("extrapos: warning: an epoch of 1024-token windows")
    assert "set data.packed = true" in warning[0]
    share = float(warning[0].split("predicts ")[1].split("%")[0])
    assert share < 50


@pytest.mark.parametrize("mask", [False, True])
def test_packed_run_reaches_the_split_and_says_so(short_data, tmp_path, capsys, mask, console):
    extra = {"data.packed": "true"}
    if mask:
        extra.update({"data.document_mask": "true", "data.document_positions": '"restart"'})
    out = run(short_data, tmp_path, capsys, **extra)
    said = [line for line in out.splitlines() if "predicts" in line]
    assert len(said) == 1 and said[0].startswith(
        "extrapos train: an epoch of 128-token windows predicts 100.0%"
    )
    config = (tmp_path / "run" / "config.toml").read_text()
    assert "packed = true" in config and ("document_mask = true" in config) == mask
