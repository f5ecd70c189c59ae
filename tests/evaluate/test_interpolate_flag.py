"""One evaluation flag set for a parent and its extension (issue 40): `--interpolate` stretches a learned
table only to windows longer than the table, so an extended child (an L_e-row table) is read as trained
up to L_e, and the parent as before; the refusals name CLI flags, not library option names."""

from __future__ import annotations

import json

import pytest
import torch

from extrapos.cli import main
from extrapos.evaluate.window_options import per_window_options
from extrapos.model import Decoder, model_config
from tests.integrations.hf_helpers import CONTEXT, save_hf
from tests.integrations.test_hf_pipeline import _corpus

pytest.importorskip("transformers")


def test_a_window_is_stretched_only_past_the_table():
    L = 32
    parent = Decoder(model_config(n_layers=1, d_model=16, n_heads=2, vocab_size=40, train_length=L,
                                  positions={"name": "learned"})).pos  # fmt: skip
    child = Decoder(model_config(n_layers=1, d_model=16, n_heads=2, vocab_size=40, train_length=L,
                                 positions={"name": "learned", "max_length": 4 * L})).pos  # fmt: skip
    names = {"interpolate_to"}
    # the parent: unchanged (every window past L_t stretched, ev=1 read as trained)
    assert [per_window_options(parent, names, w, L)["interpolate_to"] for w in (L, 2 * L, 8 * L)] == [
        None, 2 * L, 8 * L,
    ]  # fmt: skip
    # the child: read as trained up to its 4 x L_t rows, stretched beyond
    assert [per_window_options(child, names, w, L)["interpolate_to"] for w in (L, 2 * L, 4 * L, 8 * L)] == [
        None, None, None, 8 * L,
    ]  # fmt: skip
    # an encoding without a table: as before, past L_t
    rope = Decoder(model_config(n_layers=1, d_model=16, n_heads=2, vocab_size=40, train_length=L)).pos
    assert per_window_options(rope, names, 2 * L, L) == {"interpolate_to": 2 * L}


def _rows(run, tag, lengths, *flags):
    args = ["eval", str(run), "--lengths", lengths, "--max-tokens", "512", "--no-progress", "--name", tag]
    assert main([*args, *flags]) == 0
    return {r["ev"]: r["loss"] for r in json.loads((run / "eval" / f"{tag}.json").read_text())["results"]}


def test_parent_and_extended_child_evaluate_with_the_same_flags(tmp_path, monkeypatch, capsys):
    from extrapos.integrations.hf import import_pretrained

    monkeypatch.setenv("EXTRAPOS_CACHE", str(tmp_path / "cache"))
    save_hf("gpt2", tmp_path / "hf")  # a learned table of CONTEXT rows
    data = {"corpus": str(_corpus(tmp_path / "corpus")), "split_fractions": [0.5, 0.25, 0.25]}
    parent = import_pretrained(tmp_path / "hf", tmp_path / "parent", data=data)
    child = tmp_path / "child"
    extend = [
        "extend",
        str(parent),
        "--method",
        "chunk",
        "--factor",
        "4",
        "--tokens",
        "512",
        "--out",
        str(child),
    ]
    assert main([*extend, "--set", "train.batch_size=4", "--no-progress"]) == 0
    capsys.readouterr()

    # without the flag, the parent's refusal names the flags that fix it
    assert main(["eval", str(parent), "--lengths", "2", "--max-tokens", "512", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--interpolate" in err and "extrapos extend" in err and "extend_table" not in err

    parent_rows = _rows(parent, "interp", "1,2,4,8", "--interpolate")
    child_rows = _rows(child, "interp", "1,2,4,8", "--interpolate")
    assert set(parent_rows) == set(child_rows) == {1, 2, 4, 8}
    # up to L_e = 4 x L_t the child's table is read as trained: the flag changes nothing there
    assert _rows(child, "interp-1-4", "1,2,4", "--interpolate") == _rows(child, "plain-1-4", "1,2,4")
    assert all(torch.isfinite(torch.tensor(list(child_rows.values()))))
    assert CONTEXT * 4 == json.loads((child / "parent.json").read_text())["extended_length"]
