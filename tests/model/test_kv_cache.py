"""Incremental decoding with the KV cache gives the logits of one full forward, for every encoding.

Parametrized over ``registry.names()``: encodings registered later (bias.py, cable.py, ...) are
covered automatically.
"""

import pytest
import torch

from extrapos.model import Decoder, model_config
from extrapos.positions import registry

FLAVOURS = {
    "gpt2": dict(flavour="gpt2"),
    "llama-gqa": dict(flavour="llama", n_kv_heads=2, tie_embeddings=False),
}


def make(name, flavour="gpt2", seed=0):
    torch.manual_seed(seed)
    cfg = model_config(
        n_layers=2,
        d_model=32,
        n_heads=4,
        vocab_size=61,
        train_length=16,
        positions={"name": name},
        **FLAVOURS[flavour],
    )
    model = Decoder(cfg).eval()
    # learnable encoding parameters (FIRE, Kerple, T5, CABLE, learned ExPE...) away from their init,
    # so the test does not pass by accident of a degenerate initial value
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(0.05 * torch.randn_like(p))
            if p.dim() == 0:
                p.abs_()  # scalars (FIRE's c and L, ExPE's S and theta) stay positive
    return model


def decode(model, tokens, positions, chunks):
    cache = model.new_cache()
    out, t = [], 0
    for c in chunks:
        out.append(model(tokens[:, t : t + c], positions[:, t : t + c], cache))
        t += c
    assert t == tokens.shape[1] and cache.length == t
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("flavour", list(FLAVOURS))
@pytest.mark.parametrize("name", registry.names())
def test_cache_matches_full_forward(name, flavour):
    model = make(name, flavour)
    B, T = 2, 12
    tokens = torch.randint(0, 61, (B, T))
    # positions offset by 3 (still inside a 16-row learned table) and different per batch row
    positions = torch.arange(T).expand(B, T) + torch.tensor([[3], [1]])
    with torch.no_grad():
        full = model(tokens, positions)
        steps = decode(model, tokens, positions, [1] * T)
        prefill = decode(model, tokens, positions, [5] + [1] * (T - 5))
        chunks = decode(model, tokens, positions, [4, 3, 1, 4])
    for got in (steps, prefill, chunks):
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_cache_state_is_per_layer_and_grows():
    model = make("rope")
    cache = model.new_cache()
    tokens = torch.randint(0, 61, (1, 7))
    positions = torch.arange(7)[None]
    with torch.no_grad():
        model(tokens[:, :4], positions[:, :4], cache)
        model(tokens[:, 4:], positions[:, 4:], cache)
    assert len(cache) == 7 and len(cache.layers) == 2
    assert cache.layers[0].k.buf is not cache.layers[1].k.buf


def test_cached_decoding_under_autograd():
    """Decoding with gradients on (e.g. fine-tuning through a cache) must not trip autograd's
    in-place checks, and gives the same gradients as the full forward."""
    model = make("rope")
    tokens = torch.randint(0, 61, (1, 6))
    positions = torch.arange(6)[None]
    model(tokens, positions).sum().backward()
    ref = model.tok_emb.weight.grad.clone()
    model.zero_grad()
    cache = model.new_cache()
    out = torch.cat([model(tokens[:, t : t + 1], positions[:, t : t + 1], cache) for t in range(6)], dim=1)
    out.sum().backward()
    torch.testing.assert_close(model.tok_emb.weight.grad, ref, atol=1e-5, rtol=1e-4)
