"""Sliding windows through Hugging Face import and export: a tiny random Mistral (window 16, context 64)
and a Qwen2 whose window covers only its last layer, compared with transformers past the window: logits
of one forward, with the KV cache, greedy decoding, and the export read back by transformers and by us."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from extrapos.errors import UserError  # noqa: E402
from extrapos.inference.generate import generate_tokens  # noqa: E402
from extrapos.integrations.hf import export_pretrained, import_pretrained  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402
from tests.integrations.hf_helpers import (  # noqa: E402
    VOCAB,
    hf_greedy,
    hf_logits,
    make_run,
    ours_cached_logits,
    ours_logits,
    save_hf,
)

TOL = 1e-4
WINDOW, CONTEXT = 16, 64
CASES = {
    # name: (hf_config overrides, the run's sliding_window_layers)
    "mistral": (dict(sliding_window=WINDOW), None),
    # layer 0 full, layer 1 windowed: what max_window_layers = 1 gives (written out, as HF saves it)
    "qwen2": (
        dict(
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=1,
            layer_types=["full_attention", "sliding_attention"],
        ),
        [1],
    ),
}


def _check_against(hf, model, tokens):
    ref = hf_logits(hf, tokens)
    assert ref.std() > 0.3  # a non-degenerate model: the comparisons can fail
    assert (ours_logits(model, tokens) - ref).abs().max() < TOL
    assert (ours_cached_logits(model, tokens[:1], first=WINDOW + 3) - ref[:1]).abs().max() < TOL
    return ref


@pytest.mark.parametrize("kind", list(CASES))
def test_windowed_import_and_export_match_transformers(kind, tmp_path):
    overrides, layers = CASES[kind]
    hf = save_hf(kind, tmp_path / "hf", max_position_embeddings=CONTEXT, **overrides)
    run = load_run(import_pretrained(tmp_path / "hf", tmp_path / "run"))
    assert run.cfg.model.sliding_window == WINDOW and run.cfg.model.sliding_window_layers == layers
    assert run.cfg.model.train_length == CONTEXT  # imported at its full context, not cut to the window
    source = json.loads((tmp_path / "run" / "source.json").read_text())
    assert any(f"sliding window of {WINDOW} tokens" in note for note in source["notes"])
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, CONTEXT))
    ref = _check_against(hf, run.model, tokens)
    # the window matters: without it the logits past it are another model's (the 63 apart)
    for block in run.model.blocks:
        block.attn.window = None
    assert (ours_logits(run.model, tokens)[:, WINDOW + 1 :] - ref[:, WINDOW + 1 :]).abs().max() > 1e-2
    run = load_run(tmp_path / "run")
    prompt = tokens[0, : WINDOW + 10].tolist()  # greedy decoding with the cache, past the window
    assert list(generate_tokens(run.model, prompt, 30, temperature=0.0)) == hf_greedy(hf, prompt, 30)

    export_pretrained(tmp_path / "run", tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == kind and config["sliding_window"] == WINDOW
    assert config["max_position_embeddings"] == CONTEXT
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    assert (hf_logits(exported, tokens) - ref).abs().max() < TOL
    back = load_run(import_pretrained(tmp_path / "out", tmp_path / "back"))
    assert back.cfg.model.sliding_window == WINDOW and back.cfg.model.sliding_window_layers == layers
    assert (ours_logits(back.model, tokens) - ref).abs().max() < TOL


@pytest.mark.parametrize("max_window_layers", [2, 5])
def test_qwen2_whose_window_layers_cover_every_layer_is_full_attention(max_window_layers, tmp_path):
    """use_sliding_window with max_window_layers >= the layer count: no layer slides (once refused)."""
    hf = save_hf(
        "qwen2",
        tmp_path / "hf",
        max_position_embeddings=CONTEXT,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=max_window_layers,
    )
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["use_sliding_window"] and config["max_window_layers"] >= config["num_hidden_layers"]
    run = load_run(import_pretrained(tmp_path / "hf", tmp_path / "run"))
    assert run.cfg.model.sliding_window is None
    torch.manual_seed(1)
    _check_against(hf, run.model, torch.randint(0, VOCAB, (2, CONTEXT)))


@pytest.mark.parametrize(
    "options",
    [
        dict(flavour="llama", bias=True, sliding_window=WINDOW),  # Mistral has no biases
        dict(flavour="llama", sliding_window=WINDOW, sliding_window_layers=[0]),  # Mistral: every layer
    ],
    ids=["biases", "some layers"],
)
def test_a_window_no_architecture_holds_is_refused_on_export(options, tmp_path):
    make_run(tmp_path / "run", **options)
    with pytest.raises(UserError, match="Hugging Face's Llama has no sliding window"):
        export_pretrained(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()
