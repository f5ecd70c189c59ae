"""The one place that turns q, k, v (+ a bias description and a mask) into attention outputs.

Shapes: q (B, H, Tq, d_h); k, v (B, H_kv, Tk, d_h) with H % H_kv == 0; Tq <= Tk. Attention is
causal with the queries aligned to the END of the keys (query t sees keys j <= t + Tk - Tq),
which covers both full forwards (Tq == Tk) and cached decoding (Tq new tokens after Tk - Tq).
``causal=False`` (the encoder flavour, docs/encoder.md) drops the mask: every query sees every key,
on every path below. Packed documents and sliding windows restrict it further; ``mask.py`` holds
that rule once (``AttentionMask``), built once per forward by the model, and every kernel reads
its blocks or its per-pair form from it.

``attention`` (dispatch.py) picks the kernel; every path equals ``attention_reference`` in the tests:
no bias -> fused SDPA (sdpa.py); ``FoldedBias`` (ALiBi, CABLE) -> one extra q/k dimension in fused
SDPA, block by block (fold.py); ``PairwiseBias`` (Kerple, FIRE, T5, K-CABLE) -> query chunks,
checkpointed in training, a distance table's Toeplitz block where positions allow (chunked.py,
toeplitz.py); ``LogitBias`` (CoPE, DAPE: the bias reads the row's logits) -> the same query chunks,
never FlexAttention; CUDA -> FlexAttention for long no-grad forwards, and in training for the
pairwise biases with a per-pair form (flex.py, ``flex_wanted``). Why, and the measured precision of
each path: docs/attention.md.
"""

from extrapos.attention.chunked import (
    CHUNK_ELEMENTS,
    DECODE_QUERIES,
    MIN_BLOCK_ELEMENTS,
    MIN_CHUNK,
    TOEPLITZ_CHUNK,
    chunked_attention,
    default_chunk_size,
)
from extrapos.attention.common import check_shapes, expand_kv, softmax_dtype
from extrapos.attention.dispatch import attention
from extrapos.attention.flex import (
    FLEX_MIN_QUERIES,
    flex_forward,
    flex_or_none,
    flex_score_mod,
    flex_wanted,
    folded_training_through_flex,
)
from extrapos.attention.fold import FOLD_BLOCK, folded_attention
from extrapos.attention.mask import (
    DOCUMENT_BLOCK,
    AttentionMask,
    block_visible,
    causal_mask,
    check_document_order,
    cutting_window,
    document_blocks,
    document_visible,
    visible_blocks,
)
from extrapos.attention.reference import attention_reference, bias_block
from extrapos.attention.toeplitz import distance_block, toeplitz_block

__all__ = [
    "CHUNK_ELEMENTS",
    "DECODE_QUERIES",
    "DOCUMENT_BLOCK",
    "FLEX_MIN_QUERIES",
    "FOLD_BLOCK",
    "MIN_BLOCK_ELEMENTS",
    "MIN_CHUNK",
    "TOEPLITZ_CHUNK",
    "AttentionMask",
    "attention",
    "attention_reference",
    "bias_block",
    "block_visible",
    "causal_mask",
    "check_document_order",
    "check_shapes",
    "chunked_attention",
    "cutting_window",
    "default_chunk_size",
    "distance_block",
    "document_blocks",
    "document_visible",
    "expand_kv",
    "flex_forward",
    "flex_or_none",
    "flex_score_mod",
    "flex_wanted",
    "folded_training_through_flex",
    "folded_attention",
    "softmax_dtype",
    "toeplitz_block",
    "visible_blocks",
]
