"""Sinusoidal and learned absolute encodings against their formulas (Vaswani et al. 2017 §3.5; Radford et al.
2019; segmented sequences §3.2)."""

import math

import pytest
import torch

from extrapos.errors import UserError
from extrapos.positions.absolute import interpolation_weights
from extrapos.positions.base import EncodingContext
from extrapos.positions.registry import build_encoding

CTX = EncodingContext(d_model=6, n_heads=2, head_dim=3, n_layers=1, train_length=8)


def test_nope_is_identity():
    enc = build_encoding("nope", CTX)
    h = torch.randn(2, 5, 6)
    pos = torch.arange(5).expand(2, 5)
    assert enc.embed(h, pos) is h and enc.attn_input(h, pos, 0) == (h, h)
    assert enc.bias(h, pos, 0, None) is None


def test_sinusoidal_formula():
    enc = build_encoding("sinusoidal", CTX)
    pos = torch.tensor([[0, 3, 17, 1000]])
    h = torch.zeros(1, 4, 6, dtype=torch.float64)
    got = enc.embed(h, pos)[0]
    for a, n in enumerate(pos[0].tolist()):
        for t in range(3):
            angle = n / 10000 ** (2 * t / 6)
            assert got[a, 2 * t].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert got[a, 2 * t + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def _paper_interpolation(E, beta):
    """segmented-sequences §3.2 literally: e'_i for i < beta (L_t - 1) + 1, then copies of e_{L_t-1}."""
    L = E.shape[0]
    rows = []
    for i in range(beta * L):
        if i <= beta * (L - 1):
            lo, r = i // beta, i % beta
            hi = min(lo + 1, L - 1)  # r == 0 at the last original row: its weight is 0
            rows.append((beta - r) / beta * E[lo] + r / beta * E[hi])
        else:
            rows.append(E[L - 1])
    return torch.stack(rows)


@pytest.mark.parametrize("beta", [1, 2, 3, 4])
def test_learned_interpolation_matches_formula(beta):
    torch.manual_seed(0)
    enc = build_encoding("learned", CTX, {"interpolate_to": beta * 8}).double()
    E = enc.table.detach().clone()
    expected = _paper_interpolation(E, beta)
    pos = torch.arange(beta * 8)[None]
    got = enc.embed(torch.zeros(1, beta * 8, 6, dtype=torch.float64), pos)[0]
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    # the original rows survive at positions beta * i
    torch.testing.assert_close(got[::beta], E)
    torch.testing.assert_close(enc.interpolated(beta * 8), expected, atol=1e-12, rtol=0)


def test_non_integer_beta_is_linear_interpolation_at_i_over_beta():
    lo, hi, frac = interpolation_weights(torch.arange(12), old_length=8, new_length=12)
    u = torch.arange(12, dtype=torch.float64) * 8 / 12
    assert torch.equal(lo, u.floor().long().clamp(max=7))
    torch.testing.assert_close(frac, (u - u.floor()) * (u < 7))


def test_extend_table_then_read_directly():
    torch.manual_seed(0)
    enc = build_encoding("learned", CTX)
    expected = _paper_interpolation(enc.table.detach().clone(), 2)
    enc.extend_table(16)
    assert enc.table.shape == (16, 6) and enc.options.max_length == 16 and enc.table.requires_grad
    got = enc.embed(torch.zeros(1, 16, 6), torch.arange(16)[None])[0]
    torch.testing.assert_close(got, expected)


def test_learned_overflow_is_a_user_error_naming_the_fix():
    enc = build_encoding("learned", CTX)
    h = torch.zeros(1, 9, 6)
    with pytest.raises(UserError, match="interpolate_to"):
        enc.embed(h, torch.arange(9)[None])
    enc.set_options(interpolate_to=16)
    enc.embed(h, torch.arange(9)[None])
    with pytest.raises(UserError, match="beyond"):
        enc.embed(torch.zeros(1, 17, 6), torch.arange(17)[None])
    with pytest.raises(UserError, match="shorter"):
        enc.set_options(interpolate_to=4)


def test_learned_table_gets_gradients_through_interpolation():
    enc = build_encoding("learned", CTX, {"interpolate_to": 16})
    enc.embed(torch.zeros(1, 16, 6), torch.arange(16)[None]).sum().backward()
    assert (enc.table.grad != 0).all()


def test_sinusoidal_scales_embeddings_by_sqrt_d_model_by_default():
    """Vaswani et al. 2017 §3.4: the embeddings are multiplied by sqrt(d_model) before the sines are added."""
    torch.manual_seed(0)
    enc = build_encoding("sinusoidal", CTX)
    assert enc.options.scale_embeddings is True
    h = torch.randn(2, 5, 6, dtype=torch.float64)
    pos = torch.arange(5).expand(2, 5)
    sines = enc.embed(torch.zeros_like(h), pos)  # zero embeddings: the table alone
    torch.testing.assert_close(enc.embed(h, pos), h * math.sqrt(6) + sines, atol=1e-12, rtol=0)


def test_sinusoidal_unscaled_option_keeps_the_plain_sum():
    torch.manual_seed(0)
    enc = build_encoding("sinusoidal", CTX, {"scale_embeddings": False})
    h = torch.randn(2, 5, 6)
    pos = torch.arange(5).expand(2, 5)
    assert torch.equal(enc.embed(h, pos), h + enc.table(pos))


def test_sinusoidal_scale_option_is_type_checked():
    with pytest.raises(UserError, match="scale_embeddings"):
        build_encoding("sinusoidal", CTX, {"scale_embeddings": "yes"})


def test_a_checkpoint_saved_before_the_scale_option_loads_unscaled(tmp_path):
    """Runs trained before the option existed (no marker in their weights) evaluate as they were trained."""
    from safetensors.torch import load_file, load_model, save_file, save_model

    from extrapos.model import Decoder, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=1, d_model=8, n_heads=2, vocab_size=16, train_length=8, positions={"name": "sinusoidal"}
    )
    save_model(Decoder(cfg), str(tmp_path / "new.safetensors"))
    weights = load_file(str(tmp_path / "new.safetensors"))
    marker = [k for k in weights if k.endswith(Decoder(cfg).pos.MARKER)]
    assert len(marker) == 1
    save_file({k: v for k, v in weights.items() if k not in marker}, str(tmp_path / "old.safetensors"))
    fresh, older = Decoder(cfg), Decoder(cfg)
    for model, file in ((fresh, "new"), (older, "old")):
        missing, unexpected = load_model(model, str(tmp_path / f"{file}.safetensors"))  # strict
        assert not missing and not unexpected
    assert fresh.pos.options.scale_embeddings is True and older.pos.options.scale_embeddings is False
    h, pos = torch.randn(1, 8, 8), torch.arange(8)[None]
    assert torch.equal(older.pos.embed(h, pos), h + older.pos.table(pos))
    assert torch.equal(fresh.pos.embed(h, pos), h * math.sqrt(8) + fresh.pos.table(pos))
