"""The fused head + cross-entropy equals the plain masked loss (value and gradients, fp64)."""

from __future__ import annotations

import pytest
import torch

from extrapos.losses import linear_cross_entropy_sum, masked_loss_sum, model_loss_sum
from extrapos.model import Decoder, model_config

F64 = torch.float64


@pytest.mark.parametrize("chunk", [1, 7, 256])
def test_fused_equals_plain_with_gradients(chunk):
    g = torch.Generator().manual_seed(0)
    B, T, d, V = 3, 11, 8, 37
    h = torch.randn(B, T, d, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(V, d, generator=g, dtype=F64, requires_grad=True)
    y = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(F64)
    ref = masked_loss_sum(h @ w.t(), y, mask)
    out = linear_cross_entropy_sum(h, w, y, mask, chunk=chunk)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    gr = torch.autograd.grad(ref * 1.7, (h, w))
    go = torch.autograd.grad(out * 1.7, (h, w))
    for a, b in zip(go, gr):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy_sum(h, w, y, mask, chunk=chunk), ref.detach())


def test_model_loss_with_tied_head_equals_logits_path():
    torch.manual_seed(0)
    cfg = model_config("cpu-tiny", vocab_size=97, positions={"name": "kerple-log"})
    m = Decoder(cfg).double()
    tok = torch.randint(0, 97, (2, 9))
    pos = torch.arange(9).expand(2, 9)
    y = torch.randint(0, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=F64)
    ref = model_loss_sum(m, tok, pos, y, mask, fused=False)
    gr = torch.autograd.grad(ref, list(m.parameters()))
    out = model_loss_sum(m, tok, pos, y, mask)
    go = torch.autograd.grad(out, list(m.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(go, gr):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _loss_and_grads(m, tok, pos, y, mask, fused):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model_loss_sum(m, tok, pos, y, mask, fused=fused)
    return loss, torch.autograd.grad(loss, list(m.parameters()))


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_bf16_autocast_fuses_the_head_on_cpu_as_the_plain_path_computes_it(monkeypatch):
    """Under bf16 autocast on a CPU the head's matmuls run in bf16 inside the fused loss (issue 39: the
    plain path's fp32 logits made the head + loss as slow as fp32's): the loss and every gradient agree
    with the plain autocast path and with the float64 model within bf16's tolerance (doctor's 1e-2)."""
    import extrapos.model as model_module

    torch.manual_seed(0)
    cfg = model_config("cpu-tiny", vocab_size=97, positions={"name": "rope"})
    m = Decoder(cfg)
    tok, y = torch.randint(0, 97, (2, 33)), torch.randint(0, 97, (2, 33))
    pos, mask = torch.arange(33).expand(2, 33), (torch.rand(2, 33) > 0.2).float()
    calls = []
    real = model_module.linear_cross_entropy_sum
    monkeypatch.setattr(
        model_module,
        "linear_cross_entropy_sum",
        lambda *a, **k: calls.append((torch.is_autocast_enabled("cpu"), k)) or real(*a, **k),
    )
    fused, fused_grads = _loss_and_grads(m, tok, pos, y, mask, fused=True)
    assert calls == [(False, {"matmul_dtype": torch.bfloat16})]  # fused, autocast off inside, bf16 matmuls
    plain, plain_grads = _loss_and_grads(m, tok, pos, y, mask, fused=False)
    reference = Decoder(cfg).double()
    reference.load_state_dict(m.state_dict())
    exact = model_loss_sum(reference, tok, pos, y, mask.double(), fused=False)
    exact_grads = torch.autograd.grad(exact, list(reference.parameters()))
    assert _rel(fused, exact) < 1e-2 and _rel(fused, plain) < 1e-2
    for a, b, c in zip(fused_grads, plain_grads, exact_grads):
        assert a.dtype == b.dtype == torch.float32
        assert _rel(a, c) < 1e-2 and _rel(a, b) < 1e-2


def test_the_bf16_fused_head_accumulates_chunk_gradients_in_fp32():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    y, mask = torch.randint(0, 50, (64,), generator=g), torch.ones(64)
    loss = linear_cross_entropy_sum(h, w, y, mask, chunk=8, matmul_dtype=torch.bfloat16)
    gh, gw = torch.autograd.grad(loss, (h, w))
    hd, wd = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = masked_loss_sum((hd @ wd.t()).unsqueeze(0), y.unsqueeze(0), mask.double().unsqueeze(0))
    rh, rw = torch.autograd.grad(ref, (hd, wd))
    assert loss.dtype == gh.dtype == gw.dtype == torch.float32
    assert _rel(loss, ref) < 1e-2 and _rel(gh, rh) < 1e-2 and _rel(gw, rw) < 1e-2
