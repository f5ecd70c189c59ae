"""Biases evaluated on (query, key) pairs (``PairwiseBias``: Kerple, FIRE, T5, K-CABLE; ``LogitBias``:
CoPE, DAPE) in blocks of queries: memory O(chunk * Tk), checkpointed in training, a distance table's
Toeplitz block where positions allow (toeplitz.py), the bias rows alone when decoding."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from extrapos.attention.common import expand_kv, softmax_dtype
from extrapos.attention.mask import AttentionMask, causal_mask, resolve_mask
from extrapos.attention.toeplitz import contiguous, distance_block, steps_by_one, toeplitz_block
from extrapos.positions.base import LogitBias, PairwiseBias

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
#: no-grad forwards of at most this many queries (decoding steps) evaluate a pairwise bias's rows
#: directly: a row holds as many values as the distance table, and skips its layout checks
DECODE_QUERIES = 4


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
    ``allowed`` (B, 1, tq, Tk), the block of a document mask or window, replaces the causal one."""
    tq, Tk = q.shape[2], k.shape[2]
    table = table if causal else None  # distance tables hold causal biases with the causal mask built in
    dtype = softmax_dtype(q.dtype)
    scale = 1 / math.sqrt(q.shape[-1])
    fused = not torch.is_grad_enabled() and not dropout_p and q.dtype in (torch.float32, torch.float64)
    block: Tensor | None
    if table is None:
        block, reversed_rows = None, False
    elif allowed is not None:  # positions step by one inside each document (_masked_chunks checked)
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
    (or ``allowed``, the block of a document mask or window)."""
    tq, Tk = q.shape[2], k.shape[2]
    dtype = softmax_dtype(q.dtype)
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
    mask: AttentionMask | None = None,
) -> Tensor:
    """Pairwise- or logit-bias attention in blocks of queries: memory O(chunk * Tk) (see module doc);
    under a document mask or a sliding window (``mask``, or ``documents`` / ``window``) in the mask's
    blocks."""
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    mask = resolve_mask(q, k, mask, causal, documents, window)
    causal = mask.causal
    k_in, v_in = k, v
    k, v = expand_kv(k, H), expand_kv(v, H)  # O(T * d) copies at most; the scores dominate
    past = Tk - Tq
    table = getattr(bias, "table", None)  # a DistanceBias (positions/bias.py): O(T) distinct values
    chunk = chunk_size or default_chunk_size(B, H, Tq, Tk, Dh)
    if mask.masked:
        return _masked_chunks(q, k, v, bias, dropout_p, chunk, mask)
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
        and contiguous(bias.k_feat)
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
        rows = rows.masked_fill(~causal_mask(Tq, Tk, q.device), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=rows, enable_gqa=q.shape[1] != k.shape[1])


def _masked_chunks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: PairwiseBias | LogitBias,
    dropout_p: float,
    chunk: int,
    mask: AttentionMask,
) -> Tensor:
    """``chunked_attention`` under a document mask and / or a sliding window: the mask's blocks of
    ``chunk`` queries, each against the keys from its first document's start (and its window's). A
    distance table (Kerple, T5, FIRE before L) is used when positions step by one inside every
    document (restarting or continuing across them): then p_i - p_j = i - j on every visible pair, and
    the masked block is the Toeplitz one with the other documents' (and the window's earlier) keys set
    to -inf; otherwise the bias is evaluated on every pair."""
    past = mask.past
    run: Callable
    if isinstance(bias, LogitBias):
        run = _logit_chunk
    else:
        table = getattr(bias, "table", None)
        by_one = table is not None and steps_by_one(bias.k_feat, bias.q_feat, mask.continues_document())
        run = partial(_chunk, table=table if by_one else None)
    blocks = mask.blocks(chunk)
    use_ckpt = torch.is_grad_enabled() and len(blocks) > 1
    outs = []
    for q0, q1, k0, k1 in reversed(blocks):  # largest first, as in chunked_attention
        allowed = mask.visible((q0, q1), (k0, k1), q.device)
        args = (
            q[:, :, q0:q1],
            k[:, :, k0:k1],
            v[:, :, k0:k1],
            bias.q_feat[:, :, q0:q1],
            bias.k_feat[:, :, k0:k1],
        )
        extra = (bias.fn, past + q0 - k0, dropout_p, mask.causal)
        if use_ckpt:
            outs.append(checkpoint(run, *args, *extra, allowed=allowed, use_reentrant=False))
        else:
            outs.append(run(*args, *extra, allowed=allowed))
    return outs[0] if len(outs) == 1 else torch.cat(outs[::-1], dim=2)
