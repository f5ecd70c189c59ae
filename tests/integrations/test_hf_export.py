"""Export extrapos runs to Hugging Face and compare with transformers; encodings HF lacks are refused."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from extrapos.bench.peers import hf_cache_name  # noqa: E402
from extrapos.errors import UserError  # noqa: E402
from extrapos.inference.generate import generate_tokens  # noqa: E402
from extrapos.integrations.hf import export_pretrained, import_pretrained  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402
from tests.integrations.hf_helpers import (  # noqa: E402
    CONTEXT,
    VOCAB,
    hf_greedy,
    hf_logits,
    make_run,
    ours_cached_logits,
    ours_logits,
)

TOL = 1e-4
L = 4 * CONTEXT
LONGROPE = {
    "scaling": "longrope",
    "factor": 4.0,
    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 9.0, 12.0],
    "short_factor": [1.0, 1.0, 1.1, 1.2, 1.2, 1.3, 1.5, 1.5],
}
CASES = {
    # name: (model options, architecture, whether a KV cache gives the same logits as one forward)
    "learned-gpt2": (dict(positions={"name": "learned", "max_length": L}), "gpt2", True),
    "rope-gpt2-flavour": (dict(), "gpt_neox", True),  # the library default (cpu/tiny's block)
    "rope-partial-parallel-untied": (
        dict(
            positions={"name": "rope", "rotary_fraction": 0.5},
            parallel_residual=True,
            activation="gelu",
            tie_embeddings=False,
        ),
        "gpt_neox",
        True,
    ),
    "rope-llama-gqa": (dict(flavour="llama", n_kv_heads=2, tie_embeddings=False), "llama", True),
    "rope-qkv-bias-qwen2": (dict(flavour="llama", qkv_bias=True), "qwen2", True),
    "rope-llama-biases": (dict(flavour="llama", bias=True), "llama", True),
    "rope-linear": (
        dict(flavour="llama", positions={"name": "rope", "scaling": "linear", "factor": 4.0}),
        "llama",
        True,
    ),
    "rope-ntk": (
        dict(flavour="llama", positions={"name": "rope", "scaling": "ntk", "factor": 4.0}),
        "llama",
        True,
    ),
    "rope-yarn": (
        dict(flavour="llama", positions={"name": "rope", "scaling": "yarn", "factor": 4.0}),
        "llama",
        True,
    ),
    "rope-llama3": (
        dict(
            flavour="llama",
            positions={"name": "rope", "scaling": "llama3", "factor": 4.0, "original_length": 16},
        ),
        "llama",
        True,
    ),
    # dynamic NTK and LongRoPE pick frequencies per call: cached keys keep theirs, in HF as here
    "rope-dynamic": (
        dict(flavour="llama", positions={"name": "rope", "scaling": "dynamic", "factor": 2.0}),
        "llama",
        False,
    ),
    "rope-longrope": (dict(flavour="llama", positions={"name": "rope", **LONGROPE}), "llama", False),
    "alibi-bloom": (dict(positions={"name": "alibi"}, embed_norm=True, n_heads=8, d_model=64), "bloom", True),
}


def _hf_cached(model, tokens, first):
    name = hf_cache_name(model)  # transformers 5.24 renamed past_key_values to cache
    with torch.no_grad():
        out = model(tokens[:, :first], use_cache=True)
        logits, past = [out.logits], getattr(out, name)
        for s in range(first, tokens.shape[1]):
            out = model(tokens[:, s : s + 1], use_cache=True, **{name: past})
            logits.append(out.logits)
            past = getattr(out, name)
    return torch.cat(logits, dim=1)


FAST = ("learned-gpt2", "rope-llama-gqa")  # the rest: pytest -m slow


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_export_matches(case, tmp_path):
    options, arch, cache_exact = CASES[case]
    run = load_run(make_run(tmp_path / "run", **options))
    export_pretrained(tmp_path / "run", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "hf", attn_implementation="eager"
    ).eval()
    assert hf.config.model_type == arch
    torch.manual_seed(2)
    tokens = torch.randint(0, VOCAB, (2, L))
    ref = hf_logits(hf, tokens)
    assert ref.std() > 0.3
    assert (ours_logits(run.model, tokens) - ref).abs().max() < TOL
    ours_cached = ours_cached_logits(run.model, tokens[:1], first=CONTEXT // 2)
    if cache_exact:
        assert (ours_cached - ref[:1]).abs().max() < TOL
    else:  # both libraries keep the keys' frequencies: compare cached decoding with cached decoding
        first = CONTEXT // 2
        ours_steps = ours_cached_logits(run.model, tokens[:1], first=first, chunk=1)
        assert (ours_steps - _hf_cached(hf, tokens[:1], first)).abs().max() < TOL
    prompt = tokens[0, : CONTEXT + 10].tolist()  # greedy decoding past the training length
    n = 30
    assert list(generate_tokens(run.model, prompt, n, temperature=0.0)) == hf_greedy(hf, prompt, n)
    # and back: importing the export gives the run's logits again
    back = load_run(import_pretrained(tmp_path / "hf", tmp_path / "back"))
    assert (ours_logits(back.model, tokens) - ours_logits(run.model, tokens)).abs().max() < TOL


@pytest.mark.parametrize(
    "positions,match",
    [
        ({"name": "expe"}, "'expe' has no Hugging Face architecture"),
        ({"name": "cable"}, "'cable' has no Hugging Face architecture"),
        ({"name": "kerple-log"}, "'kerple-log' has no Hugging Face architecture"),
        ({"name": "fire"}, "'fire' has no Hugging Face architecture"),
        ({"name": "sinusoidal"}, "'sinusoidal' has no Hugging Face architecture"),
        ({"name": "alibi"}, "Bloom normalises the embeddings"),
        ({"name": "learned", "interpolate_to": 64}, "without interpolation"),
    ],
)
def test_export_refuses_with_a_reason(positions, match, tmp_path):
    make_run(tmp_path / "run", positions=positions)
    with pytest.raises(UserError, match=match):
        export_pretrained(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_refuses_partial_rotary_llama(tmp_path):
    make_run(tmp_path / "run", flavour="llama", positions={"name": "rope", "rotary_fraction": 0.5})
    with pytest.raises(UserError, match="Llama rotates whole heads"):
        export_pretrained(tmp_path / "run", tmp_path / "hf")
