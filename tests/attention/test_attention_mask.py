"""The AttentionMask (attention/mask.py): one visibility rule in its block and per-pair forms, built once
per forward by the model and shared by its layers."""

import pytest
import torch

import extrapos.attention.mask as mask_mod
from extrapos.attention import AttentionMask, attention
from extrapos.model import Decoder, model_config
from tests.attention.test_attention import _qkv
from tests.attention.test_document_mask import _documents


@pytest.mark.parametrize(("causal", "window"), [(True, None), (True, 3), (False, None)])  # windows are causal
@pytest.mark.parametrize("with_documents", [False, True])
@pytest.mark.parametrize("Tq", [23, 5, 1])
def test_the_per_pair_form_is_the_block_form(causal, window, with_documents, Tq):
    """FlexAttention's mask_mod, evaluated on every (query, key) pair, is block_visible's dense block."""
    B, Tk = 3, 23
    documents = _documents(B, Tk) if with_documents else None
    mask = AttentionMask(Tq, Tk, causal=causal, documents=documents, window=window)
    mod = mask.mask_mod()
    if not causal and documents is None:
        assert mod is None  # every key visible: no block mask at all
        return
    b = torch.arange(B).view(B, 1, 1)
    qi, kj = torch.arange(Tq).view(1, Tq, 1), torch.arange(Tk).view(1, 1, Tk)
    per_pair = mod(b, 0, qi, kj).expand(B, Tq, Tk)
    dense = mask.visible((0, Tq), (0, Tk), torch.device("cpu"))[:, 0].expand(B, Tq, Tk)
    assert torch.equal(per_pair, dense)
    # the rule itself, written out: causal order, the window, the document
    i = torch.arange(Tq).view(-1, 1) + Tk - Tq
    j = torch.arange(Tk).view(1, -1)
    expected = (j <= i) if causal else torch.ones(Tq, Tk, dtype=torch.bool)
    if window is not None:
        expected = expected & (j > i - window)
    if documents is not None:
        expected = expected & (documents[:, Tk - Tq :, None] == documents[:, None, :])
    assert torch.equal(dense, expected.expand(B, Tq, Tk))


def test_the_model_works_out_the_blocks_once_per_forward(monkeypatch):
    """Four layers share the forward's mask: the blocks of a long document-masked row (a host round
    trip each) are found once, not once per layer; the layers' outputs are those of raw documents."""
    monkeypatch.setattr(mask_mod, "DOCUMENT_BLOCK", 8)  # several blocks at T = 40: the searchsorted path
    calls = []
    real = mask_mod.visible_blocks

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mask_mod, "visible_blocks", counting)
    torch.manual_seed(0)
    cfg = model_config(
        n_layers=4, d_model=32, n_heads=4, vocab_size=61, train_length=64, positions={"name": "nope"}
    )
    model = Decoder(cfg).eval()
    tokens = torch.randint(0, 61, (2, 40))
    positions = torch.arange(40).expand(2, 40)
    documents = _documents(2, 40)
    with torch.no_grad():
        logits = model(tokens, positions, documents=documents)
    assert len(calls) == 1
    # each document alone gives the same logits: the shared mask kept every layer inside its documents
    with torch.no_grad():
        for b in range(2):
            for d in documents[b].unique():
                keep = documents[b] == d
                alone = model(tokens[b : b + 1, keep], positions[b : b + 1, keep])
                torch.testing.assert_close(logits[b : b + 1, keep], alone, atol=1e-5, rtol=1e-5)


def test_a_layer_view_is_kept_per_kind_of_layer():
    documents = _documents(2, 30)
    forward = AttentionMask.for_forward(7, 30, documents=documents)
    windowed = forward.for_keys(12, 6)  # a windowed cache's last 12 keys
    assert forward.for_keys(12, 6) is windowed and forward.for_keys(30) is forward.for_keys(30, None)
    assert torch.equal(windowed.documents, documents[:, -12:]) and windowed.window == 6
    assert forward.for_keys(30, 64).window is None  # a window covering every key is no window


def test_a_mask_and_raw_documents_together_are_refused():
    q, k, v = _qkv(2, 4, 4, 23, 23, 8)
    documents = _documents(2, 23)
    mask = AttentionMask(23, 23, documents=documents)
    torch.testing.assert_close(
        attention(q, k, v, mask=mask), attention(q, k, v, documents=documents), rtol=0, atol=0
    )
    with pytest.raises(ValueError, match="either an attention mask or documents"):
        attention(q, k, v, documents=documents, mask=mask)
    with pytest.raises(ValueError, match="the attention mask is for 23 queries on 23 keys"):
        attention(q[:, :, :5], k, v, mask=mask)
    with pytest.raises(ValueError, match="must not decrease"):
        AttentionMask.for_forward(23, 23, documents=documents.flip(-1))
