"""Every fast path of ``attention`` equals the materialized ``attention_reference``.

Forward and gradients (q, k, v, bias features, bias parameters), for full forwards (Tq == Tk),
decoding with a cache (Tq < Tk, including Tq == 1) and grouped-query attention (H_kv < H).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import extrapos.attention as attn_mod
import extrapos.attention.chunked as chunked_mod
import extrapos.attention.dispatch as dispatch_mod
import extrapos.attention.flex as flex_mod
from extrapos.attention import (
    attention,
    attention_reference,
    chunked_attention,
    default_chunk_size,
    folded_attention,
)
from extrapos.positions.base import FoldedBias, PairwiseBias

F64 = torch.float64

# (B, H, H_kv, Tq, Tk, d_h)
SHAPES = {
    "full": (2, 4, 4, 23, 23, 8),
    "decode": (2, 4, 4, 5, 23, 8),
    "decode1": (1, 4, 4, 1, 23, 8),
    "gqa": (2, 4, 2, 23, 23, 12),
    "gqa-decode": (1, 6, 2, 7, 30, 16),
    "gqa-decode1": (2, 6, 2, 1, 30, 16),
}


def _qkv(B, H, Hkv, Tq, Tk, Dh, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, Dh, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Tk, Dh, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Tk, Dh, generator=g, dtype=dtype)
    return q, k, v


def _positions(B, Tq, Tk, dtype=F64, seed=1):
    """Sorted, non-contiguous positions: the query positions are the last Tq key positions."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.sort(torch.randperm(4 * Tk, generator=g)[:Tk])[0].to(dtype)
    pos = pos.expand(B, Tk)
    return pos[:, Tk - Tq :], pos


def _folded(B, H, Tq, Tk, seed=2):
    """A CABLE-like folded bias: g_i > 0 per query, S_j increasing per key (both learnable leaves)."""
    g = torch.Generator().manual_seed(seed)
    qf = torch.rand(B, H, Tq, generator=g, dtype=F64) + 0.1
    kf = torch.cumsum(torch.rand(B, H, Tk, generator=g, dtype=F64), -1) * 3
    return FoldedBias(q_feat=qf, k_feat=kf)


def _pairwise(B, H, Tq, Tk):
    """A Kerple-like pairwise bias with learnable per-head parameters."""
    r1 = torch.linspace(0.3, 1.5, H, dtype=F64)[:, None, None].clone()
    r2 = torch.linspace(0.2, 0.9, H, dtype=F64)[:, None, None].clone()
    qpos, kpos = _positions(B, Tq, Tk)

    def fn(qf, kf):
        return -r1 * torch.log1p(r2 * (qf - kf.transpose(-1, -2)).abs())

    return PairwiseBias(q_feat=qpos[:, None, :, None], k_feat=kpos[:, None, :, None], fn=fn), (r1, r2)


def _pairwise_per_head(B, H, Tq, Tk, seed=3):
    """A K-CABLE-like pairwise bias whose features are per head (F = 2 for queries, 1 for keys)."""
    g = torch.Generator().manual_seed(seed)
    S = torch.cumsum(torch.rand(B, H, Tk, generator=g, dtype=F64), -1)
    w = torch.rand(B, H, Tq, generator=g, dtype=F64) + 0.2

    def fn(qf, kf):
        return -torch.log1p((qf[..., :1] * (qf[..., 1:] - kf.transpose(-1, -2))) ** 2)

    bias = PairwiseBias(q_feat=torch.stack((w, S[..., Tk - Tq :]), -1), k_feat=S.unsqueeze(-1), fn=fn)
    return bias, (bias.q_feat, bias.k_feat)


def _check(fast, bias_kind, shape, **kwargs):
    B, H, Hkv, Tq, Tk, Dh = SHAPES[shape]
    q, k, v = _qkv(B, H, Hkv, Tq, Tk, Dh)
    params = ()
    if bias_kind == "none":
        bias = None
    elif bias_kind == "folded":
        bias = _folded(B, H, Tq, Tk)
        params = (bias.q_feat, bias.k_feat)
    elif bias_kind == "pairwise":
        bias, params = _pairwise(B, H, Tq, Tk)
    else:
        bias, params = _pairwise_per_head(B, H, Tq, Tk)
    leaves = [q, k, v, *params]
    for t in leaves:
        t.requires_grad_(True)
    out_ref = attention_reference(q, k, v, bias)
    grads_ref = torch.autograd.grad((out_ref * out_ref.detach().cos()).sum(), leaves, allow_unused=True)
    out = fast(q, k, v, bias, **kwargs)
    grads = torch.autograd.grad((out * out_ref.detach().cos()).sum(), leaves, allow_unused=True)
    assert out.shape == out_ref.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, out_ref, rtol=1e-9, atol=1e-9)
    for g, g_ref in zip(grads, grads_ref):
        assert g is not None and g_ref is not None
        torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("bias_kind", ["none", "folded", "pairwise", "pairwise-per-head"])
def test_dispatch_equals_reference(bias_kind, shape):
    _check(attention, bias_kind, shape)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("bias_kind", ["pairwise", "pairwise-per-head"])
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_chunked_equals_reference(bias_kind, shape, chunk):
    """Several query chunks (checkpointed, since autograd is on) equal one materialized block."""
    _check(chunked_attention, bias_kind, shape, chunk_size=chunk)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("block", [1, 4, 16])
def test_folded_in_query_blocks_equals_reference(shape, block):
    """Long forwards fold block by block, each block with its own k_feat shift."""
    _check(folded_attention, "folded", shape, block=block)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_folded_without_reference_shift_equals_reference(shape):
    _check(folded_attention, "folded", shape, subtract_reference=False)


def test_folded_head_dims_are_padded_to_multiple_of_8():
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1], kw.get("scale")))
        return real(q, k, v, **kw)

    q, k, v = _qkv(1, 2, 2, 9, 9, 16)
    try:
        torch.nn.functional.scaled_dot_product_attention = spy
        attention(q, k, v, _folded(1, 2, 9, 9))
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    assert seen == [(24, 24, 24, 1 / math.sqrt(16))]


def _check_no_grad(fast, bias_kind, shape, **kwargs):
    B, H, Hkv, Tq, Tk, Dh = SHAPES[shape]
    q, k, v = _qkv(B, H, Hkv, Tq, Tk, Dh)
    bias = _folded(B, H, Tq, Tk) if bias_kind == "folded" else _pairwise(B, H, Tq, Tk)[0]
    if bias_kind == "pairwise-per-head":
        bias = _pairwise_per_head(B, H, Tq, Tk)[0]
    ref = attention_reference(q, k, v, bias)
    with torch.no_grad():
        out = fast(q, k, v, bias, **kwargs)
    assert out.shape == ref.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("block", [None, 1, 4, 16])
def test_folded_inference_equals_reference(shape, block):
    """Without autograd the fold builds q', k', v' once and rewrites k''s feature column per block of
    queries (its own shift), under views of one float mask; a few queries (decoding) pass the bias rows
    as SDPA's float mask instead: each equals the reference."""
    _check_no_grad(folded_attention, "folded", shape, block=block)
    _check_no_grad(attention, "folded", shape)


@pytest.mark.parametrize("shape", ["decode", "decode1", "gqa-decode", "gqa-decode1"])
@pytest.mark.parametrize("bias_kind", ["pairwise", "pairwise-per-head"])
def test_pairwise_decoding_rows_equal_reference(bias_kind, shape):
    """At most DECODE_QUERIES queries without autograd: the bias on their rows, the fused kernel's mask."""
    _check_no_grad(attention, bias_kind, shape)
    _check_no_grad(chunked_attention, bias_kind, shape, chunk_size=2)  # the chunked path, for contrast


def _sdpa_calls(fn) -> list[tuple]:
    """(q, k, v head dims, mask dtype or None) of every SDPA call ``fn`` makes."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        mask = kw.get("attn_mask")
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1], None if mask is None else mask.dtype))
        return real(q, k, v, **kw)

    try:
        torch.nn.functional.scaled_dot_product_attention = spy
        fn()
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    return seen


def test_folded_inference_on_cpu_folds_into_one_dim_and_decodes_with_bias_rows():
    """The CPU flash kernel is fastest on d_h + 1 (no padding to 8), and a decoding step copies no keys."""
    B, H, T, Dh = 1, 2, 40, 16
    q, k, v = _qkv(B, H, H, T, T, Dh, dtype=torch.float32)
    bias = FoldedBias(torch.rand(B, H, T), torch.arange(T, dtype=torch.float32).expand(B, H, T))
    with torch.no_grad():
        whole = _sdpa_calls(lambda: folded_attention(q, k, v, bias, block=16))
        step = _sdpa_calls(
            lambda: attention(q[:, :, -1:], k, v, FoldedBias(bias.q_feat[:, :, -1:], bias.k_feat))
        )
    assert whole == [(Dh + 1, Dh + 1, Dh + 1, torch.float32)] * 3  # 3 blocks, float-mask views
    assert step == [(Dh, Dh, Dh, torch.float32)]


@pytest.mark.parametrize("shape", ["decode1", "gqa-decode1"])
def test_folded_decoding_step_in_bf16_and_under_autocast(shape):
    """A decoding step whose q, k, v are bf16 (or that runs under bf16 autocast) takes the casting branch
    of the bias rows: the rows stay fp32 and the output is the reference's to bf16 rounding."""
    B, H, Hkv, Tq, Tk, Dh = SHAPES[shape]
    q, k, v = (t.float() for t in _qkv(B, H, Hkv, Tq, Tk, Dh))
    bias = _folded(B, H, Tq, Tk)
    bias32 = FoldedBias(bias.q_feat.float(), bias.k_feat.float() * 100)  # logits far from 0: fp32 rows
    ref = attention_reference(q.double(), k.double(), v.double(), FoldedBias(bias.q_feat, bias.k_feat * 100))
    with torch.no_grad():
        half = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), bias32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = attention(q, k, v, bias32)
    assert half.dtype == torch.bfloat16 and auto.dtype == torch.float32
    torch.testing.assert_close(half.double(), ref, rtol=0.02, atol=0.02)
    torch.testing.assert_close(auto.double(), ref, rtol=1e-5, atol=1e-5)


def test_folded_bf16_inputs_are_folded_in_fp32():
    """bf16 q, k, v (as under autocast): the extra dimension stays fp32, so a 4k-position ALiBi-like
    bias is exact to bf16 output rounding; folding in bf16 itself is off by whole logits."""
    B, H, T, Dh = 1, 2, 4096, 16
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(B, H, H, T, T, Dh, dtype=torch.float32))
    pos = torch.arange(T, dtype=torch.float32).expand(B, H, T)
    bias = FoldedBias(q_feat=torch.tensor([0.5, 0.0625])[None, :, None].expand(B, H, T), k_feat=pos)
    rows = slice(T - 64, T)  # compare the last block of queries against a float64 reference
    ref_bias = FoldedBias(bias.q_feat[:, :, rows].double(), bias.k_feat.double())
    ref = attention_reference(q[:, :, rows].double(), k.double(), v.double(), ref_bias)
    out = attention(q, k, v, bias)
    assert out.dtype == torch.bfloat16
    assert (out[:, :, rows].double() - ref).abs().max() < 2e-2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_autocast = attention(q, k, v, bias)
    torch.testing.assert_close(out_autocast, out)
    # first rows: the reference shift does not help there (k_feat ~ -T), fp32 still keeps them right
    ref0 = attention_reference(
        q[:, :, :64].double(),
        k[:, :, :64].double(),
        v[:, :, :64].double(),
        FoldedBias(bias.q_feat[:, :, :64].double(), bias.k_feat[:, :, :64].double()),
    )
    assert (out[:, :, :64].double() - ref0).abs().max() < 2e-2
    naive = folded_attention(q, k, v, bias, fold_dtype=torch.bfloat16, subtract_reference=False)
    assert (naive[:, :, rows].double() - ref).abs().max() > 0.1


# ---- dropout ----------------------------------------------------------------------------------


def test_dropout_single_block_matches_reference_rng():
    """One chunk draws the same dropout mask as the reference for the same seed."""
    B, H, T, Dh = 1, 2, 12, 8
    q, k, v = _qkv(B, H, H, T, T, Dh)
    bias, _ = _pairwise(B, H, T, T)
    torch.manual_seed(5)
    ref = attention_reference(q, k, v, bias, dropout_p=0.3)
    torch.manual_seed(5)
    out = attention(q, k, v, bias, dropout_p=0.3)
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(out, attention_reference(q, k, v, bias))


@pytest.mark.parametrize("bias_kind", ["none", "folded", "pairwise"])
def test_dropout_is_unbiased(bias_kind):
    """E[dropout(w) / (1 - p)] = w: the mean over many draws approaches the dropout-free output."""
    B, H, T, Dh = 1, 2, 6, 4
    q, k, v = _qkv(B, H, H, T, T, Dh)
    bias = {"none": None, "folded": _folded(B, H, T, T), "pairwise": _pairwise(B, H, T, T)[0]}[bias_kind]
    torch.manual_seed(0)
    n = 10000
    qs, ks, vs = (t.expand(n, *t.shape[1:]) for t in (q, k, v))  # n independent draws in one batch
    if bias is not None:
        if isinstance(bias, FoldedBias):
            bias = FoldedBias(bias.q_feat.expand(n, H, T), bias.k_feat.expand(n, H, T))
        else:
            bias = PairwiseBias(bias.q_feat.expand(n, 1, T, 1), bias.k_feat.expand(n, 1, T, 1), bias.fn)
    out = attention(qs, ks, vs, bias, dropout_p=0.5)
    ref = attention_reference(q, k, v, None if bias is None else _first(bias))
    assert not torch.allclose(out[0], ref[0])
    torch.testing.assert_close(out.mean(0), ref[0], atol=0.1, rtol=0)


def _first(bias):
    return type(bias)(
        bias.q_feat[:1], bias.k_feat[:1], *([bias.fn] if isinstance(bias, PairwiseBias) else [])
    )


def test_dropout_checkpointed_chunks_recompute_the_same_masks(monkeypatch):
    """Checkpointed chunks redraw the same dropout masks in backward (preserved RNG state)."""
    B, H, T, Dh = 1, 2, 20, 8
    q, k, v = _qkv(B, H, H, T, T, Dh)
    bias, params = _pairwise(B, H, T, T)
    leaves = [q, k, v]
    for t in leaves:
        t.requires_grad_(True)

    def run():
        torch.manual_seed(11)
        out = chunked_attention(q, k, v, bias, dropout_p=0.4, chunk_size=6)
        return out, torch.autograd.grad(out.square().sum(), leaves)

    out_ckpt, grads_ckpt = run()
    monkeypatch.setattr(chunked_mod, "checkpoint", lambda f, *a, use_reentrant: f(*a))
    out_plain, grads_plain = run()
    torch.testing.assert_close(out_ckpt, out_plain)
    for a, b in zip(grads_ckpt, grads_plain):
        torch.testing.assert_close(a, b)


# ---- long sequences: no T x T tensor ----------------------------------------------------------


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_chunked_long_sequence_never_allocates_t_by_t():
    B, H, T, Dh, chunk = 1, 2, 4096, 16, 256
    q, k, v = _qkv(B, H, H, T, T, Dh, dtype=torch.float32)
    bias, _ = _pairwise(B, H, T, T)
    bias = PairwiseBias(bias.q_feat.float(), bias.k_feat.float(), lambda a, b, fn=bias.fn: fn(a, b).float())
    with torch.no_grad(), _LargestTensor() as guard:
        out = attention(q, k, v, bias, chunk_size=chunk)
    assert guard.largest <= B * H * chunk * T  # one score block, nothing of size T * T
    assert guard.largest < T * T // 4
    # the reference, one block of rows at a time (rows [s, e) see keys [:e])
    for s, e in [(0, 64), (2000, 2064), (T - 64, T)]:
        blk = PairwiseBias(bias.q_feat[:, :, s:e], bias.k_feat[:, :, :e], bias.fn)
        ref = attention_reference(q[:, :, s:e], k[:, :, :e], v[:, :, :e], blk)
        torch.testing.assert_close(out[:, :, s:e], ref, rtol=1e-5, atol=1e-5)


def test_chunked_training_memory_is_per_chunk():
    """With autograd the chunks are checkpointed: backward also never holds a (T, T) block."""
    B, H, T, Dh, chunk = 1, 1, 2048, 8, 128
    q, k, v = (t.float().requires_grad_(True) for t in _qkv(B, H, H, T, T, Dh))
    bias, _ = _pairwise(B, H, T, T)
    bias = PairwiseBias(bias.q_feat.float(), bias.k_feat.float(), lambda a, b, fn=bias.fn: fn(a, b).float())
    with _LargestTensor() as guard:
        out = attention(q, k, v, bias, chunk_size=chunk)
        out.sum().backward()
    assert guard.largest <= B * H * chunk * T
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_folded_long_sequence_has_no_t_by_t_op_output():
    B, H, T, Dh = 1, 2, 4096, 16
    q, k, v = _qkv(B, H, H, T, T, Dh, dtype=torch.float32)
    bias = FoldedBias(torch.rand(B, H, T), torch.arange(T, dtype=torch.float32).expand(B, H, T))
    with torch.no_grad(), _LargestTensor() as guard:
        folded_attention(q, k, v, bias, block=256)
    # q', k', v', the output: O(T d); the per-block bottom-right masks: block * T; never T * T
    assert guard.largest <= max(B * H * T * 24, 256 * T)
    assert guard.largest < T * T // 8


def test_default_chunk_size():
    assert default_chunk_size(1, 4, 256, 256) == 256  # short: one block
    c = default_chunk_size(1, 4, 16384, 16384)
    assert 16 <= c < 16384 and 1 * 4 * c * 16384 <= attn_mod.CHUNK_ELEMENTS


def test_shape_errors():
    q, k, v = _qkv(1, 3, 2, 4, 4, 8)
    with pytest.raises(ValueError):
        attention(q, k, v)
    q, k, v = _qkv(1, 2, 2, 5, 4, 8)
    with pytest.raises(ValueError):
        attention(q, k, v)


# ---- FlexAttention score_mods (CUDA path), checked with eager flex on CPU ----------------------


@pytest.mark.parametrize("name", ["alibi", "kerple-log", "kerple-power", "fire", "t5", "cable", "k-cable"])
@pytest.mark.parametrize("Tq", [19, 6])
def test_flex_score_mods_equal_reference(name, Tq):
    """``_flex`` builds the score_mod and block mask the CUDA path compiles; eager flex runs them on CPU."""
    import warnings

    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from extrapos.attention import flex_forward as _flex
    from extrapos.positions import EncodingContext, build_encoding

    ctx = EncodingContext(d_model=32, n_heads=4, head_dim=8, n_layers=2, train_length=8)
    torch.manual_seed(0)
    enc = build_encoding(name, ctx, {"init_std": 0.5} if name == "t5" else None)
    B, Tk = 2, 19
    pos = torch.arange(Tk).expand(B, Tk) * 3 + 5
    full = enc.bias(torch.randn(B, Tk, 32), pos, 1, None)
    new = enc.bias(torch.randn(B, Tk, 32)[:, Tk - Tq :], pos[:, Tk - Tq :], 1, None)
    if isinstance(full, FoldedBias):
        bias = FoldedBias(full.q_feat[:, :, Tk - Tq :], full.k_feat)
    else:
        bias = PairwiseBias(full.q_feat[:, :, Tk - Tq :], full.k_feat, new.fn)
    q, k, v = _qkv(B, 4, 2, Tq, Tk, 8, dtype=torch.float32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = _flex(q, k, v, bias, flex.flex_attention, flex.create_block_mask)
    torch.testing.assert_close(out, attention_reference(q, k, v, bias), rtol=1e-5, atol=1e-5)


# ---- FlexAttention in training (CUDA path): score_mods and masks with gradients, eager flex on CPU ----


@pytest.fixture
def flex_with_backward_on_cpu(monkeypatch):
    """Eager flex_attention on CPU, with its backward. Eager flex refuses CPU inputs that require grad
    by a device check alone ("FlexAttention does not support backward on CPU", torch 2.13); with the
    check lifted, flex's own eager backward (the dense implementation of flex_attention_backward) runs
    and differentiates the score_mod, as the compiled CUDA backward does. Nothing else is changed."""
    import warnings

    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    monkeypatch.setattr(flex, "_validate_device", lambda q, k, v: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        yield flex


def _flex_training_case(name, layout, causal=True, Tq=19, seed=0):
    """An encoding in fp64, its bias from a normed input x that requires grad, q/k/v (GQA: 4 heads, 2 kv)."""
    from extrapos.positions import EncodingContext, build_encoding

    ctx = EncodingContext(d_model=32, n_heads=4, head_dim=8, n_layers=2, train_length=8, causal=causal)
    torch.manual_seed(seed)
    options = {"t5": {"init_std": 0.5}, "fire": {"mlp_width": 8}}.get(name)  # FIRE's pair unrolls its units
    enc = build_encoding(name, ctx, options).double()
    if name == "fire":
        with torch.no_grad():
            enc.l_scale.fill_(2.0)  # L = 16: queries before and after L (both sides of max(L, i))
    B, Tk = 2, 19
    pos = torch.arange(Tk).expand(B, Tk) if layout == "contiguous" else _positions(B, Tk, Tk, F64)[1].long()
    x = torch.randn(B, Tk, 32, dtype=F64, requires_grad=True)
    q, k, v = (t.requires_grad_() for t in _qkv(B, 4, 2, Tq, Tk, 8, seed=seed + 1))
    return enc, x, pos, (q, k, v)


def _grads(out, leaves):
    w = torch.cos(torch.arange(out.numel(), dtype=F64)).view_as(out)
    return torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power", "fire", "t5", "k-cable"])
@pytest.mark.parametrize("layout,Tq", [("contiguous", 19), ("sorted-gaps", 19), ("contiguous", 6)])
def test_flex_training_path_equals_reference_with_gradients(flex_with_backward_on_cpu, name, layout, Tq):
    """What CUDA training runs for the pairwise biases (``_flex``: the bias's ``pair`` as score_mod,
    the bottom-right causal block mask, GQA), under eager flex on CPU in fp64: outputs and gradients
    w.r.t. q, k, v, the block input x and every parameter of the encoding equal the materialized
    reference's."""
    from extrapos.attention import flex_forward as _flex

    flex = flex_with_backward_on_cpu
    enc, x, pos, (q, k, v) = _flex_training_case(name, layout, Tq=Tq)
    leaves = [q, k, v, x, *enc.parameters()]
    Tk = pos.shape[1]

    def bias():
        full = enc.bias(x, pos, 1, None)
        assert isinstance(full, PairwiseBias) and full.pair is not None
        return PairwiseBias(full.q_feat[:, :, Tk - Tq :], full.k_feat, full.fn, pair=full.pair)

    out = _flex(q, k, v, bias(), flex.flex_attention, flex.create_block_mask)
    ref = attention_reference(q, k, v, bias())
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    got, want = _grads(out, leaves), _grads(ref, leaves)
    # q, k, v and the encoding's parameters (of layer 1) get gradients; x too where the bias reads it
    assert all(g is not None for g in want[:3]) and any(g is not None for g in want[4:])
    assert (want[3] is not None) == (name == "k-cable")
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", ["alibi", "cable"])
@pytest.mark.parametrize("layout,Tq", [("contiguous", 19), ("sorted-gaps", 19), ("contiguous", 6)])
def test_flex_training_path_of_folded_biases_equals_reference_with_gradients(
    flex_with_backward_on_cpu, name, layout, Tq
):
    """What CUDA training runs for ALiBi and CABLE inside ``folded_training_through_flex`` (their rank-one
    bias q_feat[i] * k_feat[j] as the score_mod), under eager flex on CPU in fp64: outputs and gradients
    w.r.t. q, k, v and the block input x (CABLE's learned bias reads it) equal the materialized
    reference's."""
    from extrapos.attention import flex_forward as _flex
    from extrapos.positions.base import FoldedBias

    flex = flex_with_backward_on_cpu
    enc, x, pos, (q, k, v) = _flex_training_case(name, layout, Tq=Tq)
    leaves = [q, k, v, x]
    Tk = pos.shape[1]

    def bias():
        full = enc.bias(x, pos, 1, None)
        assert isinstance(full, FoldedBias)
        return FoldedBias(full.q_feat[:, :, Tk - Tq :], full.k_feat)

    out = _flex(q, k, v, bias(), flex.flex_attention, flex.create_block_mask)
    ref = attention_reference(q, k, v, bias())
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    got, want = _grads(out, leaves), _grads(ref, leaves)
    assert all(g is not None for g in want[:3]) and (want[3] is not None) == (name == "cable")
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", ["kerple-log", "t5", "k-cable", "alibi"])
def test_flex_training_path_bidirectional(flex_with_backward_on_cpu, name):
    """The encoder flavour (no mask): the bidirectional per-pair forms, with gradients."""
    from extrapos.attention import flex_forward as _flex

    flex = flex_with_backward_on_cpu
    enc, x, pos, (q, k, v) = _flex_training_case(name, "sorted-gaps", causal=False)
    leaves = [q, k, v, x, *enc.parameters()]
    out = _flex(q, k, v, enc.bias(x, pos, 0, None), flex.flex_attention, flex.create_block_mask, causal=False)
    ref = attention_reference(q, k, v, enc.bias(x, pos, 0, None), causal=False)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(out, leaves), _grads(ref, leaves)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_flex_past_its_compile_limit_falls_back_instead_of_running_eagerly(monkeypatch):
    """Each new shape (and each encoding's score_mod) compiles flex anew; past dynamo's limit torch would
    run flex eagerly, materialising every (query, key) score (on an H200 an evaluation at 1..16 x 1024
    crawled there). Past ``FLEX_COMPILE_LIMIT`` the call raises inside, and the caller takes its own
    path with a warning. Dynamo's guards are exercised with its "eager" backend (no inductor build)."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    fn = torch.compile(flex_attention, backend="eager", dynamic=False)  # every new shape recompiles
    monkeypatch.setattr(flex_mod, "_flex_state", {"fn": fn, "mask": create_block_mask})
    monkeypatch.setattr(flex_mod, "FLEX_COMPILE_LIMIT", 2)
    enc, x, pos, _ = _flex_training_case("kerple-log", "contiguous")
    got = []
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for the first two shapes
        for T in (8, 12):
            q, k, v = _qkv(1, 4, 2, T, T, 8, seed=T)
            bias = enc.bias(x[:1, :T], pos[:1, :T], 0, None)
            out = flex_mod.flex_or_none(q, k, v, bias)
            torch.testing.assert_close(out, attention_reference(q, k, v, bias), rtol=1e-10, atol=1e-12)
        q, k, v = _qkv(1, 4, 2, 16, 16, 8, seed=16)
        bias = enc.bias(x[:1, :16], pos[:1, :16], 0, None)
        warnings.simplefilter("always")
        with pytest.warns(UserWarning, match="non-flex path") as caught:
            got.append(flex_mod.flex_or_none(q, k, v, bias))
        assert "limit" in str(caught[0].message).lower()
        got.append(flex_mod.flex_or_none(q, k, v, bias))  # that kind now falls back at once
    assert got == [None, None]
    assert flex_mod._flex_state["broken_kinds"] == {flex_mod._kind(bias, False)}
    torch._dynamo.reset()


class _IndexReads(torch.overrides.TorchFunctionMode):
    """Counts the indexing reads of every tensor that requires grad, by its storage."""

    def __init__(self):
        super().__init__()
        self.reads: dict[int, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and args[0].requires_grad:
            key = args[0].untyped_storage().data_ptr()
            self.reads[key] = self.reads.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power", "fire", "t5", "k-cable", "cable"])
def test_flex_score_mods_read_each_differentiable_tensor_once(flex_with_backward_on_cpu, monkeypatch, name):
    """Flex's compiled CUDA backward refuses a score_mod that indexes one captured tensor requiring grad
    twice (inductor's validate_joint_graph, seen on an H200 for FIRE's unrolled MLP): every training
    score_mod reads each such storage at most once where flex differentiates it (here the CUDA condition
    of ``flex_may_differentiate`` is lifted on CPU), and with those copies the output and every gradient
    still equal the materialized reference's."""
    import extrapos.positions.base as base_mod
    from extrapos.attention import flex_forward as _flex
    from extrapos.attention import flex_score_mod

    monkeypatch.setattr(
        base_mod, "flex_may_differentiate", lambda t: t.requires_grad and torch.is_grad_enabled()
    )
    enc, x, pos, (q, k, v) = _flex_training_case(name, "contiguous")
    bias = enc.bias(x, pos, 1, None)
    B, H, Tq, Tk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    score_mod = flex_score_mod(bias, B, H, Tq, Tk)
    counter = _IndexReads()
    idx = [torch.tensor(i) for i in (1, 2, 17, 5)]  # b, h, query 17 (past FIRE's L = 16), key 5
    with counter:
        score_mod(torch.tensor(0.0, dtype=F64), *idx)
    assert counter.reads and max(counter.reads.values()) == 1, counter.reads
    flex = flex_with_backward_on_cpu
    leaves = [q, k, v, x, *enc.parameters()]
    out = _flex(q, k, v, enc.bias(x, pos, 1, None), flex.flex_attention, flex.create_block_mask)
    ref = attention_reference(q, k, v, enc.bias(x, pos, 1, None))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(out, leaves), _grads(ref, leaves)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("causal", [True, False])
def test_flex_document_mask_equals_a_dense_mask(flex_with_backward_on_cpu, causal):
    """``flex_mask_mod`` with documents: a key is visible only from queries of its own document (and,
    causal, not after them); equal to the dense masked softmax, gradients included (fp64)."""
    from extrapos.attention import bias_block
    from extrapos.attention import expand_kv as _expand_kv
    from extrapos.attention import flex_forward as _flex

    flex = flex_with_backward_on_cpu
    enc, x, pos, (q, k, v) = _flex_training_case("kerple-log", "contiguous", causal=causal, Tq=7)
    documents = torch.tensor([[0] * 5 + [1] * 9 + [2] * 5, [0] * 12 + [1] * 7])
    leaves = [q, k, v, x, *enc.parameters()]
    Tk, Tq = 19, 7

    def bias():
        full = enc.bias(x, pos, 0, None)
        return PairwiseBias(full.q_feat[:, :, Tk - Tq :], full.k_feat, full.fn, pair=full.pair)

    out = _flex(q, k, v, bias(), flex.flex_attention, flex.create_block_mask, causal, documents)
    visible = documents[:, Tk - Tq :, None] == documents[:, None, :]  # (B, Tq, Tk)
    if causal:
        visible = visible & attn_mod.causal_mask(Tq, Tk, q.device)
    scores = q @ _expand_kv(k, 4).transpose(-1, -2) / math.sqrt(8) + bias_block(bias())
    weights = torch.softmax(scores.masked_fill(~visible[:, None], float("-inf")), -1)
    ref = weights @ _expand_kv(v, 4)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(out, leaves), _grads(ref, leaves)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_flex_is_chosen_by_device_and_never_on_cpu(monkeypatch):
    """The selection: CUDA only; in training the pairwise biases with a per-pair form; never dropout or
    a LogitBias. On CPU a training step of Kerple never reaches flex (the chunked path, as before)."""
    from extrapos.attention import flex_wanted
    from extrapos.positions.base import LogitBias

    f32, bf16 = torch.float32, torch.bfloat16
    pairwise = PairwiseBias(None, None, None, pair=lambda qi, kj, h: qi[0])
    no_pair = PairwiseBias(None, None, None)
    folded = FoldedBias(None, None)
    assert flex_wanted("cuda", True, 0.0, 512, bf16, pairwise)
    assert not flex_wanted("cpu", True, 0.0, 512, f32, pairwise)
    assert not flex_wanted("cuda", True, 0.1, 512, f32, pairwise)  # flex has no dropout
    assert not flex_wanted("cuda", True, 0.0, 512, f32, no_pair)
    assert not flex_wanted("cuda", True, 0.0, 512, bf16, folded)  # training folds through fused SDPA
    assert not flex_wanted("cuda", False, 0.0, 512, f32, LogitBias(None, None, None))
    assert flex_wanted("cuda", False, 0.0, 512, f32, no_pair)  # long no-grad forwards, as before
    assert not flex_wanted("cuda", False, 0.0, 8, f32, pairwise)  # decoding steps
    assert flex_wanted("cuda", False, 0.0, 512, bf16, folded) and not flex_wanted(
        "cuda", False, 0.0, 512, f32, folded
    )

    def never(*args, **kwargs):
        raise AssertionError("flex on CPU")

    monkeypatch.setattr(dispatch_mod, "flex_or_none", never)
    enc, x, pos, (q, k, v) = _flex_training_case("kerple-log", "contiguous")
    attention(q, k, v, enc.bias(x, pos, 0, None)).sum().backward()
    assert q.grad is not None and next(enc.parameters()).grad is not None


def test_a_failing_flex_backward_falls_back_before_training_uses_it(flex_with_backward_on_cpu, monkeypatch):
    """Under autograd the first call of each kind runs flex's backward on detached q, k, v; a failure
    there (here: a stand-in flex whose backward raises) turns flex off with a warning and the caller
    falls back, instead of failing later in loss.backward()."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    class BrokenBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, out):
            return out.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("no backward kernel for this score_mod")

    def flex_without_backward(q, k, v, **kwargs):
        with torch.no_grad():
            out = flex_attention(q.detach(), k.detach(), v.detach(), **kwargs)
        return BrokenBackward.apply(q, k, v, out)

    monkeypatch.setattr(flex_mod, "_flex_state", {"fn": flex_without_backward, "mask": create_block_mask})
    enc, x, pos, (q, k, v) = _flex_training_case("kerple-log", "contiguous")
    bias = enc.bias(x, pos, 0, None)
    with pytest.warns(UserWarning, match="no backward kernel"):
        assert flex_mod.flex_or_none(q, k, v, bias) is None
    assert flex_mod._flex_state["broken_kinds"] == {flex_mod._kind(bias, True)}
    assert q.grad is None and next(enc.parameters()).grad is None
    # only that kind falls back from now on: the same bias without autograd, and another encoding's
    # training, still take flex (on an H200 FIRE's backward failed where Kerple's and T5's compiled)
    with torch.no_grad():
        assert flex_mod.flex_or_none(q, k, v, bias) is not None
    monkeypatch.setitem(flex_mod._flex_state, "fn", flex_attention)
    enc, x, pos, (q, k, v) = _flex_training_case("t5", "contiguous")
    assert flex_mod.flex_or_none(q, k, v, enc.bias(x, pos, 0, None)) is not None


def test_folded_biases_train_through_flex_only_when_asked_and_in_half_precision():
    """ALiBi's and CABLE's fold trains through SDPA in fp32 (fold.py); flex's compiled backward is the
    faster route on a GPU only once measured (gpu_check's bench times both side by side), so it is taken
    inside ``folded_training_through_flex`` alone, in bf16 / fp16, on CUDA; inference is unchanged."""
    from extrapos.attention import flex_wanted, folded_training_through_flex
    from extrapos.positions.base import FoldedBias

    bias = FoldedBias(torch.ones(1, 4, 1), torch.arange(8.0).view(1, 1, 8))

    def wanted(grad, dtype=torch.bfloat16, device="cuda"):
        return flex_wanted(device, grad, 0.0, 512, dtype, bias)

    assert not wanted(True) and wanted(False)  # training: the fold; a long bf16 forward: flex
    with folded_training_through_flex():
        assert wanted(True) and wanted(True, torch.float16)
        assert not wanted(True, torch.float32) and not wanted(True, device="cpu")
        with folded_training_through_flex(False):
            assert not wanted(True)
        assert wanted(True)
    assert not wanted(True)
