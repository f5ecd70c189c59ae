"""The encoder flavour: bidirectional attention on every kernel path, and every encoding's bidirectional
form against an independent float64 computation from its formula (docs/encoder.md)."""

from __future__ import annotations

import math

import pytest
import torch

from extrapos.attention import attention, attention_reference, chunked_attention, folded_attention
from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions.base import EncodingContext, FoldedBias, LogitBias, PairwiseBias
from extrapos.positions.bias import alibi_slopes
from extrapos.positions.registry import build_encoding, names, spec

torch.set_default_dtype(torch.float32)
T, H = 12, 4
CTX = EncodingContext(d_model=32, n_heads=H, head_dim=8, n_layers=2, train_length=16, causal=False)


def materialize(enc, x, positions, layer=0):
    """The (B, H, T, T) bias an encoding describes, through the same code attention uses."""
    b = enc.bias(x, positions, layer, None)
    if b is None:
        return None
    if isinstance(b, FoldedBias):
        return (b.q_feat.unsqueeze(-1) * b.k_feat.unsqueeze(-2)).expand(x.shape[0], H, T, T)
    return b.fn(b.q_feat, b.k_feat).expand(x.shape[0], H, T, T)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, CTX.d_model, generator=g, dtype=torch.float64)
    positions = torch.arange(T).expand(2, -1)
    return x, positions


def _ij():
    i = torch.arange(T, dtype=torch.float64).view(-1, 1)
    j = torch.arange(T, dtype=torch.float64).view(1, -1)
    return i, j


def _build(name):
    enc = build_encoding(name, CTX).double()
    return enc


def test_alibi_is_minus_m_abs_distance_and_symmetric():
    x, p = _inputs()
    got = materialize(_build("alibi"), x, p)
    i, j = _ij()
    want = torch.stack([-m * (i - j).abs() for m in alibi_slopes(H)])
    torch.testing.assert_close(got[0], want, rtol=0, atol=1e-12)
    assert torch.equal(got, got.transpose(-1, -2)) and torch.equal(got, got.flip(-1, -2))


@pytest.mark.parametrize("form", ["log", "power"])
def test_kerple_reads_abs_distance_and_is_symmetric(form):
    x, p = _inputs()
    enc = _build(f"kerple-{form}")
    got = materialize(enc, x, p, layer=1)
    r1, r2 = (t.detach().double().clamp(min=1e-2) for t in (enc.r1[1], enc.r2[1]))
    if form == "power":
        r2 = r2.clamp(max=2.0)
    i, j = _ij()
    d = (i - j).abs()
    want = torch.stack([-a * (torch.log(1 + b * d) if form == "log" else d**b) for a, b in zip(r1, r2)])
    torch.testing.assert_close(got[0], want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got, got.transpose(-1, -2)) and torch.allclose(got, got.flip(-1, -2))


def test_fire_normalises_by_the_farthest_key_on_either_side_and_is_mirror_symmetric():
    x, p = _inputs()
    enc = build_encoding("fire", CTX, {"init_L": 4.0}).double()  # L < T: the normaliser varies
    got = materialize(enc, x, p)
    c, L = float(enc.c[0].detach().abs()), float(enc.threshold(0).detach())
    mlp = enc.mlps[0]
    want = torch.empty(H, T, T, dtype=torch.float64)
    for a in range(T):
        reach = max(a, T - 1 - a)
        for b in range(T):
            u = math.log(1 + c * abs(a - b)) / (math.log(1 + c * max(L, reach)) + enc.options.eps)
            want[:, a, b] = mlp(torch.tensor([[u]], dtype=torch.float64))[0]
    torch.testing.assert_close(got[0], want.detach(), rtol=1e-10, atol=1e-10)
    assert torch.allclose(got, got.flip(-1, -2))
    # a causal FIRE (normaliser: the query's own position) differs exactly where the far side is longer
    causal = build_encoding(
        "fire", EncodingContext(**{**CTX.__dict__, "causal": True}), {"init_L": 4.0}
    ).double()
    causal.load_state_dict(enc.state_dict())
    b = causal.bias(x, p, 0, None)
    assert not torch.allclose(
        b.fn(b.q_feat, b.k_feat).expand(2, H, T, T)[0, :, : T // 2], got[0, :, : T // 2]
    )


def _t5_bucket_reference(rel: int, num_buckets: int, max_distance: int) -> int:
    """T5's _relative_position_bucket(bidirectional=True), one pair, in plain Python."""
    num_buckets //= 2
    bucket = num_buckets if rel > 0 else 0
    n = abs(rel)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return bucket + min(large, num_buckets - 1)


def test_t5_uses_bidirectional_buckets():
    from extrapos.positions.bias import t5_bucket

    rel = torch.arange(-300, 301)
    got = t5_bucket(rel, 32, 128, bidirectional=True)
    want = torch.tensor([_t5_bucket_reference(int(r), 32, 128) for r in rel])
    assert torch.equal(got, want)
    enc = build_encoding("t5", CTX, {"init_std": 1.0}).double()
    x, p = _inputs()
    i, j = _ij()
    table = enc.table.detach()
    idx = torch.tensor([[_t5_bucket_reference(int(b - a), 32, 128) for b in range(T)] for a in range(T)])
    torch.testing.assert_close(materialize(enc, x, p)[0], table[idx].permute(2, 0, 1), rtol=0, atol=0)


def _cable_reference(enc, x, layer=0):
    w_c = enc.w_c[layer].weight.detach().double()
    f = torch.relu(x @ w_c.T)  # (B, T, H)
    S = f.cumsum(1)
    g = (
        torch.nn.functional.softplus(x @ enc.w_s[layer].weight.detach().double().T)
        if enc.options.weighted
        else torch.ones_like(S)
    )
    out = torch.empty(x.shape[0], H, T, T, dtype=torch.float64)
    for a in range(T):
        for b in range(T):  # the increments strictly after the earlier token, up to the later one
            lo, hi = min(a, b), max(a, b)
            dist = f[:, lo + 1 : hi + 1].sum(1)
            out[:, :, a, b] = (
                -g[:, a] * dist if not enc.options.kernel else -torch.log1p((g[:, a] * dist) ** 2)
            )
    return out


@pytest.mark.parametrize("name", ["cable", "cable-nw", "k-cable"])
def test_cable_is_minus_g_times_the_context_distance(name):
    x, p = _inputs(3)
    enc = _build(name)
    for lin in enc.w_c:
        torch.nn.init.normal_(lin.weight, std=0.5)  # many non-zero increments
    got = materialize(enc, x, p)
    torch.testing.assert_close(got, _cable_reference(enc, x), rtol=1e-10, atol=1e-10)
    if name == "cable-nw":
        assert torch.allclose(got, got.transpose(-1, -2))  # g = 1: a symmetric distance


def test_cable_causal_half_equals_causal_cable():
    x, p = _inputs(4)
    enc = _build("cable")
    causal = build_encoding("cable", EncodingContext(**{**CTX.__dict__, "causal": True})).double()
    causal.load_state_dict(enc.state_dict())
    both = materialize(enc, x, p)
    b = causal.bias(x, p, 0, None)
    folded = b.q_feat.unsqueeze(-1) * b.k_feat.unsqueeze(-2)  # g_i S_j = bias + g_i S_i
    row = (b.q_feat * b.k_feat).unsqueeze(-1)  # g_i S_i
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool))
    torch.testing.assert_close((folded - row)[..., lower], both[..., lower], rtol=1e-12, atol=1e-12)


def test_fox_is_minus_the_log_gates_between_the_tokens_and_symmetric():
    x, p = _inputs(5)
    enc = _build("fox")
    got = materialize(enc, x, p)
    logf = torch.nn.functional.logsigmoid(enc.gates[0](x).detach())  # (B, T, H)
    want = torch.empty_like(got)
    for a in range(T):
        for b in range(T):
            lo, hi = min(a, b), max(a, b)
            want[:, :, a, b] = logf[:, lo + 1 : hi + 1].sum(1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert torch.allclose(got, got.transpose(-1, -2))


@pytest.mark.parametrize("name", ["rope", "sinusoidal", "learned", "expe", "exqpe", "nope"])
def test_absolute_and_rotary_encodings_are_unchanged(name):
    """RoPE is relative by construction, the absolute ones act before attention: same hooks both ways."""
    x, p = _inputs()
    causal = build_encoding(name, EncodingContext(**{**CTX.__dict__, "causal": True})).double()
    both = build_encoding(name, CTX).double()
    both.load_state_dict(causal.state_dict())
    torch.testing.assert_close(both.embed(x, p), causal.embed(x, p))
    q, k = torch.randn(2, H, T, 8, dtype=torch.float64), torch.randn(2, H, T, 8, dtype=torch.float64)
    for a, b in zip(both.rotate(q, k, p), causal.rotate(q, k, p)):
        torch.testing.assert_close(a, b)
    assert both.bias(x, p, 0, None) is None


def test_every_registered_encoding_is_bidirectional_or_says_why_not():
    for name in names():
        cls = spec(name).cls
        if cls.causal_only:
            with pytest.raises(UserError, match="cannot be bidirectional"):
                build_encoding(name, CTX)
        else:
            build_encoding(name, CTX)
    assert {n for n in names() if spec(n).cls.causal_only} == {"cope", "xpos"}


# ---- attention paths ------------------------------------------------------------------------------


def _qkv(Tq=40, Tk=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, H, Tq, 8, generator=g, dtype=torch.float64),
        torch.randn(2, 2, Tk, 8, generator=g, dtype=torch.float64),
        torch.randn(2, 2, Tk, 8, generator=g, dtype=torch.float64),
    )


def test_fold_path_equals_the_reference_bidirectionally():
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(1)
    bias = FoldedBias(
        torch.rand(2, H, 40, generator=g, dtype=torch.float64),
        torch.arange(40, dtype=torch.float64).expand(2, 1, -1).contiguous() * 3,
    )
    want = attention_reference(q, k, v, bias, causal=False)
    torch.testing.assert_close(folded_attention(q, k, v, bias, causal=False), want)
    torch.testing.assert_close(
        folded_attention(q, k, v, bias, causal=False, block=16), want
    )  # block by block
    assert not torch.allclose(want, attention_reference(q, k, v, bias))  # the mask matters


def test_chunked_paths_equal_the_reference_bidirectionally():
    q, k, v = _qkv()
    x = torch.zeros(2, 40, CTX.d_model, dtype=torch.float64)
    p = torch.arange(40).expand(2, -1)
    ctx40 = EncodingContext(**{**CTX.__dict__, "train_length": 16})
    for name in ("alibi", "kerple-log", "fire", "t5", "dape"):
        bias = build_encoding(name, ctx40).double().bias(x, p, 0, None)
        want = attention_reference(q, k, v, bias, causal=False)
        for chunk in (7, 16, 40):
            torch.testing.assert_close(chunked_attention(q, k, v, bias, chunk_size=chunk, causal=False), want)
        torch.testing.assert_close(attention(q, k, v, bias, causal=False), want)
    assert isinstance(bias, LogitBias)
    torch.testing.assert_close(
        attention(q, k, v, None, causal=False), attention_reference(q, k, v, causal=False)
    )


def test_pairwise_bidirectional_gradients_match_under_checkpointing():
    q, k, v = (t.requires_grad_() for t in _qkv())
    p = torch.arange(40).expand(2, -1).double()[:, None, :, None]
    bias = PairwiseBias(p, p, lambda a, b: -(a - b.transpose(-1, -2)).abs() * 0.3)
    out = chunked_attention(q, k, v, bias, chunk_size=8, causal=False)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = attention_reference(q, k, v, bias, causal=False)
    for a, b in zip(grads, torch.autograd.grad(ref.square().sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


# ---- the model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rope", "alibi", "cable", "t5", "learned"])
def test_encoder_has_no_causal_mask(name):
    cfg = model_config(
        "cpu-encoder", n_layers=2, d_model=32, vocab_size=64, train_length=16, positions={"name": name}
    )
    torch.manual_seed(0)
    model = Decoder(cfg).eval()
    tokens = torch.randint(5, 64, (1, 16))
    positions = torch.arange(16).unsqueeze(0)
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 64
    with torch.no_grad():
        a, b = model(tokens, positions), model(changed, positions)
    assert not torch.allclose(a[0, 0], b[0, 0])  # the last token changes the first position's output
    decoder = Decoder(
        model_config("cpu-tiny", vocab_size=64, train_length=16, positions={"name": name})
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(decoder(tokens, positions)[0, :-1], decoder(changed, positions)[0, :-1])


def test_encoder_head_is_tied_and_post_norm_runs():
    cfg = model_config("cpu-encoder", n_layers=1, d_model=32, vocab_size=64, post_norm=True, embed_norm=True)
    model = Decoder(cfg)
    assert model.lm_head.weight is model.tok_emb.weight
    assert isinstance(model.norm, torch.nn.Identity)
    out = model(torch.randint(0, 64, (2, 8)), torch.arange(8).expand(2, -1))
    assert out.shape == (2, 8, 64) and torch.isfinite(out).all()
    with pytest.raises(UserError, match="no KV cache"):
        model(torch.randint(0, 64, (1, 4)), torch.arange(4).unsqueeze(0), cache=model.new_cache())


def test_bert_base_preset_has_bert_s_size():
    from extrapos.model import count_parameters

    with torch.device("meta"):
        model = Decoder(model_config("bert-base", positions={"name": "learned"}))
    n = count_parameters(model)
    # BERT-base is 110M with 512 learned positions and a 2-row segment table (none here), 30522 vocab
    assert 108e6 < n["total"] < 111e6, n
