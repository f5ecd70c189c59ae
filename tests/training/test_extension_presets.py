"""`extrapos extend RUN --preset NAME`: the segmented-sequences paper's recipe on an imported model, the
plan printed before training (with a measured-step estimate and the imported model's guessed learning
rate), the summary after, and `extrapos presets` listing the extension presets."""

from __future__ import annotations

import json

import pytest

from extrapos.cli import main
from extrapos.training.extension_presets import PRESETS
from tests.integrations.hf_helpers import CONTEXT, save_hf
from tests.integrations.test_hf_pipeline import _corpus

pytest.importorskip("transformers")


@pytest.fixture
def imported(tmp_path, monkeypatch):
    from extrapos.integrations.hf import import_pretrained

    monkeypatch.setenv("EXTRAPOS_CACHE", str(tmp_path / "cache"))
    save_hf("gpt_neox", tmp_path / "hf")
    data = {"corpus": str(_corpus(tmp_path / "corpus")), "split_fractions": [0.5, 0.25, 0.25]}
    return import_pretrained(tmp_path / "hf", tmp_path / "run", data=data)


def test_the_segmented_preset_on_an_imported_model(imported, tmp_path, capsys):
    out = tmp_path / "ext"
    argv = ["extend", str(imported), "--preset", "segmented-chunk-x4", "--out", str(out)]
    assert main([*argv, "--tokens", "1024", "--set", "train.batch_size=4"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "parent.json").read_text())
    # the paper's settings (Karypis et al. Table 3, §4.4): chunk, alpha 0.25, 4 x L_t
    assert (record["method"], record["alpha"], record["factor"]) == ("chunk", 0.25, 4)
    assert record["preset"] == "segmented-chunk-x4" and record["extended_length"] == 4 * CONTEXT
    # the plan, before the training log
    plan = printed[: printed.index("done:")]
    assert f"L_t {CONTEXT} -> L_e {4 * CONTEXT} (factor 4)" in plan
    assert "method chunk (alpha 0.25), preset segmented-chunk-x4" in plan
    assert "position table: none (rope" in plan
    assert f"tokens: {record['tokens']:,} in " in plan and "learning rate 0.0001 -> 0.0001" in plan
    assert "estimated time: " in plan and "s measured on" in plan
    assert "imported model" in plan and "is a guess; set it with --set train.lr=LR" in plan
    # and the summary after
    after = printed[printed.index("done:") :]
    assert "chunk x4: L_t 32 -> L_e 128" in after and "final training loss" in after
    assert f"extrapos eval {imported} --lengths 1,4,8 and extrapos eval {out} --lengths 1,4,8" in after


def test_the_compute_equivalent_budget_is_the_default_of_the_preset(imported, tmp_path):
    """Without --tokens the preset takes the paper's budget: L_e / L_t epochs of the L_e windows."""
    from extrapos.training.extend import extension_config

    cfg, record = extension_config(imported, "chunk", 4, 0.25, preset="segmented-chunk-x4")
    assert record["compute_equivalent"] and cfg.train.tokens == record["tokens"] > 0


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--method", "full"], "drop --method or drop --preset"),
        (["--factor", "2"], "drop --factor or drop --preset"),
    ],
)
def test_a_preset_with_its_own_flags_is_refused(imported, tmp_path, extra, fragment, capsys):
    argv = ["extend", str(imported), "--preset", "segmented-chunk-x2", "--out", str(tmp_path / "e"), *extra]
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_unknown_preset_and_no_method(imported, tmp_path, capsys):
    assert main(["extend", str(imported), "--preset", "nope", "--out", str(tmp_path / "e")]) == 2
    assert "segmented-chunk-x4" in capsys.readouterr().err
    assert main(["extend", str(imported), "--out", str(tmp_path / "e")]) == 2
    assert "--method METHOD or --preset NAME" in capsys.readouterr().err


def test_presets_lists_the_extension_presets(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "cpu/tiny" in out and "extension presets (extrapos extend RUN --preset NAME):" in out
    for name, p in PRESETS.items():
        assert f"{name}" in out and f"{p.method}-{p.alpha:g} x{p.factor}" in out
