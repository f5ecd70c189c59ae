"""A rank-one bias (``FoldedBias``: ALiBi, CABLE) folded into one extra q/k dimension of fused SDPA:
q' = [q, q_feat sqrt(d_h)], k' = [k, k_feat] gives q'.k' / sqrt(d_h) = q.k / sqrt(d_h) + q_feat k_feat,
exactly; block by block for precision (docs/attention.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from extrapos.attention.common import expand_kv
from extrapos.attention.mask import AttentionMask, causal_mask, resolve_mask
from extrapos.attention.sdpa import sdpa
from extrapos.positions.base import FoldedBias

#: queries sharing one k_feat shift in the folded path; longer forwards fold block by block (precision)
FOLD_BLOCK = 256


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
    mask: AttentionMask | None = None,
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
    position (still a row constant, and still small near each query). Under a document mask or a
    sliding window (``mask``, or ``documents`` / ``window``) the blocks are the mask's blocks of the
    same size, each shifted by its last query's own key.
    """
    B, H, Tq, Dh = q.shape
    Tk, Hkv = k.shape[2], k.shape[1]
    mask = resolve_mask(q, k, mask, causal, documents, window)
    causal = mask.causal
    dtype = fold_dtype or _fold_dtype(q.dtype)
    inference = not torch.is_grad_enabled() and causal and not mask.masked and subtract_reference
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
        k, v, Hkv = expand_kv(k, H), expand_kv(v, H), H
    kf = kf.expand(B, Hkv, Tk)
    # blocks of queries whose (block, Tk) mask (the CPU kernel makes it float) is no larger than the keys
    block = block or max(FOLD_BLOCK, H * Dh)
    past = Tk - Tq
    if mask.masked:
        outs = []
        for q0, q1, k0, k1 in mask.blocks(block):
            visible = mask.visible((q0, q1), (k0, k1), q.device)
            args = (q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], qf[:, :, q0:q1], kf[:, :, k0:k1])
            ref = past + q1 - 1 - k0  # the block's last query's own key: visible to it, near the others
            outs.append(_fold_call(*args, dropout_p, dtype, subtract_reference, causal, ref, visible))
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
        out = sdpa(q2, k2, v2, dropout_p, scale=1.0 / math.sqrt(Dh), causal=causal, mask=mask)
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
        rows = rows.masked_fill_(~causal_mask(Tq, Tk, q.device), float("-inf"))
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
        k, v, Hkv = expand_kv(k, H), expand_kv(v, H), H
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
                rows = None if Tq == 1 else causal_mask(Tq, Tk, q.device)
                out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=rows, scale=scale, enable_gqa=gqa)
            return out[..., :Dh]
        # bottom-right causal (the last block's): -inf on the keys after each query, in two passes
        future = torch.full((block, Tk), float("-inf"), dtype=dtype, device=q.device).triu_(Tk - block + 1)
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
                attn_mask=future[block - (e - s) :, Tk - kend :],
                scale=scale,
                enable_gqa=gqa,
            )
            outs.append(out[..., :Dh])
        return torch.cat(outs[::-1], dim=2)
