"""Import tiny random Hugging Face models and compare with transformers: logits, KV cache, greedy decoding."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from extrapos.errors import UserError
from extrapos.integrations.hf import import_pretrained
from extrapos.run.directory import load_run
from tests.integrations.hf_helpers import (
    CONTEXT,
    VOCAB,
    hf_greedy,
    hf_logits,
    ours_cached_logits,
    ours_logits,
    save_hf,
)

TOL = 1e-4
# gpt2 and llama run by default; the others are slow (seconds each on 2 shared cores): pytest -m slow
KINDS = ["gpt2", "llama"] + [
    pytest.param(k, marks=pytest.mark.slow) for k in ("gpt_neox", "bloom", "mistral", "qwen2")
]


def _imported(kind, tmp_path, **overrides):
    hf = save_hf(kind, tmp_path / "hf", **overrides)
    run = load_run(import_pretrained(tmp_path / "hf", tmp_path / "run"))
    return hf, run


@pytest.mark.parametrize("kind", KINDS)
def test_import_matches_transformers(kind, tmp_path):
    hf, run = _imported(kind, tmp_path)
    # GPT-2's learned table has n_positions rows: transformers cannot go past them, so neither do we
    length = CONTEXT if kind == "gpt2" else 4 * CONTEXT
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, length))
    ref = hf_logits(hf, tokens)
    assert ref.std() > 0.3  # a non-degenerate model: the comparison below can fail
    full = ours_logits(run.model, tokens)
    assert (full - ref).abs().max() < TOL
    cached = ours_cached_logits(run.model, tokens[:1], first=CONTEXT // 3)
    assert (cached - ref[:1]).abs().max() < TOL
    # greedy decoding from a prompt longer than the context (GPT-2: within its table)
    prompt = tokens[0, : 10 if kind == "gpt2" else CONTEXT + 10].tolist()
    n = CONTEXT - len(prompt) if kind == "gpt2" else 30
    from extrapos.inference.generate import generate_tokens

    ours = list(generate_tokens(run.model, prompt, n, temperature=0.0))
    assert ours == hf_greedy(hf, prompt, n)
    source = json.loads((tmp_path / "run" / "source.json").read_text())
    assert source["architecture"] == kind and source["context_length"] == CONTEXT
    assert run.cfg.model.train_length == CONTEXT
    assert run.tokenizer.vocab_size == 300


def test_wrong_rope_base_is_detected(tmp_path):
    """Negative control: the same comparison catches a wrong positional option."""
    hf, run = _imported("llama", tmp_path)
    tokens = torch.randint(0, VOCAB, (1, 2 * CONTEXT))
    run.model.pos.set_options(base=20000.0)
    assert (ours_logits(run.model, tokens) - hf_logits(hf, tokens)).abs().max() > 1e-2


@pytest.mark.slow
def test_llama3_scaled_llama(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    }
    hf, run = _imported("llama", tmp_path, rope_parameters=rope)
    assert run.cfg.model.positions["scaling"] == "llama3"
    tokens = torch.randint(0, VOCAB, (1, 4 * CONTEXT))
    ref = hf_logits(hf, tokens)
    assert (ours_logits(run.model, tokens) - ref).abs().max() < TOL
    assert (ours_cached_logits(run.model, tokens, first=20) - ref).abs().max() < TOL


@pytest.mark.slow
def test_sharded_checkpoint(tmp_path):
    """Weights split over several shards with model.safetensors.index.json."""
    import transformers as T

    from tests.integrations.hf_helpers import hf_config, write_tokenizer

    torch.manual_seed(0)
    hf = T.AutoModelForCausalLM.from_config(hf_config("llama")).eval()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    write_tokenizer(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 1
    run = load_run(import_pretrained(tmp_path / "hf", tmp_path / "run"))
    tokens = torch.randint(0, VOCAB, (1, 2 * CONTEXT))
    assert (ours_logits(run.model, tokens) - hf_logits(hf, tokens)).abs().max() < TOL


def test_user_errors_leave_nothing_behind(tmp_path):
    with pytest.raises(UserError, match="not a model directory"):
        import_pretrained(tmp_path / "missing", tmp_path / "run")
    save_hf("gpt2", tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="no tokenizer"):
        import_pretrained(tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "model_type": "t5"}))
    with pytest.raises(UserError, match="model_type 't5' is not supported"):
        import_pretrained(tmp_path / "hf", tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="already exists"):
        import_pretrained(tmp_path / "hf", tmp_path / "run", tokenizer=tmp_path / "run")
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"


def test_smollm3_nope_layers_become_a_layer_schedule(tmp_path):
    """SmolLM3's no_rope_layers = [1, 0, 1, 0]: RoPE on layers 0 and 2, NoPE on 1 and 3, as transformers."""
    hf, run = _imported("smollm3", tmp_path)
    assert hf.config.no_rope_layers == [1, 0, 1, 0]
    positions = run.cfg.model.positions
    assert positions["name"] == "rope" and positions["layers"] == [0, 2] and "others" not in positions
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 4 * CONTEXT))
    ref = hf_logits(hf, tokens)
    assert ref.std() > 0.3
    assert (ours_logits(run.model, tokens) - ref).abs().max() < TOL
    assert (ours_cached_logits(run.model, tokens[:1], first=CONTEXT // 3) - ref[:1]).abs().max() < TOL
