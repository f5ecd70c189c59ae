"""RoPE scalings against transformers' ROPE_INIT_FUNCTIONS (inverse frequencies and attention factor)."""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from extrapos.errors import UserError  # noqa: E402
from extrapos.integrations.hf import rope_options_from_hf  # noqa: E402
from extrapos.positions.base import EncodingContext  # noqa: E402
from extrapos.positions.bias import alibi_slopes  # noqa: E402
from extrapos.positions.registry import build_encoding  # noqa: E402


def _hf_config(head_dim, max_pos, params):
    return transformers.LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=dict(params),
    )


def _ours(head_dim, max_pos, params):
    hf = {"max_position_embeddings": max_pos, "rope_parameters": dict(params)}
    options = rope_options_from_hf(hf, head_dim)
    ctx = EncodingContext(
        d_model=4 * head_dim, n_heads=4, head_dim=head_dim, n_layers=1, train_length=max_pos
    )
    return build_encoding("rope", ctx, {k: v for k, v in options.items() if k != "name"})


def _compare(head_dim, max_pos, params, seq_len=None):
    rope = _ours(head_dim, max_pos, params)
    inv, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](
        _hf_config(head_dim, max_pos, params), "cpu", seq_len
    )
    ours = rope.inverse_frequencies(seq_len).float() if seq_len else rope.inv_freq.float()
    assert ours.shape == inv.shape
    torch.testing.assert_close(ours, inv.float(), rtol=2e-6, atol=0)
    assert rope.attention_factor == pytest.approx(factor, rel=1e-9)
    return rope


LLAMA3 = [  # Llama 3.1 8B's values, a Llama 3.2 1B-like factor 32, and a small original context
    (
        128,
        131072,
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    (
        64,
        131072,
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    (
        16,
        256,
        {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 64,
        },
    ),
]


@pytest.mark.parametrize("head_dim,max_pos,params", LLAMA3)
def test_llama3_matches_transformers(head_dim, max_pos, params):
    rope = _compare(head_dim, max_pos, params)
    # the three regimes all occur: kept, divided by the factor, and blended
    plain = 1 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ratio = plain / rope.inv_freq
    assert (ratio == 1).any() and torch.isclose(
        ratio, torch.tensor(params["factor"], dtype=torch.float64)
    ).any()
    assert ((ratio > 1.001) & (ratio < params["factor"] - 1e-3)).any()


def _longrope(head_dim, max_pos, original, seed, **extra):
    g = torch.Generator().manual_seed(seed)
    n = head_dim // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": original,
        "long_factor": (1 + 30 * torch.rand(n, generator=g)).tolist(),
        "short_factor": (1 + 0.2 * torch.rand(n, generator=g)).tolist(),
        **extra,
    }


# Phi-3-mini-128k-like (factor from the context ratio), an explicit factor, an explicit attention factor
LONGROPE = [
    (96, 131072, _longrope(96, 131072, 4096, 0)),
    (32, 512, _longrope(32, 512, 128, 1, factor=8.0)),
    (32, 512, _longrope(32, 512, 128, 2, factor=4.0, attention_factor=1.3)),
]


@pytest.mark.parametrize("head_dim,max_pos,params", LONGROPE)
def test_longrope_matches_transformers(head_dim, max_pos, params):
    original = params["original_max_position_embeddings"]
    for seq_len in (None, original, original + 1, 4 * original):  # short factors up to L, long past it
        _compare(head_dim, max_pos, params, seq_len)
    rope = _ours(head_dim, max_pos, params)
    if "factor" not in params:
        assert rope.attention_factor == pytest.approx(
            math.sqrt(1 + math.log(max_pos / original) / math.log(original))
        )


OTHERS = [
    (64, 4096, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    (
        64,
        4096,
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 4096},
    ),
    (
        128,
        32768,
        {
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 4.0,
            "beta_fast": 16.0,
            "original_max_position_embeddings": 32768,
        },
    ),
    (
        64,
        4096,
        {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
    ),
]


@pytest.mark.parametrize("head_dim,max_pos,params", OTHERS)
def test_other_scalings_match_transformers(head_dim, max_pos, params):
    _compare(head_dim, max_pos, params)


def test_dynamic_matches_transformers_at_every_length():
    params = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    for seq_len in (100, 512, 513, 2048):
        _compare(64, 512, params, seq_len)


def test_longrope_needs_one_factor_per_frequency():
    ctx = EncodingContext(d_model=64, n_heads=4, head_dim=16, n_layers=1, train_length=32)
    with pytest.raises(UserError, match="8 positive numbers"):
        build_encoding(
            "rope", ctx, {"scaling": "longrope", "long_factor": [1.0] * 7, "short_factor": [1.0] * 8}
        )


def test_alibi_slopes_match_bloom_for_every_head_count():
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    for n in range(1, 49):
        torch.testing.assert_close(
            torch.tensor(alibi_slopes(n), dtype=torch.float32), _get_alibi_slopes(n, "cpu")
        )
