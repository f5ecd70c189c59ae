"""RoPE against an independent complex-number rotation, and each scaling against its definition.

``transformers`` is not a dependency, so the references here are re-derivations from the papers /
the Hugging Face formulas written out with Python's math module, not calls into our code.
"""

import math

import pytest
import torch

from extrapos.errors import UserError
from extrapos.positions.base import EncodingContext
from extrapos.positions.registry import build_encoding

HEAD = 16
CTX = EncodingContext(d_model=4 * HEAD, n_heads=4, head_dim=HEAD, n_layers=1, train_length=64)


def complex_rotation(x, positions, inv_freq, rot_dim=None):
    """Half-split pairing: element i and i + d/2 are the real and imaginary parts of z_i; z_i *= e^{i n
    w_i}."""
    rot_dim = rot_dim or x.shape[-1]
    half = rot_dim // 2
    z = torch.complex(x[..., :half], x[..., half:rot_dim])
    angle = positions.to(torch.float64)[:, None, :, None] * torch.tensor(inv_freq, dtype=torch.float64)
    z = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag, x[..., rot_dim:]), dim=-1)


def rope(**options):
    return build_encoding("rope", CTX, options)


def qk(T=7, dtype=torch.float64):
    torch.manual_seed(0)
    q = torch.randn(2, 4, T, HEAD, dtype=dtype)
    k = torch.randn(2, 2, T, HEAD, dtype=dtype)  # GQA: fewer key heads
    positions = torch.randint(0, 5000, (2, T))
    return q, k, positions


def plain_inv_freq(base, dim):
    return [base ** (-2 * i / dim) for i in range(dim // 2)]


def test_rope_equals_complex_rotation():
    q, k, positions = qk()
    rq, rk = rope().rotate(q, k, positions)
    w = plain_inv_freq(10000.0, HEAD)
    torch.testing.assert_close(rq, complex_rotation(q, positions, w), atol=1e-10, rtol=0)
    torch.testing.assert_close(rk, complex_rotation(k, positions, w), atol=1e-10, rtol=0)


def test_partial_rotation():
    q, k, positions = qk()
    rq, rk = rope(rotary_fraction=0.25).rotate(q, k, positions)
    w = plain_inv_freq(10000.0, 4)
    torch.testing.assert_close(rq, complex_rotation(q, positions, w, rot_dim=4), atol=1e-10, rtol=0)
    assert torch.equal(rq[..., 4:], q[..., 4:])


def test_relative_dot_products():
    """<R_m q, R_n k> depends on n - m only."""
    enc = rope()
    q = torch.randn(1, 1, 1, HEAD, dtype=torch.float64)
    k = torch.randn(1, 1, 1, HEAD, dtype=torch.float64)
    dots = []
    for m in (0, 11, 300):
        rq, _ = enc.rotate(q, q, torch.tensor([[m]]))
        _, rk = enc.rotate(k, k, torch.tensor([[m + 5]]))
        dots.append((rq * rk).sum().item())
    assert dots == pytest.approx([dots[0]] * 3, abs=1e-10)


def test_fp32_rotation_is_accurate():
    q, k, positions = qk(dtype=torch.float32)
    rq, _ = rope().rotate(q, k, positions)
    ref = complex_rotation(q.double(), positions, plain_inv_freq(10000.0, HEAD))
    torch.testing.assert_close(rq.double(), ref, atol=2e-3, rtol=0)  # angles up to 5000 rad in fp32


def test_linear_scaling_is_position_interpolation():
    q, k, positions = qk()
    rq, _ = rope(scaling="linear", factor=4.0).rotate(q, k, positions)
    ref = complex_rotation(q, positions.double() / 4, plain_inv_freq(10000.0, HEAD))
    torch.testing.assert_close(rq, ref, atol=1e-9, rtol=0)


def test_ntk_scaling_changes_the_base():
    q, k, positions = qk()
    s = 8.0
    rq, _ = rope(scaling="ntk", factor=s).rotate(q, k, positions)
    base = 10000.0 * s ** (HEAD / (HEAD - 2))
    torch.testing.assert_close(
        rq, complex_rotation(q, positions, plain_inv_freq(base, HEAD)), atol=1e-9, rtol=0
    )


@pytest.mark.parametrize("max_pos", [40, 63, 64, 200])
def test_dynamic_ntk(max_pos):
    s, L = 4.0, 64
    enc = rope(scaling="dynamic", factor=s)
    q = torch.randn(1, 1, 3, HEAD, dtype=torch.float64)
    positions = torch.tensor([[0, 7, max_pos]])
    rq, _ = enc.rotate(q, q, positions)
    T = max_pos + 1
    base = 10000.0 if T <= L else 10000.0 * (s * T / L - (s - 1)) ** (HEAD / (HEAD - 2))
    torch.testing.assert_close(
        rq, complex_rotation(q, positions, plain_inv_freq(base, HEAD)), atol=1e-9, rtol=0
    )


def yarn_reference(base, dim, s, L, beta_fast=32, beta_slow=1):
    """YaRN's blend written out per frequency (reference implementation's floor/ceil correction range)."""

    def corr_dim(rotations):  # the dim index whose wavelength fits `rotations` turns in L
        return dim * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(dim // 2):
        w = base ** (-2 * i / dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate (keep w), 1: interpolate (w / s)
        out.append(w * (1 - ramp) + (w / s) * ramp)
    return out


@pytest.mark.parametrize("s", [2.0, 8.0])
def test_yarn(s):
    L = 64
    enc = rope(scaling="yarn", factor=s)
    q, k, positions = qk()
    rq, rk = enc.rotate(q, k, positions)
    w = yarn_reference(10000.0, HEAD, s, L)
    m = 0.1 * math.log(s) + 1
    torch.testing.assert_close(rq, m * complex_rotation(q, positions, w), atol=1e-9, rtol=0)
    torch.testing.assert_close(rk, m * complex_rotation(k, positions, w), atol=1e-9, rtol=0)
    # the logits are scaled by m^2 = 1/t (YaRN's temperature) at equal positions
    q0, k0 = enc.rotate(q, k, torch.zeros_like(positions))
    assert (q0 * k0[:, :1]).sum().item() == pytest.approx(m * m * (q * k[:, :1]).sum().item())
    # shape of the blend: the fastest frequency is kept, the slowest interpolated by s
    plain = plain_inv_freq(10000.0, HEAD)
    assert w[0] == pytest.approx(plain[0]) and w[-1] == pytest.approx(plain[-1] / s)


def test_yarn_uses_original_length():
    a = build_encoding("rope", CTX, {"scaling": "yarn", "factor": 4.0})
    b = build_encoding("rope", CTX, {"scaling": "yarn", "factor": 4.0, "original_length": 4096})
    ref = yarn_reference(10000.0, HEAD, 4.0, 4096)
    torch.testing.assert_close(b.inv_freq, torch.tensor(ref, dtype=torch.float64))
    assert not torch.allclose(a.inv_freq, b.inv_freq)


def test_set_options_recomputes_frequencies():
    enc = rope()
    plain = enc.inv_freq.clone()
    q, k, positions = qk()
    enc.rotate(q, k, positions)  # fills the per-forward memo
    enc.set_options(scaling="linear", factor=2.0)
    torch.testing.assert_close(enc.inv_freq, plain / 2)
    rq, _ = enc.rotate(q, k, positions)
    torch.testing.assert_close(rq, complex_rotation(q, positions.double() / 2, plain_inv_freq(10000.0, HEAD)))


def test_bad_options():
    with pytest.raises(UserError, match="scaling"):
        rope(scaling="longrope")
    with pytest.raises(UserError, match="rotary_fraction"):
        rope(rotary_fraction=0.05)
    with pytest.raises(UserError, match="factor"):
        rope(scaling="linear", factor=0.5)
