"""Sliding-window attention (Mistral, Qwen2): key j is visible from query i iff i - W < j <= i.

Attention level: every kernel path (fused SDPA, the fold, query chunks, logit biases, eager flex) with a
window, alone and with a document mask, equals the materialized reference, gradients included, whole
and in blocks; the mask is Hugging Face's at the boundary, element for element. Model level: a windowed
one-layer model's logits at every position equal a run of its last W tokens alone, for every encoding,
and decoding with the KV cache equals the full forward.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import extrapos.attention.mask as mask_mod
from extrapos.attention import (
    attention,
    attention_reference,
    block_visible,
    chunked_attention,
    flex_forward,
    folded_attention,
    visible_blocks,
)
from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions import registry
from tests.attention.test_attention import SHAPES, _qkv
from tests.attention.test_document_mask import KINDS, _bias, _documents
from tests.model.test_kv_cache import FLAVOURS

W = 6  # shorter than every shape's keys (23 or 30), longer than the decoding shapes' new queries


def _fast(kind, blocks, documents, monkeypatch):
    """The path under test: ``attention`` itself, or each kernel forced into blocks of 4 queries."""
    if blocks == "whole":
        return lambda *a: attention(*a, documents=documents, window=W)
    monkeypatch.setattr(mask_mod, "DOCUMENT_BLOCK", 4)
    if kind == "folded":
        return lambda *a: folded_attention(*a, block=4, documents=documents, window=W)
    if kind == "none":
        return lambda *a: attention(*a, documents=documents, window=W)
    return lambda *a: chunked_attention(*a, chunk_size=4, documents=documents, window=W)


@pytest.mark.parametrize("with_documents", [False, True], ids=["window", "window+documents"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("blocks", ["whole", "blocks"])
def test_every_path_with_a_window_equals_the_reference(kind, shape, with_documents, blocks, monkeypatch):
    B, H, Hkv, Tq, Tk, Dh = SHAPES[shape]
    q, k, v = _qkv(B, H, Hkv, Tq, Tk, Dh)
    bias, params = _bias(kind, B, H, Tq, Tk)
    documents = _documents(B, Tk) if with_documents else None
    leaves = [q, k, v, *params]
    for t in leaves:
        t.requires_grad_(True)
    fast = _fast(kind, blocks, documents, monkeypatch)
    ref = attention_reference(q, k, v, bias, documents=documents, window=W)
    weight = ref.detach().cos()
    grads_ref = torch.autograd.grad((ref * weight).sum(), leaves, allow_unused=True)
    out = fast(q, k, v, bias)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    grads = torch.autograd.grad((out * weight).sum(), leaves, allow_unused=True)
    for g, g_ref in zip(grads, grads_ref):
        assert (g is None) == (g_ref is None)
        if g is not None:
            torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-9)
    with torch.no_grad():  # the inference variants (in-place, fused float masks, decoding rows) too
        torch.testing.assert_close(fast(q, k, v, bias), ref, rtol=1e-9, atol=1e-9)


def test_the_window_changes_the_output_only_past_it():
    q, k, v = _qkv(2, 4, 2, 23, 23, 8)
    windowed, full = attention(q, k, v, window=W), attention(q, k, v)
    torch.testing.assert_close(windowed[:, :, :W], full[:, :, :W], rtol=0, atol=0)
    assert (windowed[:, :, W:] - full[:, :, W:]).abs().amin(dim=-1).max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_a_window_covering_every_key_is_the_unwindowed_path_bit_for_bit(kind):
    B, H, Hkv, Tq, Tk, Dh = SHAPES["gqa-decode"]
    q, k, v = _qkv(B, H, Hkv, Tq, Tk, Dh)
    bias, _ = _bias(kind, B, H, Tq, Tk)
    with torch.no_grad():
        assert torch.equal(attention(q, k, v, bias, window=Tk), attention(q, k, v, bias))


@pytest.mark.parametrize("Tq,Tk", [(16, 16), (5, 16), (1, 16), (3, 40)])
@pytest.mark.parametrize("window", [1, 4, 15, 16])
def test_the_mask_is_hugging_faces_at_the_boundary(Tq, Tk, window):
    """Element for element, transformers' own sliding-window mask (queries at the end of the keys, as
    with its cache: q_offset = the cached length)."""
    masking = pytest.importorskip("transformers.masking_utils")
    hf = masking.sdpa_mask(
        batch_size=1,
        q_length=Tq,
        kv_length=Tk,
        q_offset=Tk - Tq,
        mask_function=masking.sliding_window_causal_mask_function(window),
        allow_is_causal_skip=False,
    )
    ours = block_visible(Tk - Tq, (0, Tq), (0, Tk), window=window)
    assert torch.equal(ours, hf)
    i = Tk - 1  # the last query sees exactly its last `window` keys
    assert ours[0, 0, -1].nonzero().flatten().tolist() == list(range(max(0, i - window + 1), i + 1))


def test_blocks_skip_the_keys_before_each_window():
    assert visible_blocks(64, 64, window=10, block=16) == [
        (0, 16, 0, 16),
        (16, 32, 7, 32),
        (32, 48, 23, 48),
        (48, 64, 39, 64),
    ]
    # one decoded token reads its last W keys only, and with documents never before its document
    assert visible_blocks(1, 100, window=10) == [(0, 1, 90, 100)]
    documents = torch.tensor([[0] * 95 + [1] * 5])
    assert visible_blocks(1, 100, documents=documents, window=10, block=16) == [(0, 1, 95, 100)]


def test_bad_windows_are_refused():
    q, k, v = _qkv(1, 4, 4, 6, 6, 8)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive number"):
            attention(q, k, v, window=bad)
    with pytest.raises(ValueError, match="causal"):
        attention(q, k, v, causal=False, window=3)


@pytest.mark.parametrize("with_documents", [False, True])
@pytest.mark.parametrize("Tq", [23, 5])
def test_flex_window_mask_equals_the_reference(with_documents, Tq):
    """CUDA's path: flex's mask_mod with a window (and documents), run by eager flex on the CPU."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = _qkv(2, 4, 2, Tq, 23, 8)
    documents = _documents(2, 23) if with_documents else None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = flex_forward(q, k, v, None, flex.flex_attention, flex.create_block_mask, True, documents, W)
    ref = attention_reference(q, k, v, documents=documents, window=W)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


# ---- the model ---------------------------------------------------------------------------------


def _windowed(name, flavour="gpt2", window=4, n_layers=1, **extra):
    """``tests/test_kv_cache.make``'s tiny model, with a window: encoding parameters moved off their init."""
    torch.manual_seed(0)
    sizes = dict(d_model=32, n_heads=4, vocab_size=61, train_length=64, **FLAVOURS[flavour])
    cfg = model_config(n_layers=n_layers, positions={"name": name}, sliding_window=window, **sizes, **extra)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(0.05 * torch.randn_like(p))
            if p.dim() == 0:
                p.abs_()
    return model


@pytest.mark.parametrize("name", registry.names())
def test_one_windowed_layer_sees_only_the_last_w_tokens(name):
    """The model's oracle: with one layer, the logits at t are those of tokens t - W + 1 .. t run alone
    at their own positions (whatever the encoding does with the positions it is given)."""
    torch.manual_seed(0)
    model = _windowed(name, window=4)
    T = 12
    tokens = torch.randint(0, 61, (1, T))
    positions = torch.arange(T)[None] + 2
    with torch.no_grad():
        full = model(tokens, positions)
        for t in range(T):
            s = max(0, t - 3)
            alone = model(tokens[:, s : t + 1], positions[:, s : t + 1])[:, -1]
            torch.testing.assert_close(full[:, t], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("flavour,with_documents", [("gpt2", False), ("llama-gqa", True)])
@pytest.mark.parametrize("name", registry.names())
def test_decoding_with_a_window_equals_the_full_forward(name, flavour, with_documents):
    """Layer 1 windowed (W = 3), layer 0 full: its cache drops the keys no query can see any more, and
    decoding token by token, after a prefill and in chunks still gives the full forward's logits."""
    model = _windowed(name, flavour, window=3, n_layers=2, sliding_window_layers=[1])
    B, T = 2, 24
    tokens = torch.randint(0, 61, (B, T))
    positions = torch.arange(T).expand(B, T) + torch.tensor([[3], [1]])
    documents = None
    if with_documents:  # documents of 7, 11 and 6 tokens; of 20 and 4
        documents = torch.stack(
            [(torch.arange(T) >= 7).long() + (torch.arange(T) >= 18), torch.arange(T) >= 20]
        )
        documents = documents.long()
    with torch.no_grad():
        full = model(tokens, positions, documents=documents)
        for chunks in ([1] * T, [5, 1, 1, 4, 3, 1, 4, 1, 4]):
            cache, got, t = model.new_cache(), [], 0
            for c in chunks:
                sl = slice(t, t + c)
                docs = None if documents is None else documents[:, sl]
                got.append(model(tokens[:, sl], positions[:, sl], cache, documents=docs))
                t += c
            torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-5, rtol=1e-5)
            assert len(cache) == T and cache.layers[0].k.n == T  # the full layer keeps every key
            # once 18 keys were held (16 stale) the windowed layer's cache dropped the stale ones
            assert cache.layers[1].k.n < 18 and cache.layers[1].k.buf.shape[2] <= 32
    model.blocks[1].attn.window = None  # the same weights without the window: other logits past it
    with torch.no_grad():
        assert (model(tokens, positions, documents=documents)[:, 3:] - full[:, 3:]).abs().max() > 1e-4


@pytest.mark.parametrize(
    "options,fragment",
    [
        (dict(sliding_window=0), "positive integer"),
        (dict(sliding_window_layers=[0]), "model.sliding_window is not set"),
        (dict(sliding_window=4, sliding_window_layers=[0, 2]), "distinct layers in 0..1"),
        (dict(sliding_window=4, sliding_window_layers=[1, 1]), "distinct layers"),
        (dict(sliding_window=4, flavour="encoder"), "encoder"),
    ],
)
def test_bad_window_options_are_refused(options, fragment):
    with pytest.raises(UserError, match=fragment):
        model_config(n_layers=2, **options)


def test_window_layers_pick_the_layers():
    cfg = model_config(n_layers=3, sliding_window=8, sliding_window_layers=[2, 0])
    assert [cfg.window_at(i) for i in range(3)] == [8, None, 8]
    assert [b.attn.window for b in Decoder(cfg).blocks] == [8, None, 8]
    assert model_config(n_layers=2, sliding_window=8).window_at(1) == 8
    assert model_config(n_layers=2).window_at(0) is None


def test_attention_statistics_see_the_window():
    """`extrapos attention`'s probabilities are the layer's own: with a window, none past it."""
    from extrapos.evaluate.attention_stats import Accumulator, attention_probabilities, model_statistics

    q, k, v = _qkv(2, 4, 2, 23, 23, 8)
    probs, visible = attention_probabilities(q, k, window=W)
    torch.testing.assert_close(probs @ v.repeat_interleave(2, dim=1), attention_reference(q, k, v, window=W))
    assert visible.sum(-1).max() == W
    model = _windowed("rope", window=3, n_layers=2, sliding_window_layers=[1])
    accs = [[Accumulator()], [Accumulator()]]
    model_statistics(model, torch.randint(0, 61, (1, 24)), torch.arange(24)[None], accs)
    far = [max(acc[0].means()["median_distance"]) for acc in accs]
    assert far[1] <= 2 < far[0]  # the windowed layer looks back at most W - 1 = 2 tokens
