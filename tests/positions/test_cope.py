"""CoPE against Golovneva et al. 2024, §3, in loops; and its LogitBias path (attention/chunked.py)."""

import math

import pytest
import torch

from extrapos.attention import attention, attention_reference, bias_block
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, LogitBias
from extrapos.positions.registry import build_encoding
from tests.positions.encoding_checks import assert_causal, tiny_model

F64 = torch.float64
CTX = EncodingContext(d_model=16, n_heads=2, head_dim=4, n_layers=2, train_length=8)


def _enc(npos_max=4):
    torch.manual_seed(0)
    return build_encoding("cope", CTX, {"npos_max": npos_max, "init_std": 1.0}).double()


def expected_output(q, k, v, table):
    """softmax_j(q_i.k_j / sqrt(d) + q_i.e[p_ij]) v with p_ij = sum_{t=j..i} sigmoid(q_i.k_t / sqrt(d)),
    clamped to npos_max - 1, e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]; queries
    aligned to the end of the keys."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    npos = table.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                last = Tk - Tq + i  # the key index of query i
                a = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d) for j in range(last + 1)]
                logits = []
                for j in range(last + 1):
                    p = min(sum(1 / (1 + math.exp(-a[t])) for t in range(j, last + 1)), npos - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    e = (p - lo) * table[:, hi] + (1 - p + lo) * table[:, lo]
                    logits.append(a[j] + float(q[b, h, i] @ e))
                w = torch.softmax(torch.tensor(logits, dtype=F64), 0)
                out[b, h, i] = w @ v[b, h, : last + 1]
    return out


def _qkv(B=2, T=9, H=2, d=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, d, dtype=F64, generator=g) for _ in range(3)]


@pytest.mark.parametrize("npos_max", [4, 64])  # clamped (positions reach ~T/2 > 3) and not
@pytest.mark.parametrize("chunk", [None, 2, 4])
def test_attention_equals_the_definition(npos_max, chunk):
    enc = _enc(npos_max)
    q, k, v = _qkv()
    pos = torch.arange(9).expand(2, 9)
    bias = enc.bias(torch.zeros(2, 9, 16, dtype=F64), pos, 1, None)
    assert isinstance(bias, LogitBias)
    want = expected_output(q, k, v, enc.table[1].detach())
    torch.testing.assert_close(attention(q, k, v, bias, chunk_size=chunk), want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(attention_reference(q, k, v, bias), want, atol=1e-10, rtol=1e-10)
    assert not torch.allclose(attention(q, k, v), want, atol=1e-3)  # the table matters


def test_decode_shaped_queries_see_their_whole_row():
    enc = _enc()
    q, k, v = _qkv(T=10)
    bias = enc.bias(torch.zeros(2, 3, 16, dtype=F64), torch.arange(3).expand(2, 3), 0, None)
    keys = enc.bias(torch.zeros(2, 10, 16, dtype=F64), torch.arange(10).expand(2, 10), 0, None)
    dec = LogitBias(bias.q_feat, keys.k_feat, bias.fn)
    want = expected_output(q[:, :, -3:], k, v, enc.table[0].detach())
    torch.testing.assert_close(attention(q[:, :, -3:], k, v, dec), want, atol=1e-10, rtol=1e-10)


def test_checkpointed_chunks_give_the_reference_gradients():
    enc = _enc()
    q, k, v = (t.requires_grad_() for t in _qkv(T=11))
    x, pos = torch.zeros(2, 11, 16, dtype=F64), torch.arange(11).expand(2, 11)
    grads = []
    for run in (lambda b: attention(q, k, v, b, chunk_size=3), lambda b: attention_reference(q, k, v, b)):
        enc.zero_grad()
        run(enc.bias(x, pos, 1, None)).square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)] + [enc.table.grad.clone()])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert grads[0][3][1].abs().sum() > 0 and grads[0][3][0].abs().sum() == 0  # layer 1's table only


def test_the_logit_kind_cannot_be_materialized_without_logits():
    bias = _enc().bias(torch.zeros(1, 3, 16, dtype=F64), torch.arange(3)[None], 0, None)
    with pytest.raises(TypeError, match="logits"):
        bias_block(bias)


def test_default_init_is_zero_and_options_are_checked():
    assert build_encoding("cope", CTX).table.abs().max() == 0
    assert build_encoding("cope", CTX).table.shape == (2, 4, 64)
    with pytest.raises(UserError, match="npos_max"):
        build_encoding("cope", CTX, {"npos_max": 1})


def test_causal_ignores_positions_and_works_with_gqa():
    assert_causal(tiny_model("cope"))
    assert_causal(tiny_model("cope", n_kv_heads=2))
    model = tiny_model("cope")
    tokens = torch.randint(0, 50, (1, 8))
    with torch.no_grad():  # positions are never read: any positions give the same logits
        torch.testing.assert_close(
            model(tokens, torch.arange(8)[None] * 7 + 3), model(tokens, torch.arange(8)[None])
        )
