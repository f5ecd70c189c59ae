"""Forgetting attention against Lin et al. 2025, §2: D_ij = sum_{l=j+1..i} log sigmoid(w^T x_l + b)."""

import math

import pytest
import torch

from extrapos.attention import attention
from extrapos.positions.base import EncodingContext, FoldedBias
from extrapos.positions.fox import STATE_KEY
from extrapos.positions.registry import build_encoding
from tests.positions.encoding_checks import assert_causal, tiny_model

F64 = torch.float64
CTX = EncodingContext(d_model=16, n_heads=4, head_dim=8, n_layers=2, train_length=8)


def _enc(**options):
    torch.manual_seed(0)
    enc = build_encoding("fox", CTX, options).double()
    with torch.no_grad():  # gates away from the 0.02 init so that they differ per token
        for p in enc.parameters():
            p.normal_(0, 0.7)
    return enc


def _expected_bias(enc, x, layer):
    """D (B, H, T, T) by the definition, with explicit loops and math.log / math.exp."""
    w, b = enc.gates[layer].weight.detach(), enc.gates[layer].bias.detach()
    B, T, _ = x.shape
    H = w.shape[0]
    D = torch.zeros(B, H, T, T, dtype=F64)
    for bb in range(B):
        for h in range(H):
            logf = [math.log(1 / (1 + math.exp(-(float(w[h] @ x[bb, t]) + float(b[h]))))) for t in range(T)]
            for i in range(T):
                for j in range(i + 1):
                    D[bb, h, i, j] = sum(logf[j + 1 : i + 1])
    return D


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_with_the_folded_bias_equals_the_definition(layer):
    enc = _enc()
    B, T, H, Dh = 2, 9, 4, 8
    x = torch.randn(B, T, CTX.d_model, dtype=F64)
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3))
    bias = enc.bias(x, torch.arange(T).expand(B, T), layer, None)
    assert isinstance(bias, FoldedBias)
    scores = q @ k.transpose(-1, -2) / math.sqrt(Dh) + _expected_bias(enc, x, layer)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    want = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(attention(q, k, v, bias), want, atol=1e-10, rtol=1e-10)
    # the bias really matters: without it the output differs
    assert not torch.allclose(attention(q, k, v), want, atol=1e-3)


def test_bias_init_sets_the_initial_forget_gate():
    enc = build_encoding("fox", CTX, {"bias_init": 3.0})
    assert torch.equal(enc.gates[1].bias.detach(), torch.full((4,), 3.0))
    logf = enc.log_gates(torch.zeros(1, 2, CTX.d_model), 0)
    torch.testing.assert_close(logf, torch.full_like(logf, math.log(1 / (1 + math.exp(-3.0)))))


def test_cache_state_continues_the_running_sum():
    enc = _enc()
    x = torch.randn(1, 10, CTX.d_model, dtype=F64)
    pos = torch.arange(10)[None]
    full = enc.bias(x, pos, 1, None)
    state = {}
    a = enc.bias(x[:, :6], pos[:, :6], 1, state)
    b = enc.bias(x[:, 6:], pos[:, 6:], 1, state)
    torch.testing.assert_close(torch.cat((a.k_feat, b.k_feat), -1), full.k_feat)
    torch.testing.assert_close(state[STATE_KEY], -full.k_feat[..., -1])


def test_causal_and_shift_invariant():
    model = tiny_model("fox")
    assert_causal(model)
    tokens = torch.randint(0, 50, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(
            model(tokens, torch.arange(8)[None] + 999), model(tokens, torch.arange(8)[None])
        )
