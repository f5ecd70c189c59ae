"""FIRE's gridded form (option ``grid``; Li et al. 2024, eq. 7, with f replaced by its linear
interpolant on G nodes of [0, 1]): its error against the exact MLP and its bound, every attention path
against the fp64 reference of the gridded form itself (gradients included), cached decoding, and the
option's validation. The exact form (grid = 0, the default) is tested in tests/positions/test_bias.py."""

from __future__ import annotations

import pytest
import torch

from extrapos.attention import attention, attention_reference, bias_block
from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions import EncodingContext, build_encoding
from extrapos.positions.base import PairwiseBias
from extrapos.positions.bias import DistanceBias
from tests.attention.test_attention import flex_with_backward_on_cpu  # noqa: F401 (a fixture)

F64 = torch.float64
CTX = EncodingContext(d_model=16, n_heads=4, head_dim=4, n_layers=2, train_length=8)


def _pair(exact_options=None, grid=64, ctx=CTX, seed=0):
    """An exact FIRE and a gridded one with the same parameters (fp64), moved away from their init."""
    torch.manual_seed(seed)
    exact = build_encoding("fire", ctx, exact_options).double()
    with torch.no_grad():
        for p in exact.parameters():
            p.add_(0.2 * torch.randn_like(p))
    gridded = build_encoding("fire", ctx, {**(exact_options or {}), "grid": grid}).double()
    gridded.load_state_dict(exact.state_dict())
    return exact, gridded


def _positions(B=2, T=13, seed=0):
    """Sorted positions with gaps and a per-row offset."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.sort(torch.randperm(5 * T, generator=g)[:T])[0] + 3 * b for b in range(B)]
    return torch.stack(rows)


def _reference(enc, pos, layer, causal=True):
    """The gridded bias written out independently in fp64: u from the paper's formula, the MLP on the
    nodes k / (G - 1), torch.lerp between the two nodes around u (B, H, T, T)."""
    G = enc.options.grid
    c, L, eps = enc.c[layer].abs(), enc.threshold(layer), enc.options.eps
    i, j = pos[:, None, :, None].to(F64), pos[:, None, None, :].to(F64)
    reach = (
        i
        if causal
        else torch.maximum(
            i - pos.min(-1).values[:, None, None, None], pos.max(-1).values[:, None, None, None] - i
        )
    )
    u = torch.log1p(c * (i - j).abs()) / (torch.log1p(c * torch.maximum(reach, L)) + eps)
    V = enc.mlps[layer](torch.linspace(0, 1, G, dtype=F64)[:, None])  # (G, H)
    x = (u * (G - 1)).clamp(0, G - 1)
    k = x.detach().floor().long().clamp(max=G - 2)
    out = torch.lerp(V[k], V[k + 1], (x - k).unsqueeze(-1))  # (B, 1, T, T, H)
    return out.squeeze(1).permute(0, 3, 1, 2)


def _grads(out, leaves):
    """Gradients of a fixed weighting of out; the graph is kept (the grid tables are shared by the
    fast path and the reference)."""
    w = torch.cos(torch.arange(out.numel(), dtype=F64)).view_as(out)
    return torch.autograd.grad((out * w).sum(), leaves, allow_unused=True, retain_graph=True)


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def test_grid_error_is_within_its_bound_and_vanishes_as_the_grid_grows():
    """f is piecewise linear in u (a ReLU MLP of one input), so the interpolant is exact in the cells
    without a breakpoint and off by at most h / 4 * sum_m |w1_m W2[h, m]| (h = 1 / (G - 1)) in the
    others: max error O(1 / G); the mean over u falls as O(1 / G^2) (a fraction O(1 / G) of u in
    cells with a breakpoint, each off by O(1 / G))."""
    from extrapos.positions.bias import _grid_interpolate

    torch.manual_seed(0)
    enc = build_encoding("fire", CTX).double()
    mlp = enc.mlps[0]
    u = torch.rand(1, 1, 1, 200_000, dtype=F64)
    exact = mlp(u[0, 0, 0, :, None]).t()  # (H, N)
    w1, W2 = mlp[0].weight[:, 0], mlp[2].weight
    kink = (w1.abs() * W2.abs()).sum(-1)  # (H,) the sum of the slope changes of each head
    worst, mean = [], []
    for G in (8, 32, 128, 512, 2048):
        enc.set_options(grid=G)
        A, S = enc.grid_tables(0, F64)
        err = (_grid_interpolate(A, S, u)[0, :, 0] - exact).abs().detach()
        assert (err.max(-1).values <= kink / (4 * (G - 1)) + 1e-12).all(), G
        worst.append(err.max().item())
        mean.append(err.mean().item())
    assert worst[-1] < worst[0] / 50 and mean[-1] < mean[0] / 2000
    assert all(b < a for a, b in zip(mean, mean[1:]))
    # at the nodes the interpolant is the MLP
    nodes = torch.arange(2048, dtype=F64).reshape(1, 1, 1, -1) / 2047
    torch.testing.assert_close(_grid_interpolate(A, S, nodes)[0, :, 0], mlp(nodes[0, 0, 0, :, None]).t())


@pytest.mark.parametrize("causal", [True, False])
def test_gridded_bias_equals_its_fp64_reference_with_gradients(causal):
    """bias_block of the gridded form (queries before and after L) equals the written-out reference,
    and so do the gradients w.r.t. c, L and the MLP's weights; the fp32 form equals it too."""
    ctx = EncodingContext(d_model=16, n_heads=4, head_dim=4, n_layers=2, train_length=8, causal=causal)
    _, enc = _pair(grid=37, ctx=ctx)
    with torch.no_grad():
        # L = 16 (causal) / 40 (bidirectional: the reach is at least half the span): both sides of max(L, i)
        enc.l_scale.fill_(2.0 if causal else 5.0)
    pos = _positions(T=11)
    assert pos.min() < enc.threshold(0) < pos.max()
    mask = _causal(11) if causal else torch.ones(11, 11, dtype=torch.bool)
    w = torch.cos(torch.arange(2 * 4 * 11 * 11, dtype=F64)).view(2, 4, 11, 11) * mask
    names, params = zip(*enc.named_parameters())
    for layer in range(2):
        got = bias_block(enc.bias(torch.zeros(2, 11, 16, dtype=F64), pos, layer, None))
        want = _reference(enc, pos, layer, causal)
        torch.testing.assert_close(got * mask, want * mask, rtol=1e-12, atol=1e-12)
        g_got = torch.autograd.grad((got * w).sum(), params, allow_unused=True)
        g_want = torch.autograd.grad((want * w).sum(), params, allow_unused=True)
        for a, b in zip(g_got, g_want):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        assert g_got[names.index("l_scale")][layer] != 0  # L is learned through u
        f32 = build_encoding("fire", ctx, {"grid": 37})
        f32.load_state_dict(enc.state_dict())
        got32 = bias_block(f32.bias(torch.zeros(2, 11, 16), pos, layer, None))
        assert got32.dtype == torch.float32
        torch.testing.assert_close((got32 * mask).double(), want * mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "sorted-gaps"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_attention_paths_with_the_grid_equal_the_reference_with_gradients(layout, chunk):
    """Through attention(): the distance table before L, every pair after it, query chunks, the
    inference paths and decode-shaped blocks, against the materialized reference of the same bias
    (fp64, gradients w.r.t. q, k, v and every parameter)."""
    _, enc = _pair(grid=50)
    with torch.no_grad():
        enc.l_scale.fill_(1.5)  # L = 12
    B, T, H, Dh = 2, 17, 4, 4
    pos = (
        torch.arange(T).expand(B, T) + torch.tensor([[0], [3]])
        if layout == "contiguous"
        else _positions(B, T)
    )
    q, k, v = (torch.randn(B, H, T, Dh, dtype=F64, requires_grad=True) for _ in range(3))
    leaves = [q, k, v, *enc.parameters()]
    for Tq in (T, 3, 1):
        full = enc.bias(torch.zeros(B, T, 16, dtype=F64), pos, 1, None)
        new = enc.bias(torch.zeros(B, Tq, 16, dtype=F64), pos[:, T - Tq :], 1, None)
        assert isinstance(new, DistanceBias)
        dec = DistanceBias(new.q_feat, full.k_feat, new.fn, pair=new.pair, table=new.table)
        qs = q[:, :, T - Tq :]
        ref = attention_reference(qs, k, v, dec)
        out = attention(qs, k, v, dec, chunk_size=chunk)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        for a, b in zip(_grads(out, leaves), _grads(ref, leaves)):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
        with torch.no_grad():
            torch.testing.assert_close(
                attention(qs, k, v, dec, chunk_size=chunk), ref, rtol=1e-10, atol=1e-10
            )
    # the table covers the queries before L with the gridded values
    early = enc.bias(torch.zeros(1, 12, 16, dtype=F64), torch.arange(12)[None], 1, None)
    table = early.table(early.q_feat, 12)
    assert table is not None
    torch.testing.assert_close(table, bias_block(early)[0, :, -1].flip(-1))


@pytest.fixture
def fresh_dynamo():
    """Eager flex traces its score_mod with dynamo: a later flex test of other shapes would find these
    shapes in dynamo's cache and be traced with dynamic shapes (the exact FIRE pair then fails to
    trace); dynamo's caches are cleared before the test (an earlier flex test in this worker may have
    left other shapes) and after it. The model itself compiles flex with dynamic=False, so this is a
    property of eager flex in one test process, not of training."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_flex_pair_with_the_grid_equals_the_reference_with_gradients(flex_with_backward_on_cpu, fresh_dynamo):  # noqa: F811
    """The gridded ``pair`` (the score_mod CUDA training runs) under eager flex on CPU, fp64."""
    from extrapos.attention import flex_forward as _flex

    flex = flex_with_backward_on_cpu
    _, enc = _pair({"mlp_width": 8}, grid=33)
    with torch.no_grad():
        enc.l_scale.fill_(1.5)
    B, T = 2, 19
    pos = _positions(B, T)
    q, k, v = (torch.randn(B, 4, T, 4, dtype=F64, requires_grad=True) for _ in range(3))
    leaves = [q, k, v, *enc.parameters()]
    bias = enc.bias(torch.zeros(B, T, 16, dtype=F64), pos, 1, None)
    assert isinstance(bias, PairwiseBias) and bias.pair is not None
    out = _flex(q, k, v, bias, flex.flex_attention, flex.create_block_mask)
    ref = attention_reference(q, k, v, bias)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(out, leaves), _grads(ref, leaves)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_kv_cache_decoding_with_the_grid_equals_the_full_forward():
    torch.manual_seed(0)
    cfg = model_config(
        n_layers=2,
        d_model=32,
        n_heads=4,
        vocab_size=61,
        train_length=8,
        positions={"name": "fire", "grid": 128},
    )
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(0.05 * torch.randn_like(p))
    B, T = 2, 20  # positions before and after L = 8
    tokens = torch.randint(0, 61, (B, T))
    positions = torch.arange(T).expand(B, T) + torch.tensor([[3], [0]])
    with torch.no_grad():
        full = model(tokens, positions)
        for chunks in ([1] * T, [6] + [1] * (T - 6), [7, 5, 1, 7]):
            cache, out, t = model.new_cache(), [], 0
            for c in chunks:
                out.append(model(tokens[:, t : t + c], positions[:, t : t + c], cache))
                t += c
            torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-5, rtol=1e-5)
        model.pos.set_options(grid=0)
        assert not torch.equal(model(tokens, positions), full)  # the grid changed the numbers


@pytest.mark.parametrize("bad", [1, -4, True, 2.5, "1024"])
def test_grid_option_is_validated(bad):
    with pytest.raises(UserError, match="grid"):  # a wrong type: the registry's check, in one sentence
        build_encoding("fire", CTX, {"grid": bad})
    enc = build_encoding("fire", CTX, {"grid": 16})
    with pytest.raises(UserError, match="grid must be 0"):
        enc.set_options(grid=bad)
    assert enc.options.grid == 16  # the rejected value did not stay


def test_default_is_the_exact_form():
    """grid = 0 (the default) keeps the exact MLP: bit-identical to an encoding built without the option."""
    torch.manual_seed(0)
    a = build_encoding("fire", CTX)
    b = build_encoding("fire", CTX, {"grid": 0})
    b.load_state_dict(a.state_dict())
    assert a.options.grid == 0
    pos = torch.arange(30)[None]
    x = torch.zeros(1, 30, 16)
    assert torch.equal(bias_block(a.bias(x, pos, 0, None)), bias_block(b.bias(x, pos, 0, None)))


# ---- option piecewise: the exact MLP as its piecewise-linear form under autograd --------------------


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_piecewise_training_form_equals_the_mlp_with_gradients(monkeypatch, dtype):
    """Under autograd, past L, ``piecewise = true`` runs ``_mlp_piecewise`` (checked) and equals the
    MLP: outputs and gradients w.r.t. q, k, v and every parameter, fp64 to 1e-10 (fp32 to the fp64
    MLP within fp32 rounding); gradients are those of the MLP away from the breakpoints (measure zero)."""
    import extrapos.positions.bias as bias_mod

    monkeypatch.setattr(bias_mod, "PIECEWISE_MIN", 1)  # small test blocks take the form too
    calls = []
    original = bias_mod._mlp_piecewise
    monkeypatch.setattr(bias_mod, "_mlp_piecewise", lambda mlp, u: calls.append(1) or original(mlp, u))
    exact, _ = _pair()
    piecewise = build_encoding("fire", CTX, {"piecewise": True}).to(dtype)
    piecewise.load_state_dict(exact.state_dict())
    with torch.no_grad():
        for enc in (exact, piecewise):
            enc.l_scale.fill_(0.75)  # L = 6: most queries past L
    B, T, H, Dh = 2, 17, 4, 4
    pos = _positions(B, T)
    qkv = [torch.randn(B, H, T, Dh, dtype=F64) for _ in range(3)]
    outs, grads = [], []
    for enc, dt in ((exact, F64), (piecewise, dtype)):
        q, k, v = (t.to(dt).requires_grad_() for t in qkv)
        bias = enc.bias(torch.zeros(B, T, 16, dtype=dt), pos, 1, None)
        out = attention(q, k, v, bias)
        outs.append(out.double())
        w = torch.cos(torch.arange(out.numel(), dtype=dt)).view_as(out)
        leaves = [q, k, v, *enc.parameters()]
        grads.append(
            [
                None if g is None else g.double()
                for g in torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)
            ]
        )
    assert calls  # the piecewise form ran under autograd
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == F64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[1], outs[0], **tol)
    for a, b in zip(grads[1], grads[0]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, **tol)


def test_piecewise_is_off_by_default_and_the_training_path_is_the_mlp(monkeypatch):
    import extrapos.positions.bias as bias_mod

    monkeypatch.setattr(bias_mod, "PIECEWISE_MIN", 1)
    monkeypatch.setattr(bias_mod, "_mlp_piecewise", lambda mlp, u: pytest.fail("piecewise under autograd"))
    enc = build_encoding("fire", CTX)
    assert enc.options.piecewise is False
    q = torch.randn(1, 4, 12, 4, requires_grad=True)
    bias = enc.bias(torch.zeros(1, 12, 16), torch.arange(12)[None], 0, None)
    attention(q, q, q, bias).sum().backward()
