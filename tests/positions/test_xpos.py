"""xPos against its definition (Sun et al. 2022, §3.2-3.3), written with complex numbers in float64."""

import math

import pytest
import torch

from extrapos.attention import attention, attention_reference, bias_block
from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext, PairwiseBias
from extrapos.positions.registry import build_encoding
from tests.positions.encoding_checks import assert_causal, tiny_model

HEAD = 8
CTX = EncodingContext(d_model=4 * HEAD, n_heads=4, head_dim=HEAD, n_layers=2, train_length=16)


def expected_logits(q, k, pos, base=10000.0, scale_base=512.0, gamma=0.4):
    """sum_i zeta_i^((n - m)/B) Re[z_q,i conj(z_k,i) e^{i (n - m) theta_i}], z_i = x_i + i x_{i + d/2}."""
    d = q.shape[-1]
    half = d // 2
    out = torch.zeros(*q.shape[:2], q.shape[2], k.shape[2], dtype=torch.float64)
    for i in range(half):
        theta = base ** (-2 * i / d)
        zeta = (2 * i / d + gamma) / (1 + gamma)
        zq = torch.complex(q[..., i], q[..., i + half])  # (B, H, T)
        zk = torch.complex(k[..., i], k[..., i + half])
        rel = (pos[:, :, None] - pos[:, None, :]).to(torch.float64)[:, None]  # (B, 1, n, m)
        phase = torch.polar(torch.ones_like(rel), rel * theta)
        out += zeta ** (rel / scale_base) * (zq[..., :, None] * zk.conj()[..., None, :] * phase).real
    return out


@pytest.mark.parametrize("options", [{}, {"scale_base": 64.0, "gamma": 0.2}])
def test_logits_match_the_definition(options):
    torch.manual_seed(0)
    enc = build_encoding("xpos", CTX, options)
    q, k = torch.randn(2, 4, 9, HEAD, dtype=torch.float64), torch.randn(2, 4, 9, HEAD, dtype=torch.float64)
    pos = torch.sort(torch.randint(0, 3000, (2, 9)), dim=-1).values
    qr, kr = enc.rotate(q, k, pos)
    want = expected_logits(q, k, pos, **{"scale_base": 512.0, "gamma": 0.4, **options})
    torch.testing.assert_close(qr @ kr.transpose(-1, -2), want, atol=1e-9, rtol=1e-9)


def test_the_decay_is_what_separates_it_from_rope():
    """Same rotation as RoPE; the logit of a far pair shrinks by zeta^(dist / 512) per dimension pair."""
    q = torch.ones(1, 1, 2, HEAD, dtype=torch.float64)
    pos = torch.tensor([[0, 2048]])
    xq, xk = build_encoding("xpos", CTX).rotate(q, q, pos)
    rq, rk = build_encoding("rope", CTX).rotate(q, q, pos)
    torch.testing.assert_close(xq[0, 0, 0] * xk[0, 0, 0], rq[0, 0, 0] * rk[0, 0, 0])  # distance 0: no decay
    ratio = (xq[0, 0, 1] * xk[0, 0, 0]) / (rq[0, 0, 1] * rk[0, 0, 0])  # query 2048 vs key 0, per dim
    zeta = torch.tensor([(2 * i / HEAD + 0.4) / 1.4 for i in range(HEAD // 2)], dtype=torch.float64)
    torch.testing.assert_close(ratio, torch.cat((zeta, zeta)) ** 4.0)


def test_keys_are_scaled_by_their_own_position_only():
    """The KV cache keeps scaled keys: a key's factor must not depend on the other tokens of the call."""
    enc = build_encoding("xpos", CTX)
    k = torch.randn(1, 4, 6, HEAD, dtype=torch.float64)
    pos = torch.arange(6)[None] + 40
    _, whole = enc.rotate(k, k, pos)
    _, tail = enc.rotate(k[:, :, 4:], k[:, :, 4:], pos[:, 4:])
    torch.testing.assert_close(whole[:, :, 4:], tail)


def test_positions_whose_factors_overflow_are_a_user_error():
    enc = build_encoding("xpos", CTX)
    limit = enc.max_position(torch.float32)
    assert 30_000 < limit < 36_500  # 3.5^(m / 512) reaches 2^115 near m = 32.6k
    q = torch.randn(1, 4, 2, HEAD)
    out = enc.rotate(q, q, torch.tensor([[0, limit]]))
    assert all(torch.isfinite(t).all() for t in out)
    with pytest.raises(UserError, match="scale_base"):
        enc.rotate(q, q, torch.tensor([[0, limit + 1]]))


def test_blockwise_attention_masks_keys_before_the_previous_block():
    enc = build_encoding("xpos", CTX, {"blockwise": True, "block_length": 4})
    assert build_encoding("xpos", CTX).bias(None, torch.zeros(1, 3, dtype=torch.long), 0, None) is None
    pos = torch.arange(13)[None] + 2  # blocks of positions 0-3, 4-7, ...: not aligned with indices
    b = bias_block(enc.bias(torch.zeros(1, 13, 4), pos, 0, None))[0, 0]
    for i in range(13):
        for j in range(i + 1):
            visible = (pos[0, j] // 4) >= (pos[0, i] // 4) - 1
            assert b[i, j] == (0.0 if visible else -math.inf), (i, j)
    assert (b == -math.inf).any() and (b == 0).any()


def test_blockwise_default_block_is_half_the_training_length_and_attention_uses_it():
    enc = build_encoding("xpos", CTX, {"blockwise": True})
    assert enc.block_length == CTX.train_length // 2
    B, T, H = 1, 30, 4
    q, k, v = (torch.randn(B, H, T, HEAD, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(T)[None]
    bias = enc.bias(torch.zeros(B, T, 4, dtype=torch.float64), pos, 0, None)
    assert isinstance(bias, PairwiseBias)
    out = attention(q, k, v, bias, chunk_size=7)
    # independent: a window attention where key j is kept iff j // 8 >= i // 8 - 1
    i, j = torch.arange(T)[:, None], torch.arange(T)
    keep = (j <= i) & (j // 8 >= i // 8 - 1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(HEAD)).masked_fill(~keep, -math.inf)
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v)
    torch.testing.assert_close(out, attention_reference(q, k, v, bias))


def test_blockwise_option_is_checked():
    with pytest.raises(UserError, match="block_length"):
        build_encoding("xpos", CTX, {"block_length": 0})


@pytest.mark.parametrize("options", [{}, {"blockwise": True, "block_length": 3}])
def test_causal(options):
    assert_causal(tiny_model("xpos", options), positions=torch.arange(12).expand(2, 12) + 5)


def test_blockwise_cached_decoding_equals_the_full_forward():
    model = tiny_model("xpos")
    model.pos.set_options(blockwise=True, block_length=3)
    tokens = torch.randint(0, 50, (2, 11))
    pos = torch.arange(11).expand(2, 11) + torch.tensor([[0], [2]])
    with torch.no_grad():
        full = model(tokens, pos)
        cache = model.new_cache()
        steps = torch.cat([model(tokens[:, t : t + 1], pos[:, t : t + 1], cache) for t in range(11)], dim=1)
        unmasked = tiny_model("xpos")(tokens, pos)
    torch.testing.assert_close(steps, full, atol=1e-10, rtol=1e-10)
    assert not torch.allclose(full[:, 6:], unmasked[:, 6:])  # the mask is in effect beyond 2 blocks
