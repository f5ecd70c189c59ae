"""The whole pretrained-model path on the command line: import -> eval 1,2,4 -> extend chunk-0.25 x2 ->
eval -> export -> load with transformers (a tiny random Llama and a tiny random GPT-2, no download)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from extrapos.cli import main
from tests.integrations.hf_helpers import CONTEXT, TEXT, hf_logits, ours_logits, save_hf

pytest.importorskip("transformers")


def _corpus(directory):
    """Forty documents of the tokenizer's own sentences, long enough for windows of 4 x CONTEXT."""
    rng = random.Random(0)
    directory.mkdir()
    sentences = [s for t in TEXT for s in t.split(". ") if s.strip()]
    for i in range(40):
        (directory / f"doc{i:02d}.txt").write_text(". ".join(rng.choice(sentences) for _ in range(60)))
    return directory


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_import_eval_extend_eval_export_load(kind, tmp_path, monkeypatch, capsys):
    import transformers as T

    from extrapos.integrations.hf import import_pretrained

    monkeypatch.setenv("EXTRAPOS_CACHE", str(tmp_path / "cache"))
    save_hf(kind, tmp_path / "hf")
    run, ext, exported = tmp_path / "run", tmp_path / "run-chunk", tmp_path / "exported"
    import_pretrained(
        tmp_path / "hf",
        run,
        data={"corpus": str(_corpus(tmp_path / "corpus")), "split_fractions": [0.5, 0.25, 0.25]},
    )
    learned = ["--interpolate"] if kind == "gpt2" else []  # GPT-2's table has CONTEXT rows
    assert (
        main(["eval", str(run), "--lengths", "1,2,4", "--max-tokens", "512", "--no-progress", *learned]) == 0
    )
    before = capsys.readouterr().out
    assert "| 4 | 128 |" in before
    assert (
        main(
            [
                "extend",
                str(run),
                "--method",
                "chunk",
                "--factor",
                "2",
                "--tokens",
                "2048",
                "--out",
                str(ext),
                "--set",
                "train.batch_size=4",
                "--no-progress",
            ]
        )
        == 0
    )
    parent = json.loads((ext / "parent.json").read_text())
    assert (
        parent["method"] == "chunk" and parent["alpha"] == 0.25 and parent["extended_length"] == 2 * CONTEXT
    )
    assert main(["eval", str(ext), "--lengths", "1,2", "--max-tokens", "512", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["export", str(ext), "--out", str(exported)]) == 0
    hf = T.AutoModelForCausalLM.from_pretrained(exported, attn_implementation="eager").float().eval()
    from extrapos.run.directory import load_run

    ours = load_run(ext).model
    tokens = torch.randint(
        0, 300, (2, 2 * CONTEXT)
    )  # the extended length: GPT-2's exported table has 2 x rows
    assert (hf_logits(hf, tokens) - ours_logits(ours, tokens)).abs().max() < 1e-4
