"""CABLE, CABLE-NW, K-CABLE and the authors' official variant against the CABLE paper §3 (eq. 2-7)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from extrapos.attention import attention, attention_reference, bias_block
from extrapos.errors import UserError
from extrapos.positions import EncodingContext, build_encoding
from extrapos.positions.base import FoldedBias, PairwiseBias
from extrapos.positions.cable import STATE_KEY

F64 = torch.float64
CTX = EncodingContext(d_model=16, n_heads=4, head_dim=4, n_layers=2, train_length=8)
NAMES = ["cable", "cable-nw", "k-cable", "cable-official"]


def _enc(name, seed=0):
    torch.manual_seed(seed)
    enc = build_encoding(name, CTX).double()
    with torch.no_grad():  # larger weights than the 0.02 init so that f, g vary visibly
        for p in enc.parameters():
            p.normal_(0, 0.5)
    return enc


def _x(B=2, T=11, seed=1):
    return torch.randn(B, T, CTX.d_model, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _positions(B, T):
    return torch.arange(T).expand(B, T) + 100  # CABLE ignores positions; any will do


def _expected(enc, x, layer):
    """B_ij = -g_i (S_i - S_j) straight from eq. 2-7 (all pairs; only j <= i is used)."""
    o = enc.options
    if o.variant == "official":
        b = torch.cumsum(-F.softplus(enc.w[layer](x)), dim=1).transpose(1, 2)  # the authors' b
        return b.unsqueeze(-1) - b.unsqueeze(-2)
    f = torch.relu(x @ enc.w_c[layer].weight.T)  # (B, T, H)
    S = torch.tril(torch.ones(x.shape[1], x.shape[1], dtype=F64)) @ f  # S = L f (eq. 3-4)
    g = F.softplus(x @ enc.w_s[layer].weight.T) if o.weighted else torch.ones_like(S)
    S, g = S.transpose(1, 2), g.transpose(1, 2)
    rel = g.unsqueeze(-1) * (S.unsqueeze(-1) - S.unsqueeze(-2))
    return -torch.log1p(rel**2) if o.kernel else -rel


def _tril(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def _assert_equal_up_to_row_constants(got, want, mask):
    got = got - got.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
    want = want - want.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
    torch.testing.assert_close(got.masked_fill(~mask, 0), want.masked_fill(~mask, 0))


@pytest.mark.parametrize("name", NAMES)
def test_bias_matches_formula(name):
    enc, x = _enc(name), _x()
    T = x.shape[1]
    for layer in range(CTX.n_layers):
        bias = enc.bias(x, _positions(2, T), layer, None)
        got, want = bias_block(bias), _expected(enc, x, layer)
        if name == "k-cable":  # not foldable: the bias itself, exactly
            assert isinstance(bias, PairwiseBias)
            torch.testing.assert_close(got.masked_fill(~_tril(T), 0), want.masked_fill(~_tril(T), 0))
        else:  # folded: equal up to the dropped row constant -g_i S_i
            assert isinstance(bias, FoldedBias) and bias.q_feat.shape == bias.k_feat.shape == (2, 4, T)
            _assert_equal_up_to_row_constants(got, want, _tril(T))
            assert (want.masked_fill(~_tril(T), 0) <= 1e-12).all()  # a penalty, never a reward


def test_structure_and_options():
    cable, nw, k, off = (build_encoding(n, CTX) for n in NAMES)
    assert cable.options.weighted and not nw.options.weighted and k.options.kernel
    assert off.options.variant == "official"
    for enc in (cable, nw, k):  # per layer, no bias term (theta = {w_c}, {w_s})
        assert len(enc.w_c) == CTX.n_layers and enc.w_c[0].bias is None
    assert len(cable.w_s) == CTX.n_layers and not hasattr(nw, "w_s")
    assert len(off.w) == CTX.n_layers and off.w[0].bias is not None and not hasattr(off, "w_c")
    assert not torch.equal(cable.w_c[0].weight, cable.w_c[1].weight)
    assert abs(cable.w_c[0].weight.std().item() - 0.02) < 0.01  # N(0, 0.02) init
    for enc in (cable, nw, k, off):
        assert enc.family == "cable" and enc.paper
    with pytest.raises(UserError):
        build_encoding("cable", CTX, {"variant": "official"})  # official has no g
    with pytest.raises(UserError):
        build_encoding("cable", CTX, {"variant": "other"})


def test_nw_is_cable_with_unit_weights():
    nw, x = _enc("cable-nw"), _x()
    bias = nw.bias(x, _positions(2, 11), 0, None)
    torch.testing.assert_close(bias.q_feat, torch.ones_like(bias.q_feat))


@pytest.mark.parametrize("name", NAMES)
def test_cached_running_sum_over_calls_equals_one_call(name):
    enc, x = _enc(name), _x(T=12)
    layer = 1
    full = enc.bias(x, _positions(2, 12), layer, None)
    state: dict = {}
    parts = [
        enc.bias(x[:, a:b], _positions(2, 12)[:, a:b], layer, state) for a, b in [(0, 7), (7, 8), (8, 12)]
    ]
    assert state[STATE_KEY].shape == (2, CTX.n_heads)
    torch.testing.assert_close(torch.cat([p.k_feat for p in parts], 2), full.k_feat)
    torch.testing.assert_close(torch.cat([p.q_feat for p in parts], 2), full.q_feat)
    torch.testing.assert_close(state[STATE_KEY], full.k_feat[:, :, -1].reshape(2, -1))
    # the decode step's attention (new queries vs all cached keys) equals the full forward's rows
    B, H, Dh = 2, CTX.n_heads, CTX.head_dim
    q, k, v = (torch.randn(B, H, 12, Dh, dtype=F64) for _ in range(3))
    last = parts[-1]
    dec = type(last)(last.q_feat, full.k_feat, *([last.fn] if isinstance(last, PairwiseBias) else []))
    torch.testing.assert_close(
        attention(q[:, :, 8:], k, v, dec), attention_reference(q, k, v, full)[:, :, 8:]
    )


def test_no_state_starts_from_zero():
    enc, x = _enc("cable"), _x(T=5)
    a = enc.bias(x, _positions(2, 5), 0, None)
    b = enc.bias(x, _positions(2, 5), 0, {})
    torch.testing.assert_close(a.k_feat, b.k_feat)


@pytest.mark.parametrize("name", NAMES)
def test_fast_path_equals_reference(name):
    enc, x = _enc(name), _x(T=19)
    B, H, T, Dh = 2, CTX.n_heads, 19, CTX.head_dim
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3))
    bias = enc.bias(x, _positions(B, T), 0, None)
    torch.testing.assert_close(attention(q, k, v, bias, chunk_size=6), attention_reference(q, k, v, bias))


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter(name):
    enc, x = _enc(name), _x(T=9)
    B, H, T, Dh = 2, CTX.n_heads, 9, CTX.head_dim
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3))
    for layer in range(CTX.n_layers):
        q2, k2 = enc.rotate(q, k, _positions(B, T))
        attention(q2, k2, v, enc.bias(x, _positions(B, T), layer, None)).square().sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


def test_official_variant_replicates_unscaled_logits():
    """The authors compute softmax(q.k + b_i - b_j) v with no 1/sqrt(d_h): the rotate hook's q scaling
    makes our attention (which divides by sqrt(d_h)) produce exactly that."""
    enc, x = _enc("cable-official"), _x(T=10)
    B, H, T, Dh = 2, CTX.n_heads, 10, CTX.head_dim
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3))
    q2, k2 = enc.rotate(q, k, _positions(B, T))
    torch.testing.assert_close(q2, q * math.sqrt(Dh))
    assert k2 is k
    out = attention(q2, k2, v, enc.bias(x, _positions(B, T), 0, None))
    logits = q @ k.transpose(-1, -2) + _expected(enc, x, 0)
    want = torch.softmax(logits.masked_fill(~_tril(T), float("-inf")), -1) @ v
    torch.testing.assert_close(out, want)
    # paper variants leave q and k alone; the scaling bug can be switched off
    assert build_encoding("cable", CTX).rotate(q, k, None)[0] is q
    fixed = build_encoding("cable-official", CTX, {"unscaled_logits": False})
    assert fixed.rotate(q, k, None)[0] is q


def test_bf16_autocast_keeps_fp32_features():
    enc, x = build_encoding("cable", CTX), _x(T=300).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bias = enc.bias(x, _positions(2, 300), 0, None)
    assert bias.k_feat.dtype == torch.float32 and bias.q_feat.dtype == torch.float32


def test_k_cable_block_backward_equals_autograd_of_the_formula():
    """K-CABLE's hand-written backward (no stored block) against autograd of the plain expression, fp64,
    per-head features and features broadcast over heads, plus gradcheck."""
    from extrapos.positions.cable import k_cable_fn

    g = torch.Generator().manual_seed(0)
    for hq, hk in ((3, 3), (3, 1)):
        qf = torch.rand(2, hq, 5, 2, generator=g, dtype=torch.float64).mul(2).requires_grad_(True)
        kf = torch.rand(2, hk, 7, 1, generator=g, dtype=torch.float64).mul(3).requires_grad_(True)
        plain = -torch.log1p((qf[..., :1] * (qf[..., 1:] - kf.transpose(-1, -2))) ** 2)
        out = k_cable_fn(qf, kf)
        torch.testing.assert_close(out, plain, rtol=0, atol=0)
        w = torch.randn(plain.shape, generator=g, dtype=torch.float64)
        for a, b in zip(
            torch.autograd.grad((out * w).sum(), (qf, kf)), torch.autograd.grad((plain * w).sum(), (qf, kf))
        ):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(k_cable_fn, (qf, kf))
