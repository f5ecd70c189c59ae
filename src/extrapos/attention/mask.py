"""Which keys each query may see: causal order, packed documents, a sliding window; one rule, in the
forms the kernels consume.

Key j is visible from the query at key index i (queries are the last Tq of Tk keys: i = past + t,
past = Tk - Tq, covering full forwards and cached decoding alike) iff

* causally, j <= i (bidirectional attention, ``causal=False``, drops this: docs/encoder.md);
* with a sliding window W (Mistral, Qwen2: Jiang et al. 2023, §2; Beltagy et al. 2020, §3.1),
  i - W < j, the query's last W keys with itself included (Hugging Face's ``sliding_window_overlay``);
* with ``documents`` (B, Tk), the document number of every key (non-decreasing along a row: a packed
  row of several documents, docs/packing.md), j lies in i's document.

``_visible`` is that rule, once; ``block_visible`` applies it to a (queries, keys) block of index
ranges (the fused SDPA, fold and chunked kernels), ``AttentionMask.mask_mod`` to one (query, key)
pair (FlexAttention). ``visible_blocks`` says which keys a block of queries needs at all, so the
blocked kernels skip the keys before each block's documents and window.

``AttentionMask`` holds one attention call's mask: the model builds one per forward (``for_forward``)
and each layer takes its view (``for_keys``: a windowed KV cache keeps fewer keys), so the blocks
and the flex block mask are worked out once per forward and kind of layer, not per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

#: queries per block of a document-masked forward on the fused paths: a block sees the keys from the
#: start of its first query's document, so with short documents the (block, keys) masks stay small
DOCUMENT_BLOCK = 1024
#: causal flex block masks kept per shape: training asks for the same one in every layer and step
_MAX_CACHED_MASKS = 16
#: (Tq, Tk, device, create_block_mask, window) -> causal flex block mask, a pure function of its key
_causal_block_masks: dict[tuple, Any] = {}

Blocks = list[tuple[int, int, int, int]]


def check_window(window: int | None, causal: bool) -> None:
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"a sliding window must be a positive number of keys, got {window!r}")
    if not causal:
        raise ValueError("a sliding window is causal (i - W < j <= i); bidirectional attention has none")


def cutting_window(window: int | None, causal: bool, Tk: int) -> int | None:
    """``window`` when it hides some key from some query, else None: with Tk <= W every query sees all
    of its earlier keys, and the unwindowed paths run unchanged (bit-identical)."""
    check_window(window, causal)
    return None if window is None or Tk <= window else window


def check_documents(documents: Tensor, batch: int, n_keys: int) -> None:
    """Integer (B, Tk) document numbers, in order along each row."""
    if documents.shape != (batch, n_keys) or documents.dtype.is_floating_point:
        raise ValueError(
            f"documents must be integer (B, Tk) = {(batch, n_keys)}, got {documents.dtype} "
            f"{tuple(documents.shape)}"
        )
    check_document_order(documents)


def check_document_order(documents: Tensor) -> None:
    """Document numbers must not decrease along a row: the blocks rely on each document being contiguous."""
    if documents.shape[-1] <= 1:
        return
    ordered = (documents[..., 1:] >= documents[..., :-1]).all()
    words = "document numbers must not decrease along a row (a packed row's documents in order)"
    if torch.compiler.is_compiling():
        # a compiled step cannot branch on a tensor's value (``bool`` is a graph break, one per layer): the
        # check runs inside the graph and raises when the step runs
        torch._assert_async(ordered, words)
    elif not bool(ordered):
        raise ValueError(words)


def causal_mask(Tq: int, Tk: int, device: torch.device) -> Tensor:
    """Boolean (Tq, Tk) mask, True where query t may attend key j (bottom-right aligned)."""
    i = torch.arange(Tq, device=device).unsqueeze(-1) + (Tk - Tq)
    return torch.arange(Tk, device=device) <= i


def _visible(i: Tensor, j: Tensor, same_document: Tensor | None, causal: bool, window: int | None) -> Tensor:
    """The rule (module docstring) on broadcast index tensors: ``i`` the query's key index, ``j`` the
    key's, ``same_document`` whether they share a document (None: no documents)."""
    visible = None
    if causal:
        visible = j <= i
        if window is not None:
            visible = visible & (j > i - window)
    if same_document is not None:
        visible = same_document if visible is None else same_document & visible
    assert visible is not None, "bidirectional attention without documents has nothing to mask"
    return visible


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
    i = torch.arange(q0, q1, device=device).unsqueeze(-1) + past
    j = torch.arange(k0, k1, device=device)
    same = None
    if documents is not None:
        same = documents[:, past + q0 : past + q1, None] == documents[:, None, k0:k1]
    visible = _visible(i, j, same, causal, window)
    return visible.unsqueeze(1) if visible.dim() == 3 else visible[None, None]


def document_visible(
    documents: Tensor, past: int, queries: tuple[int, int], keys: tuple[int, int], causal: bool = True
) -> Tensor:
    """``block_visible`` under a document mask alone."""
    return block_visible(past, queries, keys, documents=documents, causal=causal)


def visible_blocks(
    Tq: int,
    Tk: int,
    *,
    documents: Tensor | None = None,
    window: int | None = None,
    causal: bool = True,
    block: int = DOCUMENT_BLOCK,
) -> Blocks:
    """Blocks (q0, q1, k0, k1) of queries and the keys they may see: from the start of the block's first
    query's document (the earliest over the batch) and no earlier than its first query's window
    (past + q0 - W + 1), to its last query (causal) or to the end of its last query's document.
    Documents are contiguous in a row, so no visible key is left out: a decoded token after a long
    packed prompt reads only its own document's keys, one with a window its last W keys, and a long
    forward's windowed blocks hold (block, block + W - 1) masks."""
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


def document_blocks(documents: Tensor, Tq: int, causal: bool = True, block: int = DOCUMENT_BLOCK) -> Blocks:
    """``visible_blocks`` under a document mask alone."""
    return visible_blocks(Tq, documents.shape[1], documents=documents, causal=causal, block=block)


class AttentionMask:
    """The mask of one attention call of ``n_queries`` queries on ``n_keys`` keys (module docstring):
    ``causal``, ``documents`` (B, n_keys) or None, and the sliding ``window`` kept only where it hides
    a key (``cutting_window``). What the kernels derive from it (the blocks of each size, the flex
    block mask) is computed on first use and kept, so every layer that shares the mask shares them."""

    def __init__(
        self,
        n_queries: int,
        n_keys: int,
        *,
        causal: bool = True,
        documents: Tensor | None = None,
        window: int | None = None,
    ) -> None:
        self.n_queries, self.n_keys, self.causal = n_queries, n_keys, causal
        self.documents = documents
        self.window = cutting_window(window, causal, n_keys)
        self._blocks: dict[int, Blocks] = {}
        self._flex: dict[Callable, Any] = {}  # create_block_mask -> its block mask of this mask
        self._layers: dict[tuple[int, int | None], AttentionMask] = {}

    @classmethod
    def checked(
        cls,
        q: Tensor,
        k: Tensor,
        *,
        causal: bool = True,
        documents: Tensor | None = None,
        window: int | None = None,
    ) -> AttentionMask:
        """The mask of ``attention(q, k, ...)`` called with raw arguments, its documents checked."""
        mask = cls(q.shape[2], k.shape[2], causal=causal, documents=documents, window=window)
        if documents is not None:
            check_documents(documents, k.shape[0], k.shape[2])
        return mask

    @classmethod
    def for_forward(
        cls, n_queries: int, n_keys: int, *, causal: bool = True, documents: Tensor | None = None
    ) -> AttentionMask:
        """The model's mask of one forward (the keys: the cache's and the new tokens'), documents checked
        once for every layer; each layer takes ``for_keys`` of it."""
        if documents is not None:
            check_documents(documents, documents.shape[0], n_keys)
        return cls(n_queries, n_keys, causal=causal, documents=documents)

    def for_keys(self, n_keys: int, window: int | None = None) -> AttentionMask:
        """This forward's mask for a layer that holds the last ``n_keys`` keys (a windowed KV cache drops
        the older ones) and has its own sliding ``window``; one per kind of layer, kept."""
        key = (n_keys, window)
        if key not in self._layers:
            documents = self.documents
            if documents is not None and documents.shape[1] != n_keys:
                documents = documents[:, documents.shape[1] - n_keys :]
            self._layers[key] = AttentionMask(
                self.n_queries, n_keys, causal=self.causal, documents=documents, window=window
            )
        return self._layers[key]

    def check_fits(self, q: Tensor, k: Tensor) -> None:
        """q and k are the queries and keys this mask was built for."""
        batch = None if self.documents is None else self.documents.shape[0]
        if (q.shape[2], k.shape[2]) != (self.n_queries, self.n_keys) or batch not in (None, k.shape[0]):
            raise ValueError(
                f"the attention mask is for {self.n_queries} queries on {self.n_keys} keys"
                f"{'' if batch is None else f' in {batch} rows'}; got q {tuple(q.shape)}, k {tuple(k.shape)}"
            )

    @property
    def past(self) -> int:
        """Keys before the first query (a KV cache's)."""
        return self.n_keys - self.n_queries

    @property
    def masked(self) -> bool:
        """Whether documents or a window hide keys beyond the causal order."""
        return self.documents is not None or self.window is not None

    def continues_document(self) -> Tensor | None:
        """(B, Tk - 1) bool: key j + 1 lies in key j's document; None without documents."""
        documents = self.documents
        return None if documents is None else documents[:, 1:] == documents[:, :-1]

    def blocks(self, block: int | None = None) -> Blocks:
        """``visible_blocks`` of ``block`` queries (default ``DOCUMENT_BLOCK``)."""
        block = DOCUMENT_BLOCK if block is None else block
        if block not in self._blocks:
            self._blocks[block] = visible_blocks(
                self.n_queries,
                self.n_keys,
                documents=self.documents,
                window=self.window,
                causal=self.causal,
                block=block,
            )
        return self._blocks[block]

    def visible(self, queries: tuple[int, int], keys: tuple[int, int], device: torch.device) -> Tensor:
        """``block_visible`` of a block of this mask."""
        return block_visible(
            self.past,
            queries,
            keys,
            documents=self.documents,
            window=self.window,
            causal=self.causal,
            device=device,
        )

    def mask_mod(self) -> Callable | None:
        """FlexAttention's ``mask_mod`` (b, h, qi, kj) -> visible, or None when every key is visible."""
        past, causal, window, documents = self.past, self.causal, self.window, self.documents
        if documents is None:
            if not causal:
                return None

            def visible(b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
                return _visible(qi + past, kj, None, causal, window)

            return visible

        def visible_in_document(b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            same = documents[b, qi + past] == documents[b, kj]
            return _visible(qi + past, kj, same, causal, window)

        return visible_in_document

    def flex_block_mask(self, create_block_mask: Callable, device: torch.device) -> Any:
        """The flex block mask of ``mask_mod`` (None when every key is visible, e.g. one decoded query
        without a window), built on first use. Without documents it depends on the shapes alone and is
        shared across forwards (the same one in every training step)."""
        Tq, Tk, window = self.n_queries, self.n_keys, self.window
        if self.documents is None:
            if (Tq == 1 and window is None) or not self.causal:
                return None
            key = (Tq, Tk, str(device), create_block_mask) + ((window,) if window is not None else ())
            if key not in _causal_block_masks:
                if len(_causal_block_masks) >= _MAX_CACHED_MASKS:
                    _causal_block_masks.clear()
                _causal_block_masks[key] = create_block_mask(
                    self.mask_mod(), None, None, Tq, Tk, device=device
                )
            return _causal_block_masks[key]
        if create_block_mask not in self._flex:
            B = self.documents.shape[0]
            self._flex[create_block_mask] = create_block_mask(self.mask_mod(), B, None, Tq, Tk, device=device)
        return self._flex[create_block_mask]


def resolve_mask(
    q: Tensor,
    k: Tensor,
    mask: AttentionMask | None,
    causal: bool = True,
    documents: Tensor | None = None,
    window: int | None = None,
) -> AttentionMask:
    """A kernel's mask: the model's (``mask``, built once per forward, whose ``causal`` is then the one
    that counts), or one made from the raw ``causal`` / ``documents`` / ``window`` arguments the kernels
    also take (tests, benchmarks)."""
    if mask is None:
        return AttentionMask(q.shape[2], k.shape[2], causal=causal, documents=documents, window=window)
    if documents is not None or window is not None:
        raise ValueError("pass either an attention mask or documents / window, not both")
    mask.check_fits(q, k)
    return mask
