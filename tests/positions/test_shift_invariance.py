"""Relative encodings: adding a constant to every position leaves the logits unchanged.

Every registered encoding is expected to be shift invariant unless its family is absolute by
design (``absolute``: sinusoidal, learned; ``expe``: ExPE/ExQPE write the absolute position into
Q/K) or it is FIRE, whose bias psi(i - j) / psi(max(L, i)) normalizes by the absolute query
position (shift invariant only once every i >= L). New families are tested by default.
"""

import pytest
import torch

from extrapos.model import Decoder, model_config
from extrapos.positions import registry

ABSOLUTE_FAMILIES = {"absolute", "expe"}
NOT_INVARIANT = {"fire"}  # max(L, i) in the normalizer: depends on the absolute query position


def _relative_names():
    out = []
    for name in registry.names():
        if registry.spec(name).cls.family in ABSOLUTE_FAMILIES or name.split("-")[0] in NOT_INVARIANT:
            continue
        out.append(name)
    return out


@pytest.mark.parametrize("name", _relative_names())
def test_shift_invariance(name):
    torch.manual_seed(0)
    cfg = model_config(
        n_layers=2, d_model=32, n_heads=4, vocab_size=53, train_length=16, positions={"name": name}
    )
    model = Decoder(cfg).double().eval()
    tokens = torch.randint(0, 53, (2, 12))
    positions = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        ref = model(tokens, positions)
        for shift in (1, 37, 1000):
            torch.testing.assert_close(model(tokens, positions + shift), ref, atol=1e-9, rtol=1e-9)


def test_absolute_encodings_are_not_shift_invariant():
    """Guards the test above against passing vacuously (e.g. positions ignored everywhere)."""
    for name in ("sinusoidal", "expe", "exqpe"):
        torch.manual_seed(0)
        cfg = model_config(n_layers=1, d_model=32, n_heads=4, vocab_size=53, positions={"name": name})
        model = Decoder(cfg).double().eval()
        tokens = torch.randint(0, 53, (1, 8))
        positions = torch.arange(8)[None]
        with torch.no_grad():
            assert not torch.allclose(model(tokens, positions), model(tokens, positions + 37)), name


def test_rope_is_covered():
    assert "rope" in _relative_names() and "nope" in _relative_names()
