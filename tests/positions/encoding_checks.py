"""Model-level checks shared by the encodings' test files (imported as a plain module by pytest)."""

from __future__ import annotations

import torch

from extrapos.model import Decoder, model_config


def tiny_model(
    name: str, options: dict | None = None, seed: int = 0, n_kv_heads: int | None = None
) -> Decoder:
    """A 2-layer float64 decoder whose encoding parameters are moved away from their init."""
    torch.manual_seed(seed)
    extra = {} if n_kv_heads is None else dict(flavour="llama", n_kv_heads=n_kv_heads, tie_embeddings=False)
    cfg = model_config(
        n_layers=2,
        d_model=32,
        n_heads=4,
        vocab_size=50,
        train_length=16,
        positions={"name": name, **(options or {})},
        **extra,
    )
    model = Decoder(cfg).double().eval()
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def assert_causal(model: Decoder, T: int = 12, positions: torch.Tensor | None = None) -> None:
    """Changing token t never changes the logits before t (and does change those from t on)."""
    tokens = torch.randint(0, model.cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(T).expand(2, T) if positions is None else positions
    with torch.no_grad():
        ref = model(tokens, positions)
        for t in (1, T // 2, T - 1):
            changed = tokens.clone()
            changed[:, t] = (changed[:, t] + 1) % model.cfg.vocab_size
            out = model(changed, positions)
            torch.testing.assert_close(out[:, :t], ref[:, :t], atol=1e-12, rtol=0)
            assert not torch.allclose(out[:, t:], ref[:, t:])
