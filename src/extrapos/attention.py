"""The one place that turns q, k, v (+ a bias description) into attention outputs.

Shapes: q (B, H, Tq, d_h); k, v (B, H_kv, Tk, d_h) with H % H_kv == 0; Tq <= Tk. Attention is
causal with the queries aligned to the END of the keys (query t sees keys j <= t + Tk - Tq),
which covers both full forwards (Tq == Tk) and cached decoding (Tq new tokens after Tk - Tq).
``causal=False`` (the encoder flavour, docs/encoder.md) drops the mask: every query sees every key,
on every path below. ``documents`` (B, Tk), the document number of every key (non-decreasing along
a row: a packed row of several documents, docs/packing.md), keeps each query inside its own
document on every path: the queries run in blocks that skip the keys before their documents
start (``document_blocks``), each block with its (B, 1, tq, tk) visibility mask. ``window`` W, a
sliding window (Mistral, Qwen2: Jiang et al. 2023, §2; Beltagy et al. 2020, §3.1), keeps each query
to its last W keys, itself included: key j is visible from query i iff i - W < j <= i (Hugging Face's
``sliding_window_overlay``), through the same blocks, which then also skip the keys before the window.

``attention`` picks the kernel; every path equals ``attention_reference`` in the tests:
no bias -> fused SDPA; ``FoldedBias`` (ALiBi, CABLE) -> one extra q/k dimension in fused SDPA,
block by block; ``PairwiseBias`` (Kerple, FIRE, T5, K-CABLE) -> query chunks, checkpointed in
training; ``LogitBias`` (CoPE, DAPE: the bias reads the row's logits) -> the same query chunks,
never FlexAttention; CUDA -> FlexAttention for long no-grad forwards, and in training for the pairwise
biases with a per-pair form (``flex_wanted``). Why, and the measured precision of each path:
docs/attention.md.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from extrapos.positions.base import Bias, FoldedBias, LogitBias, PairwiseBias

#: elements (B * H * chunk * Tk) of one query-chunk score block in the pairwise path: 4M floats =
#: 16 MB per block; the bias functions keep a few blocks alive (FIRE's MLP hidden layer is
#: 32 / H blocks), so a 16k-token evaluation peaks at a few hundred MB per layer.
CHUNK_ELEMENTS = 1 << 22
#: never use chunks smaller than this many queries (matmul efficiency)
MIN_CHUNK = 16
#: score blocks of up to this many elements (1 MB in fp32) are always allowed: training lengths
#: (T <= 256 at H = 4, T <= 512 at H = 1) run as one block, exactly like the reference
MIN_BLOCK_ELEMENTS = 1 << 18
#: queries per block of a contiguous DistanceBias at inference (fused SDPA, zero-copy Toeplitz mask):
#: large enough to keep the kernel busy, small enough that the skipped future keys stay few
TOEPLITZ_CHUNK = 256
#: queries sharing one k_feat shift in the folded path; longer forwards fold block by block (precision)
FOLD_BLOCK = 256
#: no-grad forwards of at most this many queries (decoding steps) evaluate a pairwise bias's rows
#: directly: a row holds as many values as the distance table, and skips its layout checks
DECODE_QUERIES = 4
#: FlexAttention (CUDA) only for no-grad forwards with at least this many queries, see ``flex_wanted``
FLEX_MIN_QUERIES = 128
#: queries per block of a document-masked forward on the fused paths: a block sees the keys from the
#: start of its first query's document, so with short documents the (block, keys) masks stay small
DOCUMENT_BLOCK = 1024


def _expand_kv(k: Tensor, n_heads: int) -> Tensor:
    if k.shape[1] == n_heads:
        return k
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax (and bias addition) in fp32 for half-precision inputs, fp64 stays fp64."""
    return torch.promote_types(dtype, torch.float32)


def bias_block(bias: Bias, q_slice: slice | None = None) -> Tensor:
    """Materialize the bias for a block of queries: (B, H or 1, tq, Tk)."""
    if isinstance(bias, FoldedBias):
        qf = bias.q_feat if q_slice is None else bias.q_feat[:, :, q_slice]
        return qf.unsqueeze(-1) * bias.k_feat.unsqueeze(-2)
    if isinstance(bias, PairwiseBias):
        qf = bias.q_feat if q_slice is None else bias.q_feat[:, :, q_slice]
        return bias.fn(qf, bias.k_feat)
    if isinstance(bias, LogitBias):
        raise TypeError("a LogitBias depends on the attention logits; use attention_reference or attention")
    raise TypeError(f"unknown bias description {type(bias).__name__}")


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None = None,
    dropout_p: float = 0.0,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Plain materialized softmax(q k^T / sqrt(d_h) + bias (+ causal, window and document masks)) v. The
    tests' ground truth."""
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    _check_window(window, causal)
    k, v = _expand_kv(k, H), _expand_kv(v, H)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
    i = torch.arange(Tq, device=q.device).unsqueeze(-1) + (Tk - Tq)
    j = torch.arange(Tk, device=q.device)
    visible = (j <= i) if causal else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
    if window is not None:
        visible = visible & (j > i - window)
    if documents is not None:
        visible = visible & (documents[:, Tk - Tq :, None] == documents[:, None, :]).unsqueeze(1)
    if isinstance(bias, LogitBias):
        scores = scores + bias.fn(scores, q, bias.q_feat, bias.k_feat, visible).to(scores.dtype)
    elif bias is not None:
        scores = scores + bias_block(bias).to(scores.dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores.to(_softmax_dtype(scores.dtype)), dim=-1).to(v.dtype)
    if dropout_p:
        weights = torch.dropout(weights, dropout_p, train=True)
    return weights @ v


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None = None,
    dropout_p: float = 0.0,
    *,
    chunk_size: int | None = None,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Causal (or, ``causal=False``, bidirectional) attention, see module docstring; dropout_p applies
    to the attention weights; ``documents`` (B, Tk) keeps every query inside its own document;
    ``window`` W (causal only) to its last W keys.

    ``chunk_size`` (queries per block of the pairwise path) defaults to ``CHUNK_ELEMENTS`` worth.
    """
    _check_shapes(q, k, v)
    window = cutting_window(window, causal, k.shape[2])
    if documents is not None:
        _check_documents(documents, k)
    if _flex_wanted(q, bias, dropout_p, documents, window):
        out = _flex_or_none(q, k, v, bias, causal, documents, window)
        if out is not None:
            return out
    if bias is None:
        if documents is not None or window is not None:
            return _masked_sdpa(q, k, v, dropout_p, causal, documents, window)
        return _sdpa(q, k, v, dropout_p, causal=causal)
    if isinstance(bias, FoldedBias):
        return folded_attention(q, k, v, bias, dropout_p, causal=causal, documents=documents, window=window)
    if isinstance(bias, (PairwiseBias, LogitBias)):
        return chunked_attention(
            q, k, v, bias, dropout_p, chunk_size=chunk_size, causal=causal, documents=documents, window=window
        )
    raise TypeError(f"unknown bias description {type(bias).__name__}")


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"attention wants q (B,H,Tq,d), k/v (B,H_kv,Tk,d); got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1] or q.shape[2] > k.shape[2]:
        raise ValueError(f"need H % H_kv == 0 and Tq <= Tk; got q {tuple(q.shape)}, k {tuple(k.shape)}")


def _causal_mask(Tq: int, Tk: int, device: torch.device) -> Tensor:
    """Boolean (Tq, Tk) mask, True where query t may attend key j (bottom-right aligned)."""
    i = torch.arange(Tq, device=device).unsqueeze(-1) + (Tk - Tq)
    return torch.arange(Tk, device=device) <= i


def _sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    scale: float | None = None,
    causal: bool = True,
    mask: Tensor | None = None,
) -> Tensor:
    """Fused SDPA, causal with bottom-right alignment (or unmasked), or with an explicit boolean ``mask``
    (True = visible) instead; GQA without copying k/v."""
    Tq, Tk = q.shape[2], k.shape[2]
    kwargs = {"dropout_p": dropout_p, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
    if Tq == 1:  # the one new token sees every key
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(Tq, Tk, q.device), **kwargs)


# ---- document masks ---------------------------------------------------------------------------


def _check_documents(documents: Tensor, k: Tensor) -> None:
    if documents.shape != (k.shape[0], k.shape[2]) or documents.dtype.is_floating_point:
        raise ValueError(
            f"documents must be integer (B, Tk) = {(k.shape[0], k.shape[2])}, got {documents.dtype} "
            f"{tuple(documents.shape)}"
        )
    if not documents.is_cuda:  # on CUDA the model checks once per forward (no host sync per layer)
        check_document_order(documents)


def check_document_order(documents: Tensor) -> None:
    """Document numbers must not decrease along a row: the blocks rely on each document being contiguous."""
    if documents.shape[-1] > 1 and not bool((documents[..., 1:] >= documents[..., :-1]).all()):
        raise ValueError("document numbers must not decrease along a row (a packed row's documents in order)")


def document_visible(
    documents: Tensor, past: int, queries: tuple[int, int], keys: tuple[int, int], causal: bool = True
) -> Tensor:
    """(B, 1, tq, tk) bool: key j (of ``keys`` = [k0, k1)) visible from query i (of ``queries`` = [q0, q1),
    at key index past + i): in the query's document and, causally, not after it."""
    return block_visible(past, queries, keys, documents=documents, causal=causal)


def block_visible(
    past: int,
    queries: tuple[int, int],
    keys: tuple[int, int],
    *,
    documents: Tensor | None = None,
    window: int | None = None,
    causal: bool = True,
    device: torch.device | None = None,
) -> Tensor:
    """(B or 1, 1, tq, tk) bool: key j (of ``keys`` = [k0, k1)) visible from query i (of ``queries`` =
    [q0, q1), at key index past + i): in the query's document (``documents``), causally not after it,
    and within its ``window`` (i - W < j); on ``device`` (default the documents')."""
    (q0, q1), (k0, k1) = queries, keys
    device = documents.device if documents is not None else device
    visible = None
    if causal:
        i = torch.arange(q0, q1, device=device).unsqueeze(-1) + past
        j = torch.arange(k0, k1, device=device)
        visible = j <= i
        if window is not None:
            visible = visible & (j > i - window)
    if documents is not None:
        same = documents[:, past + q0 : past + q1, None] == documents[:, None, k0:k1]
        visible = same if visible is None else same & visible
    assert visible is not None, "bidirectional blocks without documents have nothing to mask"
    return visible.unsqueeze(1) if visible.dim() == 3 else visible[None, None]


def document_blocks(
    documents: Tensor, Tq: int, causal: bool = True, block: int = DOCUMENT_BLOCK
) -> list[tuple[int, int, int, int]]:
    """Blocks (q0, q1, k0, k1) of queries and the keys they may see: from the start of the block's first
    query's document (the earliest over the batch) to its last query (causal) or to the end of its last
    query's document. Documents are contiguous in a row, so no visible key is left out, and a decoded
    token after a long packed prompt reads only its own document's keys."""
    return visible_blocks(Tq, documents.shape[1], documents=documents, causal=causal, block=block)


def visible_blocks(
    Tq: int,
    Tk: int,
    *,
    documents: Tensor | None = None,
    window: int | None = None,
    causal: bool = True,
    block: int = DOCUMENT_BLOCK,
) -> list[tuple[int, int, int, int]]:
    """``document_blocks`` under a document mask and / or a sliding ``window``: a block's keys also start
    no earlier than its first query's window (past + q0 - W + 1), so a decoded token with a window
    reads its last W keys only, and a long forward's blocks hold (block, block + W - 1) masks."""
    past = Tk - Tq

    def window_start(q0: int) -> int:
        return 0 if window is None else max(0, past + q0 - window + 1)

    if documents is None:  # a window alone (always causal): no host round trip
        return [
            (q0, min(q0 + block, Tq), window_start(q0), past + min(q0 + block, Tq))
            for q0 in range(0, Tq, block)
        ]
    if Tq <= block and Tk <= 2 * block:  # one block over every key: no host round trip to find the ranges
        return [(0, Tq, window_start(0), Tk)]
    documents = documents.contiguous()
    starts = torch.searchsorted(documents, documents, side="left")  # rows are sorted: first index of each
    ends = torch.searchsorted(documents, documents, side="right")
    out = []
    for q0 in range(0, Tq, block):
        q1 = min(q0 + block, Tq)
        k0 = max(int(starts[:, past + q0].min()), window_start(q0))
        k1 = past + q1 if causal else int(ends[:, past + q1 - 1].max())
        out.append((q0, q1, k0, k1))
    return out


def _masked_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    causal: bool,
    documents: Tensor | None,
    window: int | None,
) -> Tensor:
    """Fused SDPA under a document mask and / or a sliding window, block by block (``visible_blocks``)."""
    Tq, Tk = q.shape[2], k.shape[2]
    past = Tk - Tq
    outs = []
    for q0, q1, k0, k1 in visible_blocks(Tq, Tk, documents=documents, window=window, causal=causal):
        mask = None  # one query of a window alone: its keys are exactly k0..k1, nothing to mask
        if documents is not None or q1 - q0 > 1:
            mask = block_visible(
                past, (q0, q1), (k0, k1), documents=documents, window=window, causal=causal, device=q.device
            )
        outs.append(
            _sdpa(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], dropout_p, causal=causal, mask=mask)
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


# ---- sliding windows --------------------------------------------------------------------------


def _check_window(window: int | None, causal: bool) -> None:
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"a sliding window must be a positive number of keys, got {window!r}")
    if not causal:
        raise ValueError("a sliding window is causal (i - W < j <= i); bidirectional attention has none")


def cutting_window(window: int | None, causal: bool, Tk: int) -> int | None:
    """``window`` when it hides some key from some query, else None: with Tk <= W every query sees all
    of its earlier keys, and the unwindowed paths run unchanged (bit-identical)."""
    _check_window(window, causal)
    return None if window is None or Tk <= window else window


# ---- folded bias ------------------------------------------------------------------------------


def _fold_dtype(dtype: torch.dtype) -> torch.dtype:
    """The fold runs in at least fp32: bf16 has 8 mantissa bits, so k_feat = j (ALiBi) or S_j
    (CABLE) would be rounded to multiples of 128 near 16k and the bias would be wrong by whole
    logits. fp64 inputs stay fp64."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def folded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: FoldedBias,
    dropout_p: float = 0.0,
    *,
    subtract_reference: bool = True,
    fold_dtype: torch.dtype | None = None,
    block: int | None = None,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Fused SDPA with a rank-one bias folded into one extra q/k dimension (exact, see module doc).

    Precision: the logit error of q_feat_i * k_feat_j grows with |k_feat_j|, so k_feat is shifted
    by the value of the last key each query can see (exact: a row constant). Up to ``block``
    queries (default ``FOLD_BLOCK``) share one shift, the last key's; longer forwards run one SDPA
    call per block of queries with its own shift, so every query's nearby keys have small features
    (max error at 16k positions drops from ~1e-3 to ~1e-6 in fp32, docs/attention.md).
    ``subtract_reference`` and ``fold_dtype`` exist for the precision measurements in
    ``benchmarks/bench_attention.py``; the defaults are the right choice. Bidirectional
    (``causal=False``): every block sees all keys and is shifted by the key at its last query's
    position (still a row constant, and still small near each query). With ``documents`` or a sliding
    ``window`` the blocks are ``visible_blocks`` of the same size, each shifted by its last query's own key.
    """
    B, H, Tq, Dh = q.shape
    Tk, Hkv = k.shape[2], k.shape[1]
    window = cutting_window(window, causal, Tk)
    dtype = fold_dtype or _fold_dtype(q.dtype)
    masked = documents is not None or window is not None
    inference = not torch.is_grad_enabled() and causal and not masked and subtract_reference
    if inference and fold_dtype is None and block is None and not dropout_p and H * Tq <= Hkv * Dh:
        # decoding: the bias rows (B, H, Tq, Tk) are smaller than a folded copy of the keys
        qf, kf = bias.q_feat, bias.k_feat
        if qf.dtype != dtype or kf.dtype != dtype:
            qf, kf = qf.to(dtype), kf.to(dtype)
        out = _bias_rows_attention(q, k, v, qf if Tq == 1 else qf.expand(B, H, Tq), kf, dtype)
        return out if out.dtype == q.dtype else out.to(q.dtype)
    qf = bias.q_feat.to(dtype).expand(B, H, Tq)
    kf = bias.k_feat.to(dtype)
    if inference and not dropout_p:
        return _folded_inference(q, k, v, qf, kf, dtype, block or max(FOLD_BLOCK, H * Dh)).to(q.dtype)
    if kf.shape[1] not in (1, Hkv):  # per-query-head key features: k and v need all H heads
        k, v, Hkv = _expand_kv(k, H), _expand_kv(v, H), H
    kf = kf.expand(B, Hkv, Tk)
    # blocks of queries whose (block, Tk) mask (the CPU kernel makes it float) is no larger than the keys
    block = block or max(FOLD_BLOCK, H * Dh)
    past = Tk - Tq
    if masked:
        outs = []
        for q0, q1, k0, k1 in visible_blocks(
            Tq, Tk, documents=documents, window=window, causal=causal, block=block
        ):
            mask = block_visible(
                past, (q0, q1), (k0, k1), documents=documents, window=window, causal=causal, device=q.device
            )
            args = (q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], qf[:, :, q0:q1], kf[:, :, k0:k1])
            ref = past + q1 - 1 - k0  # the block's last query's own key: visible to it, near the others
            outs.append(_fold_call(*args, dropout_p, dtype, subtract_reference, causal, ref, mask))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    elif Tq <= block or not subtract_reference:
        ref = -1 if causal else past + Tq - 1
        out = _fold_call(q, k, v, qf, kf, dropout_p, dtype, subtract_reference, causal, ref)
    else:
        outs = []
        for s in reversed(range(0, Tq, block)):  # largest first, as in chunked_attention
            e = min(s + block, Tq)
            kend = past + e if causal else Tk
            args = (q[:, :, s:e], k[:, :, :kend], v[:, :, :kend], qf[:, :, s:e], kf[:, :, :kend])
            outs.append(_fold_call(*args, dropout_p, dtype, True, causal, past + e - 1))
        out = torch.cat(outs[::-1], dim=2)
    return out.to(q.dtype)


def _fold_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    qf: Tensor,
    kf: Tensor,
    dropout_p: float,
    dtype: torch.dtype,
    shift: bool,
    causal: bool = True,
    ref: int = -1,
    mask: Tensor | None = None,
) -> Tensor:
    """One SDPA call over q' = [q, qf sqrt(d_h), 0..], k' = [k, kf, 0..], v' = [v, 0..]; ``ref``: the key
    whose feature is subtracted (causal: the last one, which the last query sees); ``mask``: an explicit
    visibility mask instead of the causal one."""
    B, H, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if shift:
        kf = (
            kf - kf[..., ref : ref + 1 if ref != -1 else None].detach()
        )  # a per-(b, h) constant: a row constant
    pad = 8 - Dh % 8  # >= 1 extra dims: fused kernels want head dims that are multiples of 8
    q2 = torch.cat(
        [q.to(dtype), (qf * math.sqrt(Dh)).unsqueeze(-1), q.new_zeros(B, H, Tq, pad - 1, dtype=dtype)], -1
    )
    k2 = torch.cat([k.to(dtype), kf.unsqueeze(-1), k.new_zeros(B, Hkv, Tk, pad - 1, dtype=dtype)], -1)
    v2 = F.pad(v.to(dtype), (0, pad))
    # autocast would cast the fp32 fold back to half precision: keep it off here
    with torch.autocast(q.device.type, enabled=False):
        out = _sdpa(q2, k2, v2, dropout_p, scale=1.0 / math.sqrt(Dh), causal=causal, mask=mask)
    return out[..., :Dh]


def _fold_width(Dh: int, device: torch.device) -> int:
    """Head dim of the fold at inference: d_h + 1 on the CPU, whose flash kernel is fastest on the
    unpadded size (padding 32 + 1 to 40 costs ~25% more time there); the next multiple of 8 elsewhere
    (CUDA's fused kernels want multiples of 8)."""
    return Dh + 1 if device.type == "cpu" else Dh + 8 - Dh % 8


def _bias_rows_attention(
    q: Tensor, k: Tensor, v: Tensor, qf: Tensor, kf: Tensor, dtype: torch.dtype
) -> Tensor:
    """A few queries (decoding): the folded bias's rows qf_i * (kf_j - kf_last), the causal mask in
    them, as SDPA's float mask on the keys as they are (no folded copy of the cache each step).
    Same shift as the fold's single block, so the same precision."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    kf = kf - kf[..., -1:]
    if kf.shape[1] not in (1, H):  # key features per key head: one row per query head
        kf = kf.repeat_interleave(H // kf.shape[1], dim=1)
    if Tq == 1:  # one new token: the same products, with two fewer ops per layer and step
        rows = (kf * qf).unsqueeze(-2)  # (B, H, 1, Tk)
    else:
        rows = qf.unsqueeze(-1) * kf.unsqueeze(-2)  # (B, H, Tq, Tk)
        rows = rows.masked_fill_(~_causal_mask(Tq, Tk, q.device), float("-inf"))
    gqa = H != k.shape[1]
    # a decoding step is a few microseconds of work per op: skip the casts and the autocast context
    # when they would change nothing (each costs as much as a small kernel, ~1-3 us on the CPU)
    if q.dtype == k.dtype == v.dtype == dtype and not torch.is_autocast_enabled(q.device.type):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=rows, enable_gqa=gqa)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with torch.autocast(q.device.type, enabled=False):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=rows, enable_gqa=gqa)


def _widened(x: Tensor, width: int, dtype: torch.dtype) -> Tensor:
    """x (..., d) as the first d columns of a (..., width) tensor in ``dtype`` whose other columns are 0:
    written once (an empty tensor, then the copy and the zero columns), where zeros then a copy would
    write every element twice (a 16x evaluation's q', k', v' are megabytes per layer)."""
    d = x.shape[-1]
    out = x.new_empty(*x.shape[:-1], width, dtype=dtype)
    out[..., :d] = x
    out[..., d:] = 0
    return out


def _folded_inference(
    q: Tensor, k: Tensor, v: Tensor, qf: Tensor, kf: Tensor, dtype: torch.dtype, block: int
) -> Tensor:
    """The causal fold without autograd, the training fold's numbers up to rounding: q', k', v' built
    once (not per block), each block of queries rewriting only k''s feature column with its own
    shift, and every block's bottom-right causal mask a view of one (block, Tk) float mask (the CPU
    kernel would convert a boolean mask to float per call)."""
    B, H, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if kf.shape[1] not in (1, Hkv):  # per-query-head key features: k and v need all H heads
        k, v, Hkv = _expand_kv(k, H), _expand_kv(v, H), H
    width = _fold_width(Dh, q.device)
    q2, k2, v2 = (_widened(t, width, dtype) for t in (q, k, v))
    q2[..., Dh] = qf * math.sqrt(Dh)
    kf = kf.expand(B, Hkv, Tk)
    past, scale, gqa = Tk - Tq, 1.0 / math.sqrt(Dh), H != Hkv
    with torch.autocast(q.device.type, enabled=False):
        if Tq <= block:
            k2[..., Dh] = kf - kf[..., -1:]
            if Tq == Tk:
                out = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, scale=scale, enable_gqa=gqa)
            else:
                mask = None if Tq == 1 else _causal_mask(Tq, Tk, q.device)
                out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, scale=scale, enable_gqa=gqa)
            return out[..., :Dh]
        # bottom-right causal (the last block's): -inf on the keys after each query, in two passes
        mask = torch.full((block, Tk), float("-inf"), dtype=dtype, device=q.device).triu_(Tk - block + 1)
        outs = []
        for s in reversed(range(0, Tq, block)):  # largest first, as in chunked_attention
            e = min(s + block, Tq)
            kend = past + e
            # the block's last query's own key: shifting by it is exact (a row constant), and it is near
            # every query of the block; SDPA has returned, so the column can be rewritten in place
            k2[:, :, :kend, Dh] = kf[:, :, :kend] - kf[:, :, kend - 1 : kend]
            out = F.scaled_dot_product_attention(
                q2[:, :, s:e],
                k2[:, :, :kend],
                v2[:, :, :kend],
                attn_mask=mask[block - (e - s) :, Tk - kend :],
                scale=scale,
                enable_gqa=gqa,
            )
            outs.append(out[..., :Dh])
        return torch.cat(outs[::-1], dim=2)


# ---- pairwise bias: query chunks -------------------------------------------------------------


def default_chunk_size(B: int, H: int, Tq: int, Tk: int, Dh: int | None = None) -> int:
    """Queries per block: one (B, H, chunk, Tk) score block holds at most CHUNK_ELEMENTS elements and,
    for long sequences, no more than the layer's keys (B, H, Tk, d_h) do, so the blocks add a
    bounded fraction to what a forward holds anyway (small models stay within ~1.2x of NoPE's
    evaluation memory at 16k; big models keep big, fast blocks). Sequences whose whole score matrix
    fits in MIN_BLOCK_ELEMENTS (under autograd: CHUNK_ELEMENTS) run as one block."""
    whole = B * H * Tq * Tk
    if whole <= MIN_BLOCK_ELEMENTS or (torch.is_grad_enabled() and whole <= CHUNK_ELEMENTS):
        # training lengths (B H T^2 <= 4M, e.g. 8 x 4 x 256^2) run whole: checkpointed chunks would
        # recompute their forward in backward and pay per-chunk overhead, for memory a step can spare
        return Tq
    budget = CHUNK_ELEMENTS if Dh is None else min(CHUNK_ELEMENTS, max(MIN_BLOCK_ELEMENTS, B * H * Tk * Dh))
    return max(MIN_CHUNK, min(Tq, budget // max(1, B * H * Tk)))


def _chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    qf: Tensor,
    kf: Tensor,
    fn: Callable,
    offset: int,
    dropout_p: float,
    causal: bool = True,
    table: Callable | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """One block of queries (the last of which sits at key index ``offset + tq - 1``) vs its keys;
    ``allowed`` (B, 1, tq, Tk), a document mask, replaces the causal one."""
    tq, Tk = q.shape[2], k.shape[2]
    table = table if causal else None  # distance tables hold causal biases with the causal mask built in
    dtype = _softmax_dtype(q.dtype)
    scale = 1 / math.sqrt(q.shape[-1])
    fused = not torch.is_grad_enabled() and not dropout_p and q.dtype in (torch.float32, torch.float64)
    if table is None:
        block, reversed_rows = None, False
    elif allowed is not None:  # positions step by one inside each document (_document_chunks checked)
        block, reversed_rows = toeplitz_block(table, qf, offset, Tk, dtype), False
        block = None if block is None else block.masked_fill(~allowed, float("-inf"))
    else:
        block, reversed_rows = distance_block(table, qf, kf, offset, dtype, reversed_rows=fused)
    if block is not None:  # the bias with the causal mask already in it (-inf on future keys)
        if fused:  # inference in full precision: the fused kernel takes the block as a float mask
            if not reversed_rows:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=block, scale=scale)
            # a zero-copy Toeplitz view whose row r belongs to query tq - 1 - r: flip the queries
            out = F.scaled_dot_product_attention(q.flip(2), k, v, attn_mask=block, scale=scale)
            return out.flip(2)
        scores = (q @ k.transpose(-1, -2)).to(dtype) / math.sqrt(q.shape[-1])
        weights = torch.softmax(scores + block, dim=-1).to(v.dtype)
        if dropout_p:
            weights = torch.dropout(weights, dropout_p, train=True)
        return weights @ v
    if allowed is not None:
        future = ~allowed
    else:
        i = torch.arange(tq, device=q.device).unsqueeze(-1) + offset
        future = (torch.arange(Tk, device=q.device) > i) & causal
    if fused:  # inference in full precision: the bias block, masked in place, is the fused kernel's mask
        block = fn(qf, kf).to(dtype).contiguous()
        # a document mask has a batch dimension the bias may lack: masked out of place, broadcast
        block = (
            block.masked_fill_(future, float("-inf"))
            if allowed is None
            else block.masked_fill(future, float("-inf"))
        )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=block, scale=scale)
    if not torch.is_grad_enabled():  # inference: one score block, updated in place
        scores = (q @ k.transpose(-1, -2)).to(dtype).mul_(scale)
        scores.add_(fn(qf, kf)).masked_fill_(future, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=dtype)
        del scores
        return weights.to(v.dtype) @ v
    scores = (q @ k.transpose(-1, -2)).to(dtype) / math.sqrt(q.shape[-1])
    scores = scores + fn(qf, kf).to(dtype)
    scores = scores.masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(v.dtype)
    if dropout_p:
        weights = torch.dropout(weights, dropout_p, train=True)
    return weights @ v


def distance_block(
    table: Callable, qf: Tensor, kf: Tensor, offset: int, dtype: torch.dtype, reversed_rows: bool = False
) -> tuple[Tensor | None, bool]:
    """The bias of a ``DistanceBias`` block from its table, the causal mask included (-inf), or None;
    and whether its rows run in reverse query order.

    qf (B, 1, tq, 1) / kf (B, 1, Tk, 1) are positions; the block's queries are keys offset..offset+tq-1.
    Contiguous positions (every row p_j = p_0 + j, the common case): bias[i, j] = g(offset + i - j)
    is a Toeplitz matrix, the same for every row of the batch: windows of one vector u of
    tq + Tk - 1 values, u[m] = g(offset + tq - 1 - m). Window r is the row of query tq - 1 - r, so
    with ``reversed_rows`` the block is a zero-copy strided view (1, H, tq, Tk) whose rows run in
    reverse query order (the caller flips the queries); otherwise the rows are flipped into a
    (1, H, tq, Tk) copy, B times smaller than the scores (its gradient sums the windows back).
    Sorted positions (segments, random positions): d = p_i - p_j >= 0 on the visible keys, gathered
    from the table ((B, H, tq, Tk)). Anything else, or a table that does not cover the block
    (FIRE past L): None, and the caller evaluates ``fn`` on every pair.
    """
    tq, Tk = qf.shape[2], kf.shape[2]
    if qf.shape[1] != 1 or kf.shape[1] != 1 or qf.shape[-1] != 1:
        return None, False
    kp, qp = kf[:, 0, :, 0], qf[:, 0, :, 0]
    if not torch.equal(qp, kp[:, offset : offset + tq]):
        return None, False
    step = kp[:, 1:] - kp[:, :-1]
    if bool((step == 1).all()):
        windows = toeplitz_block(table, qf, offset, Tk, dtype, reversed_rows=True)
        if windows is None:
            return None, False
        return (windows, True) if reversed_rows else (windows.flip(-2), False)
    if not bool((step >= 0).all()):
        return None, False
    n = int((qp[:, -1] - kp[:, 0]).max().item()) + 1  # the largest visible distance, + 1
    g = table(qf, n)
    if g is None:
        return None, False
    d = qp.unsqueeze(-1) - kp.unsqueeze(-2)  # (B, tq, Tk), >= 0 on the visible keys
    future = torch.arange(Tk, device=qf.device) > torch.arange(tq, device=qf.device).unsqueeze(-1) + offset
    idx = d.clamp(0, n - 1).to(torch.long)
    return g.to(dtype)[:, idx].transpose(0, 1).masked_fill(future, float("-inf")), False


def toeplitz_block(
    table: Callable, qf: Tensor, offset: int, Tk: int, dtype: torch.dtype, reversed_rows: bool = False
) -> Tensor | None:
    """bias[i, j] = g(offset + i - j) (-inf on future keys) as windows of one vector (``distance_block``):
    (1, H, tq, Tk), rows in reverse query order with ``reversed_rows`` (a zero-copy view), else a copy;
    None when the table does not cover the block's queries."""
    tq = qf.shape[2]
    g = table(qf, offset + tq)  # distances 0 .. offset + tq - 1
    if g is None:
        return None
    g = g.to(dtype)
    u = torch.cat([g.flip(-1), g.new_full((g.shape[0], Tk - 1 - offset), float("-inf"))], dim=-1)
    windows = u.unfold(-1, Tk, 1).unsqueeze(0)  # (1, H, tq, Tk), window r = query tq - 1 - r
    return windows if reversed_rows else windows.flip(-2)


def _logit_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    qf: Tensor,
    kf: Tensor,
    fn: Callable,
    offset: int,
    dropout_p: float,
    causal: bool = True,
    allowed: Tensor | None = None,
) -> Tensor:
    """``_chunk`` for a ``LogitBias``: fn also sees the block's unmasked logits, queries and causal mask
    (or ``allowed``, a (B, 1, tq, Tk) document mask)."""
    tq, Tk = q.shape[2], k.shape[2]
    dtype = _softmax_dtype(q.dtype)
    if allowed is not None:
        visible = allowed
    else:
        visible = (
            torch.arange(Tk, device=q.device) <= torch.arange(tq, device=q.device).unsqueeze(-1) + offset
        )
        visible = visible | (not causal)
    scores = (q @ k.transpose(-1, -2)).to(dtype) / math.sqrt(q.shape[-1])
    scores = scores + fn(scores, q, qf, kf, visible).to(dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(v.dtype)
    if dropout_p:
        weights = torch.dropout(weights, dropout_p, train=True)
    return weights @ v


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: PairwiseBias | LogitBias,
    dropout_p: float = 0.0,
    *,
    chunk_size: int | None = None,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Pairwise- or logit-bias attention in blocks of queries: memory O(chunk * Tk) (see module doc)."""
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    window = cutting_window(window, causal, Tk)
    k_in, v_in = k, v
    k, v = _expand_kv(k, H), _expand_kv(v, H)  # O(T * d) copies at most; the scores dominate
    past = Tk - Tq
    table = getattr(bias, "table", None)  # a DistanceBias (positions/bias.py): O(T) distinct values
    chunk = chunk_size or default_chunk_size(B, H, Tq, Tk, Dh)
    if documents is not None or window is not None:
        return _masked_chunks(q, k, v, bias, dropout_p, chunk, causal, documents, window)
    if (
        chunk_size is None
        and Tq <= DECODE_QUERIES
        and not torch.is_grad_enabled()
        and not dropout_p
        and isinstance(bias, PairwiseBias)
        and q.dtype in (torch.float32, torch.float64)
    ):
        # decoding: the bias on a few query rows costs what the distance table would (O(Tk) values
        # per row), without the table's layout checks and Toeplitz views; fused SDPA takes the rows
        return _pairwise_rows_attention(q, k_in, v_in, bias, causal)
    if (
        chunk_size is None
        and causal
        and table is not None
        and not torch.is_grad_enabled()
        and _contiguous(bias.k_feat)
        and table(bias.q_feat[:, :, -1:], 1) is not None
    ):  # the last query (the largest position) covered
        # the fused kernel with a zero-copy Toeplitz mask holds no (chunk, Tk) block: bigger chunks
        chunk = max(chunk, min(Tq, TOEPLITZ_CHUNK))
    run = _logit_chunk if isinstance(bias, LogitBias) else partial(_chunk, table=table)
    if chunk >= Tq:
        return run(q, k, v, bias.q_feat, bias.k_feat, bias.fn, past, dropout_p, causal)
    # recompute each block in backward instead of storing its (chunk, Tk) weights
    use_ckpt = torch.is_grad_enabled()
    outs = []
    # last block first: blocks shrink as they go, so each fits in memory the allocator freed from
    # the previous one (in increasing order glibc keeps growing its heap: 2 GB RSS at 16k vs 0.2)
    for s in reversed(range(0, Tq, chunk)):
        e = min(s + chunk, Tq)
        kend = past + e if causal else Tk  # causal: keys after the block's last query are masked, skip them
        args = (
            q[:, :, s:e],
            k[:, :, :kend],
            v[:, :, :kend],
            bias.q_feat[:, :, s:e],
            bias.k_feat[:, :, :kend],
        )
        if use_ckpt:
            out = checkpoint(run, *args, bias.fn, past + s, dropout_p, causal, use_reentrant=False)
        else:
            out = run(*args, bias.fn, past + s, dropout_p, causal)
        outs.append(out)
    return torch.cat(outs[::-1], dim=2)


def _pairwise_rows_attention(q: Tensor, k: Tensor, v: Tensor, bias: PairwiseBias, causal: bool) -> Tensor:
    """A few queries without autograd (decoding): ``fn`` on their rows, the causal mask in them (a single
    causal query sees every key, nothing to mask), as fused SDPA's float mask; GQA without copies."""
    Tq, Tk = q.shape[2], k.shape[2]
    rows = bias.fn(bias.q_feat, bias.k_feat).to(q.dtype)
    if causal and Tq > 1:
        rows = rows.masked_fill(~_causal_mask(Tq, Tk, q.device), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=rows, enable_gqa=q.shape[1] != k.shape[1])


def _masked_chunks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: PairwiseBias | LogitBias,
    dropout_p: float,
    chunk: int,
    causal: bool,
    documents: Tensor | None,
    window: int | None = None,
) -> Tensor:
    """``chunked_attention`` under a document mask and / or a sliding window: the ``visible_blocks`` of
    ``chunk`` queries, each against the keys from its first document's start (and its window's). A
    distance table (Kerple, T5, FIRE before L) is used when positions step by one inside every
    document (restarting or continuing across them): then p_i - p_j = i - j on every visible pair, and
    the masked block is the Toeplitz one with the other documents' (and the window's earlier) keys set
    to -inf; otherwise the bias is evaluated on every pair."""
    Tq, Tk = q.shape[2], k.shape[2]
    past = Tk - Tq
    if isinstance(bias, LogitBias):
        run = _logit_chunk
    else:
        table = getattr(bias, "table", None)
        run = partial(_chunk, table=table if table is not None and _steps_by_one(bias, documents) else None)
    blocks = visible_blocks(Tq, Tk, documents=documents, window=window, causal=causal, block=chunk)
    use_ckpt = torch.is_grad_enabled() and len(blocks) > 1
    outs = []
    for q0, q1, k0, k1 in reversed(blocks):  # largest first, as in chunked_attention
        allowed = block_visible(
            past, (q0, q1), (k0, k1), documents=documents, window=window, causal=causal, device=q.device
        )
        args = (
            q[:, :, q0:q1],
            k[:, :, k0:k1],
            v[:, :, k0:k1],
            bias.q_feat[:, :, q0:q1],
            bias.k_feat[:, :, k0:k1],
        )
        extra = (bias.fn, past + q0 - k0, dropout_p, causal)
        if use_ckpt:
            outs.append(checkpoint(run, *args, *extra, allowed=allowed, use_reentrant=False))
        else:
            outs.append(run(*args, *extra, allowed=allowed))
    return outs[0] if len(outs) == 1 else torch.cat(outs[::-1], dim=2)


def _steps_by_one(bias: PairwiseBias, documents: Tensor | None) -> bool:
    """Key positions (B, 1, Tk, 1) that step by exactly one between neighbours of the same document (of
    the row, without documents)."""
    kf = bias.k_feat
    if kf.dim() != 4 or kf.shape[1] != 1 or kf.shape[-1] != 1 or bias.q_feat.shape[1] != 1:
        return False
    p = kf[:, 0, :, 0]
    steps = p[:, 1:] - p[:, :-1] == 1
    if documents is None:
        return bool(steps.all())
    return bool((steps | (documents[:, 1:] != documents[:, :-1])).all())


def _contiguous(k_feat: Tensor) -> bool:
    """Key positions (B, 1, Tk, 1) that step by exactly one in every row."""
    p = k_feat[:, 0, :, 0] if k_feat.dim() == 4 and k_feat.shape[1] == 1 and k_feat.shape[-1] == 1 else None
    return p is not None and bool(((p[:, 1:] - p[:, :-1]) == 1).all())


# ---- CUDA: FlexAttention ---------------------------------------------------------------------

_flex_state: dict = {}


def _flex_wanted(
    q: Tensor, bias: Bias | None, dropout_p: float, documents: Tensor | None = None, window: int | None = None
) -> bool:
    grad, masked = torch.is_grad_enabled(), documents is not None or window is not None
    return flex_wanted(q.device.type, grad, dropout_p, q.shape[2], q.dtype, bias, masked)


def flex_wanted(
    device_type: str,
    grad: bool,
    dropout_p: float,
    n_queries: int,
    dtype: torch.dtype,
    bias: Bias | None,
    documents: bool = False,
) -> bool:
    """Whether ``attention`` runs FlexAttention: on CUDA only (the CPU keeps its paths), never with
    dropout (flex has none) nor for a ``LogitBias`` (a score_mod sees one (query, key) pair, never the
    row it needs).

    Training (autograd on): the pairwise biases that have a per-pair form (``PairwiseBias.pair``:
    Kerple, FIRE, T5, K-CABLE), compiled with flex's own backward, instead of checkpointed query
    chunks. Without gradients: long forwards (evaluation, prefill; at least ``FLEX_MIN_QUERIES``
    queries, since each new (Tq, Tk) recompiles and decoding steps stay on the other paths) of any
    pairwise bias, and folded biases in half precision only (in fp32 the SDPA fold is already
    fused, while a half-precision fold runs SDPA in fp32 (_fold_dtype) and flex computes the
    score_mod in fp32 on bf16 inputs instead).

    Without a bias, only under a document mask or a sliding window (``documents``: either), in training
    or for long forwards: flex's ``mask_mod`` skips the blocks between documents and outside the window,
    where SDPA would need a dense mask and its slower masked kernels.
    """
    if device_type != "cuda" or dropout_p or isinstance(bias, LogitBias):
        return False
    if bias is None:
        return documents and (grad or n_queries >= FLEX_MIN_QUERIES)
    if grad:
        return isinstance(bias, PairwiseBias) and bias.pair is not None
    if n_queries < FLEX_MIN_QUERIES:
        return False
    return isinstance(bias, PairwiseBias) or dtype in (torch.float16, torch.bfloat16)


def _flex_or_none(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor | None:
    """FlexAttention (compiled), or None (the caller falls back) when it is missing or fails.

    Under autograd a failure of the compiled backward would surface in ``loss.backward()``, where no
    fallback can catch it; so the first forward of each (bias, shape, dtype) also runs a backward on
    detached copies of q, k, v (gradients of q, k, v only: nothing accumulates in the parameters),
    and a failure there falls back like a failed forward.
    """
    if _flex_state.get("broken"):
        return None
    try:
        if "fn" not in _flex_state:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            _flex_state["fn"] = torch.compile(flex_attention, dynamic=False)
            _flex_state["mask"] = create_block_mask
        flex, make_mask = _flex_state["fn"], _flex_state["mask"]
        if torch.is_grad_enabled():
            _check_flex_backward(q, k, v, bias, causal, flex, make_mask, documents, window)
        return _flex(q, k, v, bias, flex, make_mask, causal, documents, window)
    except Exception as e:  # import errors, compile errors, unsupported captures: use the fallback
        _flex_state["broken"] = True
        warnings.warn(
            f"FlexAttention unavailable ({type(e).__name__}: {e}); using the chunked path", stacklevel=3
        )
        return None


def _check_flex_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias,
    causal: bool,
    flex_attention: Callable,
    create_block_mask: Callable,
    documents: Tensor | None = None,
    window: int | None = None,
) -> None:
    """One forward and backward of flex on detached q, k, v, once per kind of call (see _flex_or_none)."""
    pair = getattr(bias, "pair", None)
    key = (type(bias).__name__, getattr(pair, "__qualname__", None), q.shape, k.shape, q.dtype, causal)
    key = (*key, documents is not None, window)
    checked = _flex_state.setdefault("backward_checked", set())
    if key in checked:
        return
    qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
    out = _flex(qd, kd, vd, bias, flex_attention, create_block_mask, causal, documents, window)
    torch.autograd.grad(out.sum(), (qd, kd, vd))
    checked.add(key)


def flex_mask_mod(
    Tq: int, Tk: int, causal: bool = True, documents: Tensor | None = None, window: int | None = None
) -> Callable | None:
    """FlexAttention's ``mask_mod``: key kj visible from query qi (bottom-right causal, kj <= qi + Tk - Tq)
    and, with ``documents`` (B, Tk) (the document of every key; the queries are the last Tq), in the
    query's document (``data.document_mask``, docs/packing.md), and with a ``window`` W within the
    query's last W keys (kj > qi + Tk - Tq - W); None when every key is visible."""
    past = Tk - Tq
    if window is not None:
        if documents is None:

            def in_window(b, h, qi, kj):
                return (kj <= qi + past) & (kj > qi + past - window)

            return in_window

        def same_document_in_window(b, h, qi, kj):
            same = documents[b, qi + past] == documents[b, kj]
            return same & (kj <= qi + past) & (kj > qi + past - window)

        return same_document_in_window
    if documents is None:
        if not causal:
            return None

        def visible(b, h, qi, kj):
            return kj <= qi + past

        return visible

    def same_document(b, h, qi, kj):
        same = documents[b, qi + past] == documents[b, kj]
        return same & (kj <= qi + past) if causal else same

    return same_document


#: causal block masks kept per (Tq, Tk, device): training asks for the same one in every layer and step
_MAX_CACHED_MASKS = 16


def flex_block_mask(
    create_block_mask: Callable,
    B: int,
    Tq: int,
    Tk: int,
    device: torch.device,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
):
    """The block mask of ``flex_mask_mod`` (None when every key is visible, e.g. one decoded query without
    a window). A document mask is built once per forward: every layer passes the same ``documents``."""
    if documents is not None:
        key = (Tq, Tk, causal, create_block_mask, window)
        last = _flex_state.get("document_mask")
        if last is not None and last[0] is documents and last[1] == key:
            return last[2]
        mod = flex_mask_mod(Tq, Tk, causal, documents, window)
        mask = create_block_mask(mod, B, None, Tq, Tk, device=device)
        _flex_state["document_mask"] = (documents, key, mask)
        return mask
    if (Tq == 1 and window is None) or not causal:
        return None
    cache = _flex_state.setdefault("masks", {})
    key = (Tq, Tk, str(device), create_block_mask) + ((window,) if window is not None else ())
    if key not in cache:
        if len(cache) >= _MAX_CACHED_MASKS:
            cache.clear()
        mod = flex_mask_mod(Tq, Tk, causal, window=window)
        cache[key] = create_block_mask(mod, None, None, Tq, Tk, device=device)
    return cache[key]


def flex_score_mod(bias: Bias | None, B: int, H: int, Tq: int, Tk: int) -> Callable | None:
    """FlexAttention's ``score_mod`` for a bias description: score + bias of the pair (b, h, qi, kj)."""
    if bias is None:
        return None
    if isinstance(bias, FoldedBias):
        kf = bias.k_feat.float()
        qf = bias.q_feat.float().expand(B, H, Tq)
        kf = (kf - kf[..., -1:].detach()).expand(B, H, Tk)

        def folded(score, b, h, qi, kj):
            return score + qf[b, h, qi] * kf[b, h, kj]

        return folded
    qf, kf, pair = bias.q_feat, bias.k_feat, bias.pair
    hq, hk = qf.shape[1] > 1, kf.shape[1] > 1
    if pair is not None:
        n_q, n_k = qf.shape[-1], kf.shape[-1]

        def pairwise(score, b, h, qi, kj):
            # one scalar per feature: flex differentiates a captured tensor through scalar indexing only
            a = [qf[b, h if hq else 0, qi, f] for f in range(n_q)]
            c = [kf[b, h if hk else 0, kj, f] for f in range(n_k)]
            return score + pair(a, c, h)

        return pairwise
    fn = bias.fn

    def by_fn(score, b, h, qi, kj):
        # fn on one (query, key) pair, features kept 4-D as fn expects (forward only, see flex_wanted)
        a = qf[b, h if hq else 0, qi].reshape(1, 1, 1, -1)
        c = kf[b, h if hk else 0, kj].reshape(1, 1, 1, -1)
        out = fn(a, c)
        return score + out[0, h if out.shape[1] > 1 else 0, 0, 0]

    return by_fn


def _flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias,
    flex_attention: Callable,
    create_block_mask: Callable,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """One flex call: the bias's score_mod, the causal (+ document, + window) block mask; GQA without
    copies."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    block_mask = flex_block_mask(create_block_mask, B, Tq, Tk, q.device, causal, documents, window)
    score_mod = flex_score_mod(bias, B, H, Tq, Tk)
    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1]
    )
