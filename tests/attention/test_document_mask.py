"""Document masks: a packed row of several documents, masked, computes what each document would alone.

Attention level: every kernel path (fused SDPA, the fold, query chunks, logit biases) with a document
mask equals the materialized reference, gradients included, in blocks or whole. Model level: for
every registered encoding, the logits of a packed, document-masked row whose positions restart at
each document equal those of each document run alone, without and with the KV cache.
"""

from __future__ import annotations

import pytest
import torch

import extrapos.attention.mask as mask_mod
from extrapos.attention import (
    attention,
    attention_reference,
    chunked_attention,
    document_blocks,
    folded_attention,
)
from extrapos.model import Decoder, model_config
from extrapos.positions import registry
from extrapos.positions.base import LogitBias
from tests.attention.test_attention import SHAPES, _folded, _pairwise, _pairwise_per_head, _qkv
from tests.model.test_kv_cache import FLAVOURS, make  # tiny models, encoding parameters moved off their init

F64 = torch.float64


def _documents(B, Tk):
    """Rows of several documents of different lengths, numbered from different starts."""
    cuts = [[5, 14], [12], [3, 4, 20]]
    rows = []
    for b in range(B):
        row = torch.zeros(Tk, dtype=torch.long)
        for c in cuts[b % len(cuts)]:
            row[c:] += 1
        rows.append(row + 3 * b)
    return torch.stack(rows)


def _bias(kind, B, H, Tq, Tk):
    if kind == "none":
        return None, ()
    if kind == "folded":
        bias = _folded(B, H, Tq, Tk)
        return bias, (bias.q_feat, bias.k_feat)
    if kind == "pairwise":
        return _pairwise(B, H, Tq, Tk)
    if kind == "pairwise-per-head":
        return _pairwise_per_head(B, H, Tq, Tk)

    # a logit bias that reads its row: a CoPE-like count of the visible keys' gates
    def fn(scores, q, qf, kf, visible):
        gates = torch.sigmoid(scores).masked_fill(~visible, 0.0)
        return -0.3 * gates.flip(-1).cumsum(-1).flip(-1)

    return LogitBias(
        q_feat=torch.zeros(B, 1, Tq, 0, dtype=F64), k_feat=torch.zeros(B, 1, Tk, 0, dtype=F64), fn=fn
    ), ()


KINDS = ["none", "folded", "pairwise", "pairwise-per-head", "logit"]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("blocks", ["whole", "blocks"])
def test_every_path_with_a_document_mask_equals_the_reference(kind, shape, causal, blocks, monkeypatch):
    B, H, Hkv, Tq, Tk, Dh = SHAPES[shape]
    q, k, v = _qkv(B, H, Hkv, Tq, Tk, Dh)
    bias, params = _bias(kind, B, H, Tq, Tk)
    documents = _documents(B, Tk)
    leaves = [q, k, v, *params]
    for t in leaves:
        t.requires_grad_(True)
    if blocks == "blocks":  # query blocks of 4 (and the key range of each), on every path
        monkeypatch.setattr(mask_mod, "DOCUMENT_BLOCK", 4)
        if kind == "folded":
            fast = lambda *a: folded_attention(*a, block=4, causal=causal, documents=documents)  # noqa: E731
        elif kind in ("none",):
            fast = lambda *a: attention(*a, causal=causal, documents=documents)  # noqa: E731
        else:
            fast = lambda *a: chunked_attention(*a, chunk_size=4, causal=causal, documents=documents)  # noqa: E731
    else:
        fast = lambda *a: attention(*a, causal=causal, documents=documents)  # noqa: E731
    ref = attention_reference(q, k, v, bias, causal=causal, documents=documents)
    weight = ref.detach().cos()
    grads_ref = torch.autograd.grad((ref * weight).sum(), leaves, allow_unused=True)
    out = fast(q, k, v, bias)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    grads = torch.autograd.grad((out * weight).sum(), leaves, allow_unused=True)
    for g, g_ref in zip(grads, grads_ref):
        assert (g is None) == (g_ref is None)
        if g is not None:
            torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-9)
    with torch.no_grad():  # the inference variants (in-place, fused float masks) too
        torch.testing.assert_close(fast(q, k, v, bias), ref, rtol=1e-9, atol=1e-9)


def test_the_reference_mask_differs_from_no_mask():
    """The mask matters: documents change the output where a query's window holds another document."""
    q, k, v = _qkv(2, 4, 4, 23, 23, 8)
    documents = _documents(2, 23)
    masked = attention(q, k, v, documents=documents)
    plain = attention(q, k, v)
    first = documents[0] == documents[0, 0]
    torch.testing.assert_close(masked[0, :, first], plain[0, :, first])
    assert (masked[0, :, ~first] - plain[0, :, ~first]).abs().max() > 1e-3


def test_blocks_skip_the_keys_before_each_document():
    documents = torch.tensor([[0] * 10 + [1] * 30 + [2] * 24])
    blocks = document_blocks(documents, Tq=64, causal=True, block=16)
    assert blocks == [(0, 16, 0, 16), (16, 32, 10, 32), (32, 48, 10, 48), (48, 64, 40, 64)]
    # one decoded token after the packed row reads only its own document
    assert document_blocks(torch.tensor([[0] * 40 + [1] * 4]), Tq=1, causal=True, block=16) == [
        (0, 1, 40, 44)
    ]
    # bidirectional: a block reaches the end of its last query's document
    assert document_blocks(documents, Tq=64, causal=False, block=16)[0] == (0, 16, 0, 40)


def test_bad_documents_are_refused():
    q, k, v = _qkv(1, 4, 4, 6, 6, 8)
    with pytest.raises(ValueError, match="must not decrease"):
        attention(q, k, v, documents=torch.tensor([[0, 0, 1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="integer"):
        attention(q, k, v, documents=torch.zeros(1, 5, dtype=torch.long))


# ---- the model: packed + masked == each document alone -------------------------------------------

LENGTHS = [[5, 9, 4], [7, 11]]  # two packed rows of 18 tokens


def packed_rows(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens, positions, documents = [], [], []
    for row in lengths:
        tokens.append(torch.randint(0, 61, (sum(row),), generator=g))
        positions.append(torch.cat([torch.arange(n) for n in row]))
        documents.append(torch.cat([torch.full((n,), d) for d, n in enumerate(row)]))
    return torch.stack(tokens), torch.stack(positions), torch.stack(documents)


def alone(model, tokens, lengths):
    """The logits of every document of every row, each run by itself from position 0."""
    out = torch.empty(*tokens.shape, model.cfg.vocab_size)
    for b, row in enumerate(lengths):
        s = 0
        for n in row:
            out[b, s : s + n] = model(tokens[b : b + 1, s : s + n], torch.arange(n)[None])[0]
            s += n
    return out


@pytest.mark.parametrize("flavour", list(FLAVOURS))
@pytest.mark.parametrize("name", registry.names())
def test_packed_masked_row_equals_each_document_alone(name, flavour):
    model = make(name, flavour)
    tokens, positions, documents = packed_rows(LENGTHS)
    with torch.no_grad():
        want = alone(model, tokens, LENGTHS)
        packed = model(tokens, positions, documents=documents)
        torch.testing.assert_close(packed, want, atol=1e-5, rtol=1e-5)
        for chunks in ([1] * 18, [6, 1, 5, 6]):  # token by token, and chunks that cross documents
            cache, got, t = model.new_cache(), [], 0
            for c in chunks:
                sl = slice(t, t + c)
                got.append(model(tokens[:, sl], positions[:, sl], cache, documents=documents[:, sl]))
                t += c
            torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-5, rtol=1e-5)


def test_unnumbered_tokens_after_a_masked_prefill_continue_the_last_document():
    model = make("alibi")
    tokens, positions, documents = packed_rows([[6, 5]])
    with torch.no_grad():
        cache = model.new_cache()
        model(tokens[:, :8], positions[:, :8], cache, documents=documents[:, :8])
        steps = [model(tokens[:, t : t + 1], positions[:, t : t + 1], cache) for t in range(8, 11)]
        want = model(tokens[:, 6:], torch.arange(5)[None])
    torch.testing.assert_close(torch.cat(steps, 1), want[:, 2:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="without document numbers"):
        cache = model.new_cache()
        model(tokens[:, :4], positions[:, :4], cache)
        model(tokens[:, 4:6], positions[:, 4:6], cache, documents=documents[:, 4:6])


@pytest.mark.parametrize("name", [n for n in registry.names() if registry.spec(n).cls.causal_only is None])
def test_encoder_packed_masked_row_equals_each_document_alone(name):
    """Bidirectional attention under the mask: a token sees its whole document, and no other."""
    torch.manual_seed(0)
    cfg = model_config(
        flavour="encoder",
        n_layers=2,
        d_model=32,
        n_heads=4,
        vocab_size=61,
        train_length=16,
        positions={"name": name},
    )
    model = Decoder(cfg).eval()
    tokens, positions, documents = packed_rows(LENGTHS)
    with torch.no_grad():
        torch.testing.assert_close(
            model(tokens, positions, documents=documents), alone(model, tokens, LENGTHS), atol=1e-5, rtol=1e-5
        )


# ---- CUDA's path: FlexAttention's mask_mod, checked with eager flex on CPU ------------------------


def test_flex_document_mask_without_a_bias_equals_the_reference(monkeypatch):
    """On CUDA a document-masked forward without a bias goes to flex (a mask_mod and no score_mod):
    eager flex on CPU in fp64, gradients included, equals the materialized reference."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    monkeypatch.setattr(flex, "_validate_device", lambda q, k, v: None)
    import warnings

    from extrapos.attention import flex_forward as _flex

    B, H, Hkv, Tq, Tk, Dh = SHAPES["gqa-decode"]
    q, k, v = (t.requires_grad_() for t in _qkv(B, H, Hkv, Tq, Tk, Dh))
    documents = _documents(B, Tk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = _flex(q, k, v, None, flex.flex_attention, flex.create_block_mask, True, documents)
    ref = attention_reference(q, k, v, None, documents=documents)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_flex_is_chosen_for_document_masks_on_cuda_only():
    from extrapos.attention import flex_wanted

    f32 = torch.float32
    assert flex_wanted("cuda", True, 0.0, 512, f32, None, documents=True)  # masked training
    assert flex_wanted("cuda", False, 0.0, 512, f32, None, documents=True)  # long masked forwards
    assert not flex_wanted("cuda", False, 0.0, 1, f32, None, documents=True)  # decoding steps
    assert not flex_wanted("cuda", True, 0.0, 512, f32, None)  # no mask, no bias: fused SDPA as before
    assert not flex_wanted("cpu", True, 0.0, 512, f32, None, documents=True)
    assert not flex_wanted("cuda", True, 0.1, 512, f32, None, documents=True)  # flex has no dropout
