"""ALiBi, Kerple, FIRE and T5 against their papers' formulas (Press et al. 2022; Chi et al. 2022; Li et al.
2024; Raffel et al. 2020) on small float64 inputs."""

from __future__ import annotations

import math

import pytest
import torch

from extrapos.attention import attention, attention_reference, bias_block
from extrapos.errors import UserError
from extrapos.positions import EncodingContext, build_encoding
from extrapos.positions.base import FoldedBias, PairwiseBias
from extrapos.positions.bias import t5_bucket

F64 = torch.float64
CTX = EncodingContext(d_model=16, n_heads=4, head_dim=4, n_layers=3, train_length=8)


def _positions(B=2, T=13, seed=0):
    """Sorted positions with gaps and a per-row offset: never arange."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.sort(torch.randperm(5 * T, generator=g)[:T])[0] + 3 * b for b in range(B)]
    return torch.stack(rows)


def _block(enc, positions, layer=0, d=None):
    x = torch.zeros(*positions.shape, d or enc.ctx.d_model, dtype=F64)
    return bias_block(enc.bias(x, positions, layer, None))


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def _assert_equal_up_to_row_constants(got, want, mask):
    """Softmax only sees a row up to a constant: compare both after removing the diagonal entry."""
    got = got - got.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
    want = want - want.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
    torch.testing.assert_close(got.masked_fill(~mask, 0), want.masked_fill(~mask, 0))


# ---- ALiBi ------------------------------------------------------------------------------------


def _reference_slopes(n):
    """get_slopes as written in the ALiBi reference code (ofirpress/attention_with_linear_biases)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _reference_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [8, 12, 6, 4, 1, 16])
def test_alibi_slopes_match_reference(heads):
    ctx = EncodingContext(d_model=heads * 2, n_heads=heads, head_dim=2, n_layers=1, train_length=8)
    enc = build_encoding("alibi", ctx)
    torch.testing.assert_close(enc.slopes, torch.tensor(_reference_slopes(heads), dtype=F64))


def test_alibi_bias_is_linear_in_position_distance():
    enc = build_encoding("alibi", CTX)
    pos = _positions()
    b = enc.bias(torch.zeros(2, 13, 16, dtype=F64), pos, 0, None)
    assert isinstance(b, FoldedBias) and b.q_feat.shape == (2, 4, 13) and b.k_feat.shape == (2, 4, 13)
    m = enc.slopes[None, :, None, None]
    i, j = pos[:, None, :, None].to(F64), pos[:, None, None, :].to(F64)
    _assert_equal_up_to_row_constants(bias_block(b), -m * (i - j), _causal(13))


# ---- Kerple -----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["log", "power"])
def test_kerple_formula(form):
    torch.manual_seed(0)
    enc = build_encoding(f"kerple-{form}", CTX).double()
    with torch.no_grad():  # inside the clamps (tested separately), so the raw values are the used ones
        enc.r1.clamp_(min=0.05)
        enc.r2.clamp_(min=0.05, max=1.9)
    pos = _positions()
    for layer in range(CTX.n_layers):
        r1 = enc.r1[layer][None, :, None, None]
        r2 = enc.r2[layer][None, :, None, None]
        d = (pos[:, None, :, None] - pos[:, None, None, :]).abs().to(F64)
        want = -r1 * torch.log(1 + r2 * d) if form == "log" else -r1 * d**r2
        torch.testing.assert_close(_block(enc, pos, layer), want)


def test_kerple_init_as_reference_and_per_layer():
    torch.manual_seed(0)
    log, power = build_encoding("kerple-log", CTX), build_encoding("kerple-power", CTX)
    assert log.r1.shape == (CTX.n_layers, CTX.n_heads)
    assert 0 < log.r1.min() and log.r1.max() <= 2 and log.r2.max() <= 1  # r1 ~ U(0,2), r2 ~ U(0,1)
    assert power.r1.max() <= 1 and power.r2.max() <= 2  # r1 ~ U(0,1), r2 ~ U(0,2)
    assert not torch.equal(log.r1[0], log.r1[1])  # each layer its own parameters
    shared = build_encoding("kerple-log", CTX, {"per_layer": False})
    assert shared.r1.shape == (1, CTX.n_heads)
    pos = _positions()
    torch.testing.assert_close(_block(shared.double(), pos, 0), _block(shared, pos, 2))


def test_kerple_clamps_keep_gradients():
    enc = build_encoding("kerple-power", CTX).double()
    with torch.no_grad():
        enc.r1[0].fill_(-1.0)  # below the 1e-2 floor
        enc.r2[0].fill_(3.0)  # above the power form's ceiling of 2
    pos = _positions()
    d = (pos[:, None, :, None] - pos[:, None, None, :]).abs().to(F64)
    block = _block(enc, pos, 0)
    torch.testing.assert_close(block, (-1e-2 * d**2.0).expand_as(block))
    block.sum().backward()
    assert enc.r1.grad[0].abs().min() > 0 and enc.r2.grad[0].abs().min() > 0  # straight-through


def test_kerple_form_is_checked():
    with pytest.raises(UserError):
        build_encoding("kerple-log", CTX, {"form": "cubic"})


# ---- FIRE -------------------------------------------------------------------------------------


def _fire_expected(enc, pos, layer, use_max=True):
    c = enc.c[layer].abs()
    L = enc.threshold(layer)
    i, j = pos[:, None, :, None].to(F64), pos[:, None, None, :].to(F64)
    psi = lambda x: torch.log(c * x + 1)  # noqa: E731
    norm = torch.maximum(i, L) if use_max else torch.minimum(i, L)
    x = psi((i - j).abs()) / (psi(norm) + enc.options.eps)
    return enc.mlps[layer](x.unsqueeze(-1)).squeeze(1).permute(0, 3, 1, 2)


def test_fire_formula_uses_max_of_L_and_i():
    ctx = EncodingContext(d_model=16, n_heads=4, head_dim=4, n_layers=2, train_length=10)
    torch.manual_seed(0)
    enc = build_encoding("fire", ctx).double()
    with torch.no_grad():
        enc.c[1].fill_(0.3)
        enc.l_scale[1].fill_(1.5)  # L = 15
    pos = torch.tensor([[0, 1, 4, 9, 14, 15, 16, 22, 40]])  # queries before and after L
    for layer in range(2):
        L = enc.threshold(layer).item()
        assert pos.min() < L < pos.max()
        got = _block(enc, pos, layer)
        torch.testing.assert_close(got, _fire_expected(enc, pos, layer))
        assert not torch.allclose(got, _fire_expected(enc, pos, layer, use_max=False))
    assert enc.init_L.item() == 10.0 and enc.c[0].item() == pytest.approx(0.1)


def test_fire_query_at_zero_is_finite_and_short_queries_share_the_normaliser():
    enc = build_encoding("fire", CTX).double()
    with torch.no_grad():
        enc.l_scale.zero_()  # L = 0: psi(max(L, 0)) = 0 without the eps
    block = _block(enc, torch.tensor([[0, 1, 2]]))
    assert torch.isfinite(block).all()
    # with L = L_t = 8, queries at positions < 8 all normalise by psi(8): the bias of a pair at
    # distance 2 is the same for queries at 3 and at 5
    enc = build_encoding("fire", CTX).double()
    b = _block(enc, torch.tensor([[1, 3, 5]]))
    torch.testing.assert_close(b[0, :, 1, 0], b[0, :, 2, 1])


# ---- T5 ---------------------------------------------------------------------------------------


def _hf_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """Hugging Face T5Attention._relative_position_bucket (from Mesh TensorFlow), restated."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20)])
def test_t5_buckets_match_t5_formula(num_buckets, max_distance):
    rel = torch.arange(-5000, 40)
    want = _hf_relative_position_bucket(
        rel, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )
    torch.testing.assert_close(t5_bucket(rel, num_buckets, max_distance), want)
    assert t5_bucket(torch.tensor([0, -1, -15, -16, -127, -128, -(10**6)])).tolist() == [
        0,
        1,
        15,
        16,
        31,
        31,
        31,
    ]


def test_t5_bias_is_table_lookup_of_buckets_and_shared_by_layers():
    enc = build_encoding("t5", CTX, {"init_std": 1.0}).double()
    assert enc.table.shape == (32, CTX.n_heads) and enc.table.std() > 0.5
    pos = _positions(T=40)
    rel = pos[:, None, :] - pos[:, :, None]  # (B, i, j) = j - i
    want = enc.table[_hf_relative_position_bucket(rel, bidirectional=False)].permute(0, 3, 1, 2)
    for layer in range(CTX.n_layers):
        torch.testing.assert_close(_block(enc, pos, layer), want)


def test_t5_decoding_rows_from_the_remembered_table_equal_the_bias_exactly():
    """With a cache state and no autograd (decoding on the CPU), T5's rows are gathered from a distance
    table kept in the state: bit for bit the rows ``fn`` computes, for sorted gapped positions, a few
    queries (future keys included), contiguous decoding that grows the table, and after the weights change
    (the table is rebuilt, not reused)."""
    enc = build_encoding("t5", CTX, {"init_std": 1.0})
    g = torch.Generator().manual_seed(0)
    state: dict = {}
    keys = torch.sort(torch.randperm(600, generator=g)[:300])[0].unsqueeze(0)  # gapped, sorted
    with torch.no_grad():
        for step in range(4):
            if step == 2:
                enc.table.add_(torch.randn(enc.table.shape, generator=g))  # an update in place
            queries = keys[:, -3:] if step == 0 else keys[:, -1:]
            fresh = enc.bias(torch.zeros(1, queries.shape[1], 16), queries, 0, None)
            cached = enc.bias(torch.zeros(1, queries.shape[1], 16), queries, 0, state)
            kf = keys.float()[:, None, :, None]
            assert torch.equal(cached.fn(cached.q_feat, kf), fresh.fn(fresh.q_feat, kf))
            keys = torch.cat([keys, keys[:, -1:] + 1 + 400 * (step == 1)], dim=1)  # one far jump grows it
    held = state["distance_table"][1]
    assert held.shape[0] == CTX.n_heads and held.shape[1] >= int(keys[0, -2] - keys[0, 0]) + 1
    train_state: dict = {}
    bias = enc.bias(torch.zeros(1, 1, 16), keys[:, -1:], 0, train_state)  # autograd on: computed afresh
    bias.fn(bias.q_feat, keys.float()[:, None, :, None]).sum().backward()
    assert "distance_table" not in train_state and enc.table.grad is not None


def test_t5_default_init_is_zero():
    assert build_encoding("t5", CTX).table.abs().max() == 0


# ---- all of them ------------------------------------------------------------------------------

NAMES = ["alibi", "kerple-log", "kerple-power", "fire", "t5"]


@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    enc = build_encoding(name, CTX)
    assert enc.family == "bias" and enc.paper


@pytest.mark.parametrize("name", NAMES)
def test_bias_depends_on_distances_only_through_positions(name):
    """Shifting all positions leaves the shift-invariant biases unchanged (up to row constants);
    FIRE depends on i too (through max(L, i)) and changes."""
    enc = build_encoding(name, CTX, {"init_std": 0.5} if name == "t5" else None).double()
    pos = _positions(T=11)
    a, b = _block(enc, pos), _block(enc, pos + 37)
    mask = _causal(11)
    if name == "fire":
        assert not torch.allclose(a, b)
    else:
        _assert_equal_up_to_row_constants(a, b, mask)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power", "fire", "t5"])
def test_gradients_reach_every_parameter_through_attention(name):
    torch.manual_seed(0)
    enc = build_encoding(name, CTX, {"init_std": 0.5} if name == "t5" else None).double()
    if name == "fire":
        with torch.no_grad():
            enc.l_scale.fill_(4.0)  # L = 32 > some query positions: L gets a gradient
    B, T, H, Dh = 2, 13, CTX.n_heads, CTX.head_dim
    pos = _positions(B, T)
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3))
    for layer in range(CTX.n_layers):
        bias = enc.bias(torch.zeros(B, T, 16, dtype=F64), pos, layer, None)
        assert isinstance(bias, PairwiseBias)
        attention(q, k, v, bias, chunk_size=4).square().sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    if name != "t5":  # per-layer parameters: every layer's slice got a gradient
        for pname, p in enc.named_parameters():
            if p.dim() >= 1 and p.shape[0] == CTX.n_layers:
                assert (p.grad.reshape(CTX.n_layers, -1).abs().sum(-1) > 0).all(), pname


@pytest.mark.parametrize("name", NAMES)
def test_fast_path_equals_reference_with_decoding_shapes(name):
    """The encoding's description through attention() equals the reference, full and decode-shaped."""
    enc = build_encoding(name, CTX, {"init_std": 0.5} if name == "t5" else None).double()
    B, T, H, Dh = 2, 17, CTX.n_heads, CTX.head_dim
    pos = _positions(B, T)
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3))
    full = enc.bias(torch.zeros(B, T, 16, dtype=F64), pos, 1, None)
    torch.testing.assert_close(attention(q, k, v, full, chunk_size=5), attention_reference(q, k, v, full))
    # decoding: the last 3 queries against all keys (the cache concatenates key features)
    new = enc.bias(torch.zeros(B, 3, 16, dtype=F64), pos[:, -3:], 1, None)
    dec = type(new)(new.q_feat, full.k_feat, *([new.fn] if isinstance(new, PairwiseBias) else []))
    out = attention(q[:, :, -3:], k, v, dec)
    torch.testing.assert_close(out, attention_reference(q, k, v, full)[:, :, -3:])


def test_fire_mlp_by_hidden_unit_equals_the_mlp():
    from extrapos.positions.bias import _mlp_by_unit

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).double()
    u = torch.rand(2, 1, 5, 7, dtype=torch.float64) * 3
    expected = mlp(u.unsqueeze(-1)).squeeze(1).permute(0, 3, 1, 2)
    torch.testing.assert_close(_mlp_by_unit(mlp, u), expected)


# ---- the distance tables (DistanceBias.table): the fast path against fn on every pair ----------


def _fire_before_L(enc, T):
    """FIRE with L beyond every position: the table covers every query block."""
    with torch.no_grad():
        enc.l_scale.fill_(2.0 * T / CTX.train_length)
    return enc


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power", "fire", "t5"])
@pytest.mark.parametrize("layout", ["contiguous", "sorted-gaps"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_distance_table_path_equals_reference_with_gradients(name, layout, chunk):
    """The table path (Toeplitz windows for contiguous positions, a gather for sorted ones) equals the
    materialized reference that evaluates fn on every pair: outputs and gradients w.r.t. q, k, v and
    every parameter of the encoding, full forwards and decode-shaped blocks, fp64."""
    from extrapos.attention import distance_block
    from extrapos.positions.bias import DistanceBias

    torch.manual_seed(0)
    enc = build_encoding(name, CTX, {"init_std": 0.5} if name == "t5" else None).double()
    B, T, H, Dh = 2, 17, CTX.n_heads, CTX.head_dim
    pos = (
        torch.arange(T).expand(B, T) + torch.tensor([[0], [7]])
        if layout == "contiguous"
        else _positions(B, T)
    )
    if name == "fire":
        _fire_before_L(enc, int(pos.max()) + 1)
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64, requires_grad=True) for _ in range(3))
    leaves = [q, k, v, *enc.parameters()]
    for Tq in (T, 3, 1):
        full = enc.bias(torch.zeros(B, T, 16, dtype=F64), pos, 1, None)
        new = enc.bias(torch.zeros(B, Tq, 16, dtype=F64), pos[:, T - Tq :], 1, None)
        assert isinstance(new, DistanceBias)
        blk, _ = distance_block(new.table, new.q_feat, full.k_feat, T - Tq, F64)
        assert blk is not None and blk.shape[0] == (1 if layout == "contiguous" else B)
        dec = DistanceBias(new.q_feat, full.k_feat, new.fn, new.table)
        qs = q[:, :, T - Tq :]
        ref = attention_reference(qs, k, v, dec)
        out = attention(qs, k, v, dec, chunk_size=chunk)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        w = ref.detach().cos()
        g_ref = torch.autograd.grad((ref * w).sum(), leaves, allow_unused=True, retain_graph=True)
        g_out = torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)
        for a, b in zip(g_out, g_ref):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
        with torch.no_grad():  # the inference path (fused SDPA with the block as a float mask)
            torch.testing.assert_close(
                attention(qs, k, v, dec, chunk_size=chunk), ref, rtol=1e-10, atol=1e-10
            )


def test_fire_table_covers_only_queries_before_L():
    enc = build_encoding("fire", CTX).double()  # L = L_t = 8
    p = torch.arange(12, dtype=F64)[None, None, :, None]
    bias = enc.bias(torch.zeros(1, 12, 16, dtype=F64), torch.arange(12)[None], 0, None)
    assert bias.table(p[:, :, :8], 8) is not None  # positions 0..7 < L
    assert bias.table(p[:, :, :9], 9) is None  # position 8 = L: maximum(i, L) ties, use fn
    assert bias.table(p, 12) is None


def test_distance_block_declines_unsorted_positions():
    from extrapos.attention import distance_block

    enc = build_encoding("kerple-log", CTX).double()
    pos = torch.tensor([[0, 5, 3, 9]])
    bias = enc.bias(torch.zeros(1, 4, 16, dtype=F64), pos, 0, None)
    assert distance_block(bias.table, bias.q_feat, bias.k_feat, 0, F64)[0] is None
    q, k, v = (torch.randn(1, 4, 4, 4, dtype=F64) for _ in range(3))
    torch.testing.assert_close(attention(q, k, v, bias), attention_reference(q, k, v, bias))


def test_fire_mlp_piecewise_linear_equals_the_mlp():
    """The inference form (affine between the ReLU breakpoints) is the MLP, breakpoints included."""
    from extrapos.positions.bias import _mlp_piecewise

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).double()
    with torch.no_grad():
        mlp[0].weight[3] = 0.0  # a constant unit (no breakpoint)
        mlp[0].bias[5] = -mlp[0].weight[5, 0] * 0.5  # a breakpoint exactly at u = 0.5
    u = torch.cat([torch.rand(2 * 5 * 7, dtype=F64) * 3 - 1, torch.tensor([0.5, 0.0] * 5, dtype=F64)])
    u = u.reshape(2, 1, 5, 8)
    expected = mlp(u.unsqueeze(-1)).squeeze(1).permute(0, 3, 1, 2)
    with torch.no_grad():
        torch.testing.assert_close(_mlp_piecewise(mlp, u), expected, rtol=1e-12, atol=1e-12)
