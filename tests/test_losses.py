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
