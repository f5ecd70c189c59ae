"""ExPE and ExQPE against Datseris et al. (ExPE) eq. 3 and eq. 5, and their placement in the decoder."""

import pytest
import torch

from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions.base import EncodingContext
from extrapos.positions.expe import exqpe_counts
from extrapos.positions.registry import build_encoding

D = 32
CTX = EncodingContext(d_model=D, n_heads=4, head_dim=8, n_layers=2, train_length=512)


def expe(**options):
    return build_encoding("expe", CTX, options)


def test_defaults_follow_the_paper():
    enc = expe()
    assert enc.l == D // 8 and enc.default_theta == 1 / 2048  # 1 / (4 L_t) at L_t = 512
    small = build_encoding("expe", EncodingContext(64, 4, 16, 2, train_length=64))
    assert small.default_theta == 1 / 256 and small.l == 8


def test_expe_overrides_exactly_the_first_l_dims():
    enc = expe(S=0.5, theta=0.01, l=5)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [10, 20, 30, 40, 50, 1000]])
    xq, xv = enc.attn_input(x, positions, layer=0)
    assert xv is x and torch.equal(xq[..., 5:], x[..., 5:])
    n = positions[..., None].double() + torch.arange(5)  # (p_n, p_{n+1}, ..., p_{n+l-1})
    torch.testing.assert_close(xq[..., :5], 0.5 + 0.01 * n, atol=1e-15, rtol=0)
    assert torch.equal(enc.embed(x, positions), x)  # the residual stream is never overridden


def test_apply_to_value_scale_and_stable():
    x = torch.randn(1, 4, D, dtype=torch.float64)
    positions = torch.arange(4)[None] + 7
    xq, xv = expe(apply_to_value=True).attn_input(x, positions, 0)
    assert torch.equal(xq, xv)
    base, _ = expe().attn_input(x, positions, 0)
    half, _ = expe(scale=0.5).attn_input(x, positions, 0)
    torch.testing.assert_close(half[..., :4], 0.5 * base[..., :4])
    stable, _ = expe(stable=True, S=0.25).attn_input(x, positions, 0)
    expected = (0.25 + positions.double() / 2048)[..., None].expand(1, 4, 4)
    torch.testing.assert_close(stable[..., :4], expected)


def test_positions_are_fp32_and_x_keeps_its_dtype():
    enc = expe(theta=1.0)
    x = torch.randn(1, 2, D, dtype=torch.bfloat16)
    positions = torch.tensor([[300, 301]])
    xq, _ = enc.attn_input(x, positions, 0)
    assert xq.dtype == torch.bfloat16
    # p = 300..304 rounded once from fp32 to bf16 (not computed in bf16)
    expected = (positions[..., None] + torch.arange(4)).float().to(torch.bfloat16)
    assert torch.equal(xq[..., :4], expected)


def test_once_overrides_the_embedding_only():
    enc = expe(once=True)
    x = torch.randn(1, 3, D)
    positions = torch.arange(3)[None]
    assert enc.attn_input(x, positions, 0) == (x, x)
    h = enc.embed(x, positions)
    torch.testing.assert_close(h[..., :4], (positions[..., None] + torch.arange(4)).float() / 2048)
    assert torch.equal(h[..., 4:], x[..., 4:])


def test_learned_variants():
    torch.manual_seed(0)
    init = expe(learned_init=True, S=0.1)
    assert init.S.item() == pytest.approx(0.1) and init.theta.item() == pytest.approx(1 / 2048)
    rand = expe(learned=True)
    assert 0 < rand.theta.item() < 2 / 2048 and {n for n, _ in rand.named_parameters()} == {"S", "theta"}
    with pytest.raises(UserError, match="not both"):
        expe(learned=True, learned_init=True)
    with pytest.raises(UserError, match="between 1 and d_model"):
        expe(l=D + 1)


def _recursive_exqpe(N, l, S, t1, t2):
    """ExPE paper eq. 5 literally: p_0 = (S + theta2, S + theta1, ..., S + (l-1) theta1);
    p_i = p_{i-1} with component k = i mod l increased by theta2."""
    p = [S + i * t1 for i in range(l)]
    p[0] += t2
    out = [list(p)]
    for i in range(1, N):
        p[i % l] += t2
        out.append(list(p))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("l", [1, 3, 4])
def test_exqpe_closed_form_equals_recursive_definition(l):
    S, t1, t2 = 0.3, 1 / 2048, 1 / 16
    enc = build_encoding("exqpe", CTX, {"l": l, "S": S})
    N = 50
    got = enc.values(torch.arange(N)[None], torch.float64)[0]
    torch.testing.assert_close(got, _recursive_exqpe(N, l, S, t1, t2), atol=1e-12, rtol=0)


def test_exqpe_counts():
    c = exqpe_counts(torch.tensor([0, 1, 2, 5, 6]), l=3)
    # c_k(n) = #{i in [0, n] : i mod 3 == k}
    expected = [[sum(1 for i in range(n + 1) if i % 3 == k) for k in range(3)] for n in (0, 1, 2, 5, 6)]
    assert c.tolist() == expected


def test_exqpe_placement_and_bf16_distinctness():
    enc = build_encoding("exqpe", CTX, {"scale": 2.0})
    x = torch.randn(1, 3, D)
    positions = torch.tensor([[0, 1, 2]])
    xq, xv = enc.attn_input(x, positions, 0)
    assert xv is x and torch.equal(xq[..., 4:], x[..., 4:])
    torch.testing.assert_close(xq[0, :, :4].double(), 2 * _recursive_exqpe(3, 4, 0.0, 1 / 2048, 1 / 16))


def test_exqpe_motivation_bf16():
    """At long positions ExPE's p_n collide in bf16 while ExQPE's position vectors stay distinct
    (each step adds theta2 = 1/16 to one dim, exact while the counts c_k(n) <= 256, i.e. n < 256 l)."""
    ctx = EncodingContext(d_model=768, n_heads=12, head_dim=64, n_layers=1, train_length=512)  # l = 96
    far = torch.arange(16000, 16064)[None]
    ex = build_encoding("expe", ctx).values(far).to(torch.bfloat16)[0, :, 0]
    exq = build_encoding("exqpe", ctx).values(far).to(torch.bfloat16)[0]
    assert len(set(ex.tolist())) <= 3
    assert len({tuple(r) for r in exq.tolist()}) == 64
    steps = exq[1:].double() - exq[:-1].double()
    assert set(steps.flatten().tolist()) == {0.0, 1 / 16} and (steps != 0).sum(-1).eq(1).all()


@pytest.mark.parametrize("name,to_value", [("expe", False), ("exqpe", False), ("expe", True)])
def test_decoder_feeds_overridden_input_to_q_and_k(name, to_value):
    """In the decoder, Q and K read phi(x); V reads x unless apply_to_value (seen at the projections)."""
    torch.manual_seed(0)
    cfg = model_config(
        n_layers=1, d_model=D, n_heads=4, vocab_size=31, positions={"name": name, "apply_to_value": to_value}
    )
    model = Decoder(cfg).double().eval()
    seen = {}
    model.blocks[0].attn.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    tokens = torch.randint(0, 31, (1, 5))
    positions = torch.arange(5)[None] + 3
    calls = []
    real_linear = torch.nn.functional.linear

    def spy(inp, w, b=None):
        calls.append((inp, w.shape[0]))
        return real_linear(inp, w, b)

    torch.nn.functional.linear = spy
    try:
        model(tokens, positions)
    finally:
        torch.nn.functional.linear = real_linear
    x = seen["x"]
    if to_value:  # one fused [Wq; Wk; Wv] projection of phi(x)
        ((xq, rows),) = calls[:1]
        assert rows == 3 * D
    else:  # [Wq; Wk] on phi(x), then Wv on x
        (xq, rows_qk), (xv, rows_v) = calls[:2]
        assert rows_qk == 2 * D and rows_v == D and torch.equal(xv, x)
    assert torch.equal(xq[..., 4:], x[..., 4:])
    torch.testing.assert_close(xq[..., :4], model.pos.values(positions, torch.float64))
