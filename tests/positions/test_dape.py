"""DAPE against Zheng et al. 2024, §3: logit = A + B + f([A, B]), f a per-pair MLP over the heads."""

import math

import pytest
import torch

from extrapos.attention import attention, attention_reference
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, LogitBias
from extrapos.positions.registry import build_encoding
from tests.positions.encoding_checks import assert_causal, tiny_model

F64 = torch.float64
H, D = 4, 8
CTX = EncodingContext(d_model=32, n_heads=H, head_dim=D, n_layers=2, train_length=16)


def _enc(**options):
    torch.manual_seed(0)
    enc = build_encoding("dape", CTX, options).double()
    with torch.no_grad():
        enc.base.r1.copy_(torch.tensor([[0.5, 1.0, 1.5, 2.0], [0.3, 0.6, 0.9, 1.2]]))
        enc.base.r2.copy_(torch.tensor([[0.1, 0.2, 0.4, 0.8], [0.05, 0.5, 1.0, 2.0]]))
    return enc


def expected_output(enc, layer, q, k, v, qpos, kpos):
    """Kerple-log B = -r1 log(1 + r2 |i - j|) and the MLP written out: W2 leaky_relu(W1 [A; B] + b1) + b2."""
    r1, r2 = enc.base.r1[layer].detach(), enc.base.r2[layer].detach()
    mlp = enc.mlps[layer]
    W1, b1, W2, b2 = (t.detach() for t in (mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias))
    A = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(D)
    dist = (qpos[:, None, :, None] - kpos[:, None, None, :]).abs().to(F64)
    Bias = -r1[None, :, None, None] * torch.log(1 + r2[None, :, None, None] * dist)
    u = torch.cat((A, Bias.expand_as(A)), dim=1)  # (B, 2H, i, j)
    z = torch.einsum("wc,bcij->bwij", W1, u) + b1[None, :, None, None]
    hidden = torch.where(z > 0, z, 0.01 * z)  # LeakyReLU, negative slope 0.01
    f = torch.einsum("hw,bwij->bhij", W2, hidden) + b2[None, :, None, None]
    logits = A + Bias + f
    Tq, Tk = q.shape[2], k.shape[2]
    future = torch.arange(Tk)[None, :] > torch.arange(Tq)[:, None] + (Tk - Tq)
    return torch.softmax(logits.masked_fill(future, -math.inf), -1) @ v


def _qkv(B=2, T=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, dtype=F64, generator=g) for _ in range(3)]


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("chunk", [None, 3])
def test_attention_equals_the_definition(layer, chunk):
    enc = _enc()
    q, k, v = _qkv()
    pos = torch.arange(10).expand(2, 10) + torch.tensor([[0], [5]])
    bias = enc.bias(torch.zeros(2, 10, 32, dtype=F64), pos, layer, None)
    assert isinstance(bias, LogitBias)
    want = expected_output(enc, layer, q, k, v, pos, pos)
    torch.testing.assert_close(attention(q, k, v, bias, chunk_size=chunk), want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(attention_reference(q, k, v, bias), want, atol=1e-10, rtol=1e-10)
    # the MLP matters: Kerple alone gives another output
    kerple = enc.base.bias(torch.zeros(2, 10, 32, dtype=F64), pos, layer, None)
    assert not torch.allclose(attention(q, k, v, kerple), want, atol=1e-4)


def test_decode_shaped_queries():
    enc = _enc()
    q, k, v = _qkv(T=9)
    pos = torch.arange(9).expand(2, 9)
    keys = enc.bias(torch.zeros(2, 9, 32, dtype=F64), pos, 0, None)
    new = enc.bias(torch.zeros(2, 2, 32, dtype=F64), pos[:, -2:], 0, None)
    out = attention(q[:, :, -2:], k, v, LogitBias(new.q_feat, keys.k_feat, new.fn))
    torch.testing.assert_close(out, expected_output(enc, 0, q[:, :, -2:], k, v, pos[:, -2:], pos))


@pytest.mark.parametrize("base", ["kerple-power", "t5", "fire"])
def test_other_bases_build_and_run(base):
    enc = build_encoding("dape", CTX, {"base": base, "mlp_width": 8})
    assert enc.mlps[0][0].out_features == 8 and enc.base.registry_name == base
    q, k, v = (torch.randn(1, H, 6, D) for _ in range(3))
    bias = enc.bias(torch.zeros(1, 6, 32), torch.arange(6)[None], 0, None)
    torch.testing.assert_close(attention(q, k, v, bias, chunk_size=2), attention_reference(q, k, v, bias))


def test_options_are_checked():
    with pytest.raises(UserError, match="base"):
        build_encoding("dape", CTX, {"base": "alibi"})
    with pytest.raises(UserError, match="mlp_width"):
        build_encoding("dape", CTX, {"mlp_width": 0})


def test_causal():
    assert_causal(tiny_model("dape"), positions=torch.arange(12).expand(2, 12) + 3)
