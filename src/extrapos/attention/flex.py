"""FlexAttention on CUDA (compiled): the bias as a ``score_mod``, the mask as a block mask that skips
the blocks no query sees. Which calls take it (``flex_wanted``) and the fallback when it is missing
or fails (``flex_or_none``); docs/attention.md."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from extrapos.attention.mask import AttentionMask, resolve_mask
from extrapos.positions.base import Bias, FoldedBias, LogitBias, PairwiseBias

#: FlexAttention (CUDA) only for no-grad forwards with at least this many queries, see ``flex_wanted``
FLEX_MIN_QUERIES = 128

#: the compiled kernel of this process: "fn" (compiled flex_attention), "mask" (create_block_mask),
#: "broken" once a call failed (every later call falls back), "backward_checked" (``_check_backward``)
_flex_state: dict[str, Any] = {}


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
    fused, while a half-precision fold runs SDPA in fp32 (fold.py's _fold_dtype) and flex computes the
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


def flex_or_none(
    q: Tensor, k: Tensor, v: Tensor, bias: Bias | None, mask: AttentionMask | None = None
) -> Tensor | None:
    """FlexAttention (compiled), or None (the caller falls back) when it is missing or fails.

    Under autograd a failure of the compiled backward would surface in ``loss.backward()``, where no
    fallback can catch it; so the first forward of each (bias, shape, dtype) also runs a backward on
    detached copies of q, k, v (gradients of q, k, v only: nothing accumulates in the parameters),
    and a failure there falls back like a failed forward.
    """
    if _flex_state.get("broken"):
        return None
    mask = resolve_mask(q, k, mask)
    try:
        if "fn" not in _flex_state:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            _flex_state["fn"] = torch.compile(flex_attention, dynamic=False)
            _flex_state["mask"] = create_block_mask
        flex, make_mask = _flex_state["fn"], _flex_state["mask"]
        if torch.is_grad_enabled():
            _check_backward(q, k, v, bias, mask, flex, make_mask)
        return flex_forward(q, k, v, bias, flex, make_mask, mask=mask)
    except Exception as e:  # import errors, compile errors, unsupported captures: use the fallback
        _flex_state["broken"] = True
        warnings.warn(
            f"FlexAttention unavailable ({type(e).__name__}: {e}); using the chunked path", stacklevel=3
        )
        return None


def _check_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None,
    mask: AttentionMask,
    flex_attention: Callable,
    create_block_mask: Callable,
) -> None:
    """One forward and backward of flex on detached q, k, v, once per kind of call (see flex_or_none)."""
    pair = getattr(bias, "pair", None)
    kind = (type(bias).__name__, getattr(pair, "__qualname__", None), q.shape, k.shape, q.dtype, mask.causal)
    key = (*kind, mask.documents is not None, mask.window)
    checked = _flex_state.setdefault("backward_checked", set())
    if key in checked:
        return
    qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
    out = flex_forward(qd, kd, vd, bias, flex_attention, create_block_mask, mask=mask)
    torch.autograd.grad(out.sum(), (qd, kd, vd))
    checked.add(key)


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
    if not isinstance(bias, PairwiseBias):
        raise TypeError(f"FlexAttention takes no {type(bias).__name__} (its bias reads a whole row)")
    qf, kf, pair = bias.q_feat, bias.k_feat, bias.pair
    hq, hk = qf.shape[1] > 1, kf.shape[1] > 1
    if pair is not None:
        n_q, n_k = qf.shape[-1], kf.shape[-1]
        # called with one scalar per feature (lists of 0-d tensors), whatever base.py's annotation says
        pair_fn: Callable[..., Tensor] = pair

        def pairwise(score, b, h, qi, kj):
            # one scalar per feature: flex differentiates a captured tensor through scalar indexing only
            a = [qf[b, h if hq else 0, qi, f] for f in range(n_q)]
            c = [kf[b, h if hk else 0, kj, f] for f in range(n_k)]
            return score + pair_fn(a, c, h)

        return pairwise
    fn = bias.fn

    def by_fn(score, b, h, qi, kj):
        # fn on one (query, key) pair, features kept 4-D as fn expects (forward only, see flex_wanted)
        a = qf[b, h if hq else 0, qi].reshape(1, 1, 1, -1)
        c = kf[b, h if hk else 0, kj].reshape(1, 1, 1, -1)
        out = fn(a, c)
        return score + out[0, h if out.shape[1] > 1 else 0, 0, 0]

    return by_fn


def flex_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Bias | None,
    flex_attention: Callable,
    create_block_mask: Callable,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
    *,
    mask: AttentionMask | None = None,
) -> Tensor:
    """One flex call: the bias's score_mod, the mask's block mask (``mask``, or one of ``causal`` /
    ``documents`` / ``window``); GQA without copies."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    mask = resolve_mask(q, k, mask, causal, documents, window)
    block_mask = mask.flex_block_mask(create_block_mask, q.device)
    score_mod = flex_score_mod(bias, B, H, Tq, Tk)
    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1]
    )
