"""FlexAttention on CUDA (compiled): the bias as a ``score_mod``, the mask as a block mask that skips
the blocks no query sees. Which calls take it (``flex_wanted``) and the fallback when it is missing
or fails (``flex_or_none``); docs/attention.md."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from extrapos.attention.mask import AttentionMask, resolve_mask
from extrapos.positions.base import (
    Bias,
    FoldedBias,
    LogitBias,
    PairwiseBias,
    flex_reads_once,
)

#: FlexAttention (CUDA) only for no-grad forwards with at least this many queries, see ``flex_wanted``
FLEX_MIN_QUERIES = 128

#: how many compilations of flex one process allows (torch's own limit is 8). Each encoding's score_mod
#: and each new shape compiles anew until dynamo marks the changed sizes dynamic; past the limit torch runs
#: flex eagerly, materialising every (query, key) score: on an H200 an evaluation of five rows at 1..16 x
#: 1024 reached the limit of 8 and its remaining rows crawled. Past this one the call falls back instead.
FLEX_COMPILE_LIMIT = 64

#: the compiled kernel of this process: "fn" (compiled flex_attention), "mask" (create_block_mask),
#: "broken" once flex itself is missing (every later call falls back), "broken_kinds" the kinds of call
#: (``_kind``) that failed (their later calls fall back, other kinds keep flex), "backward_checked"
#: (``_check_backward``)
_flex_state: dict[str, Any] = {}


_NO_BIAS = {"NoneType": "a document mask or window without a bias"}  # how a failure names its kind

#: folded biases (ALiBi, CABLE) in half-precision training through flex's compiled backward, instead of
#: the fold's SDPA, which runs in fp32 to keep the bias exact (fold.py's _fold_dtype): on the second H200
#: that made ALiBi's and CABLE's bf16 steps 2.2-2.6x NoPE's. Off until a GPU has timed both side by side
#: (gpu_check's bench does, under ``folded_training_through_flex``); docs/attention.md
_FOLDED_TRAINING = [False]


@contextlib.contextmanager
def folded_training_through_flex(enabled: bool = True) -> Any:
    """Inside the block, half-precision training of a folded bias takes FlexAttention on CUDA."""
    was = _FOLDED_TRAINING[0]
    _FOLDED_TRAINING[0] = enabled
    try:
        yield
    finally:
        _FOLDED_TRAINING[0] = was


def _kind(bias: Bias | None, grad: bool) -> tuple:
    """What a failure is remembered by: the bias's type and per-pair function, with or without autograd
    (FIRE's compiled backward may fail where its forward and every other encoding's backward compile)."""
    pair = getattr(bias, "pair", None)
    return (type(bias).__name__, getattr(pair, "__qualname__", None), grad)


def _compile_limits() -> contextlib.AbstractContextManager:
    """Dynamo's limits around one flex call: ``FLEX_COMPILE_LIMIT`` compilations, and past them an
    exception (the caller falls back to its chunked path) instead of eager flex, under the names this
    torch spells them. Inside an outer torch.compile the call is traced inline and keeps the limits."""
    import torch._dynamo.config as dynamo_config

    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    patch: dict[str, Any] = {}
    for names, value in (
        (("recompile_limit", "cache_size_limit"), None),
        (("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"), True),
    ):
        name = next((n for n in names if hasattr(dynamo_config, n)), None)
        if name is not None:
            patch[name] = max(getattr(dynamo_config, name), FLEX_COMPILE_LIMIT) if value is None else value
    return dynamo_config.patch(**patch)


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
        if isinstance(bias, FoldedBias):
            return _FOLDED_TRAINING[0] and dtype in (torch.float16, torch.bfloat16)
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
    kind = _kind(bias, torch.is_grad_enabled())
    if _flex_state.get("broken") or kind in _flex_state.get("broken_kinds", ()):
        return None
    mask = resolve_mask(q, k, mask)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:  # a torch without flex: no call can take it
        _flex_state["broken"] = True
        warnings.warn(f"FlexAttention unavailable ({e}); using the other attention paths", stacklevel=3)
        return None
    try:
        if "fn" not in _flex_state:
            # dynamic=None: a training run compiles its one shape statically; the lengths and batch sizes
            # of an evaluation each recompile once, then dynamo makes the sizes that changed dynamic
            _flex_state["fn"] = torch.compile(flex_attention, dynamic=None)
            _flex_state["mask"] = create_block_mask
        flex, make_mask = _flex_state["fn"], _flex_state["mask"]
        with _compile_limits():
            if torch.is_grad_enabled():
                _check_backward(q, k, v, bias, mask, flex, make_mask)
            return flex_forward(q, k, v, bias, flex, make_mask, mask=mask)
    except Exception as e:  # compile errors, unsupported captures, the compile limit: use the fallback
        _flex_state.setdefault("broken_kinds", set()).add(kind)
        message = str(e).split("\n")[0][:300]
        warnings.warn(
            f"FlexAttention failed for {kind[1] or _NO_BIAS.get(kind[0], kind[0])} ({type(e).__name__}: "
            f"{message}); this kind of call takes the non-flex path (chunked or SDPA) from now on",
            stacklevel=3,
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
        # the features in at least fp32 (exact positions up to 2^24; fp64 stays fp64), differentiable
        # (CABLE learns them), each read once by the score_mod, as flex's compiled backward needs
        dtype = torch.promote_types(bias.k_feat.dtype, torch.float32)
        kf = bias.k_feat.to(dtype)
        qf = bias.q_feat.to(dtype).expand(B, H, Tq)
        kf = (kf - kf[..., -1:].detach()).expand(B, H, Tk)

        def folded(score: Tensor, b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            return score + qf[b, h, qi] * kf[b, h, kj]

        return folded
    if not isinstance(bias, PairwiseBias):
        raise TypeError(f"FlexAttention takes no {type(bias).__name__} (its bias reads a whole row)")
    qf, kf, pair = bias.q_feat, bias.k_feat, bias.pair
    hq, hk = qf.shape[1] > 1, kf.shape[1] > 1
    if pair is not None:
        # called with one scalar per feature (lists of 0-d tensors), whatever base.py's annotation says
        pair_fn: Callable[..., Tensor] = pair
        # each feature a (B, Hq or Hk, T) tensor of its own where flex differentiates the features
        # (K-CABLE's (g, S)): its compiled backward takes one indexing read per such tensor
        q_cols, k_cols = flex_reads_once([qf.movedim(-1, 0), kf.movedim(-1, 0)])

        def pairwise(score: Tensor, b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            # one scalar per feature: flex differentiates a captured tensor through scalar indexing only
            a = [col[b, h if hq else 0, qi] for col in q_cols]
            c = [col[b, h if hk else 0, kj] for col in k_cols]
            return score + pair_fn(a, c, h)

        return pairwise
    fn = bias.fn

    def by_fn(score: Tensor, b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
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
