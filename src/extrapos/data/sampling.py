"""Window samplers: turn a memory-mapped token split into an endless stream of ``Batch``es.

Every sampler is deterministic for a seed, shuffles its items again each epoch (with
``(seed, epoch)``), shards them across data-parallel ranks, and can resume mid-epoch from a small
JSON state. The base class ``Sampler`` does all of that; a subclass only says how many items an
epoch has (``num_items``) and how to turn item indices into a batch (``_build_batch``). The
helpers ``windows_in_documents`` and ``gather`` are meant for the segmented samplers
(chunk / prefix / randompos) too: list the windows of L_e tokens, then cut from them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from extrapos.data.batch import Batch
from extrapos.data.shards import TokenSplit
from extrapos.errors import UserError


def windows_in_documents(
    doc_lengths: np.ndarray, span: int, stride: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """All windows of ``span`` tokens that fit inside single documents, ``stride`` apart.

    Returns ``(doc_index, start_in_doc)``, int64 arrays in document order. A document of n
    tokens holds ``(n - span) // stride + 1`` windows (none when n < span). With
    ``span = seq_len + 1`` and ``stride = seq_len`` windows share one token, the last target of
    one being the first input of the next, so every token but the first is predicted once.
    """
    stride = span if stride is None else stride
    lengths = np.asarray(doc_lengths, dtype=np.int64)
    counts = np.where(lengths >= span, (lengths - span) // stride + 1, 0)
    doc_index = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first_of_doc = np.repeat(np.cumsum(counts) - counts, counts)
    start_in_doc = (np.arange(len(doc_index), dtype=np.int64) - first_of_doc) * stride
    return doc_index, start_in_doc


def gather(tokens: np.ndarray, starts: np.ndarray, span: int) -> np.ndarray:
    """``tokens[start : start + span]`` for every start, as one int64 array (len(starts), span).

    Copying row slices touches only the pages the windows live on; it is faster than one fancy
    index over a memmap for windows of more than a few tokens.
    """
    out = np.empty((len(starts), span), dtype=np.int64)
    for row, start in enumerate(starts.tolist()):
        out[row] = tokens[start : start + span]
    return out


class Sampler:
    """Endless, deterministic, resumable, rank-sharded stream over ``num_items`` items per epoch.

    Each epoch the items are permuted with ``(seed, epoch)``, and the epochs' permutations laid end
    to end are one global stream that does not depend on the number of ranks. A batch of every
    rank together is the next ``world_size x batch_size`` items of that stream, of which rank r
    takes every world_size-th item starting at r. So 2 ranks x batch b read, step for step, the same
    windows as 1 rank x batch 2b (the same global batch, only split), every rank gets the same number
    of items per batch, and the stream position (``state_dict``) counts items of all ranks: a run
    checkpointed on one world size resumes on another where it stopped. Batches run across epoch
    boundaries, so the stream never ends and never repeats a partial batch.
    """

    def __init__(
        self,
        split: TokenSplit,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if seq_len < 1 or batch_size < 1:
            raise UserError(
                f"Sequence length and batch size must be positive, got {seq_len} and {batch_size}."
            )
        if not 0 <= rank < world_size:
            raise UserError(f"Rank {rank} is outside the world size {world_size}.")
        self.split, self.seq_len, self.batch_size = split, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self._epoch, self._position = 0, 0
        self._order_cache: tuple[int, np.ndarray] | None = None

    # --- what a subclass provides -----------------------------------------------------------

    @property
    def num_items(self) -> int:
        """Items (e.g. windows) in one epoch, over all ranks."""
        raise NotImplementedError

    def _build_batch(self, items: np.ndarray, epochs: np.ndarray) -> Batch:
        """The batch for these item indices (``epochs``: the epoch each was drawn in, for
        samplers that draw random cuts per item and must redraw them identically on resume)."""
        raise NotImplementedError

    # --- the shared machinery ---------------------------------------------------------------

    @property
    def windows_per_epoch(self) -> int:
        """Items this rank sees per epoch (on average: an epoch of an odd number of items is split
        unevenly when a global batch runs across its end)."""
        return self.num_items // self.world_size

    @property
    def epoch(self) -> int:
        """The epoch the next item is drawn from."""
        return self._epoch

    def _check_not_empty(self, what: str) -> None:
        if self.windows_per_epoch == 0:
            raise UserError(
                f"No {what} of {self.seq_len + 1} tokens fits in split '{self.split.split}' of "
                f"'{self.split.directory}' ({self.split.num_docs} documents, longest "
                f"{int(self.split.doc_lengths.max(initial=0))} tokens) for {self.world_size} rank(s); "
                "use a shorter sequence length or prepare longer documents."
            )

    def _order(self, epoch: int) -> np.ndarray:
        """The items of ``epoch`` in order (all ranks' together)."""
        if self._order_cache is None or self._order_cache[0] != epoch:
            self._order_cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_items))
        return self._order_cache[1]

    def _next_global(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``count`` items of the global stream and their epochs; advances the stream."""
        items, epochs = [], []
        while count:
            order = self._order(self._epoch)
            taken = order[self._position : self._position + count]
            items.append(taken)
            epochs.append(np.full(len(taken), self._epoch, dtype=np.int64))
            count -= len(taken)
            self._position += len(taken)
            if self._position == len(order):
                self._epoch, self._position = self._epoch + 1, 0
        return np.concatenate(items), np.concatenate(epochs)

    def next_items(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's ``count`` items of the next global batch and their epochs; advances the stream.

        Every rank advances the global stream by ``world_size x count`` and keeps its own slice, so the
        ranks stay in step without talking to each other."""
        items, epochs = self._next_global(count * self.world_size)
        return items[self.rank :: self.world_size], epochs[self.rank :: self.world_size]

    def next_batch(self) -> Batch:
        return self._build_batch(*self.next_items(self.batch_size))

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        """Where the stream stands, as plain JSON: enough to resume mid-epoch exactly.

        ``position`` counts the items of the epoch that all ranks together have taken
        (``stream = "global"``), so the state means the same on any number of ranks."""
        return {
            "sampler": type(self).__name__,
            "epoch": self._epoch,
            "position": self._position,
            "stream": "global",
            "seed": self.seed,
            "seq_len": self.seq_len,
            "world_size": self.world_size,
            "num_items": self.num_items,
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        for key in ("sampler", "seed", "seq_len", "num_items"):
            if state.get(key) != mine[key]:
                raise UserError(
                    f"Cannot resume the data stream: its {key} was {state.get(key)!r}, now "
                    f"{mine[key]!r}; resume with the same data, sequence length and seed."
                )
        position = int(state["position"])
        if state.get("stream") != "global":
            # saved before positions were global: each of its world_size ranks had taken `position`
            # items of an epoch whose interleaved order is the same as the global stream's
            position *= int(state.get("world_size", 1))
        if not 0 <= position < max(self.num_items, 1):
            raise UserError(
                f"Cannot resume the data stream: position {state['position']} is outside the epoch."
            )
        self._epoch, self._position = int(state["epoch"]), position


class ContiguousSampler(Sampler):
    """Non-overlapping windows of ``seq_len`` tokens (+1 for the targets), shuffled per epoch.

    By default a window never crosses a document boundary (a document of n tokens gives
    ``(n - 1) // seq_len`` windows; the remainder is dropped), so the model never attends across
    unrelated texts, and positions run 0..seq_len-1 in every window. On corpora whose documents are
    shorter than the window that sees little of the data (``coverage``); ``packed=True`` instead cuts
    windows from all documents laid end to end, each followed by the end-of-text token (the stream
    ``d0 EOT d1 EOT d2 ...``, as nanoGPT packs FineWeb), and every target token of the split is
    predicted exactly once per epoch: the last window, shorter than the others, is padded with
    end-of-text tokens whose targets are masked out of the loss.

    Packed rows hold several documents. The end-of-text that ends document d-1 is the first input
    token of document d's segment (its targets are d's first tokens, like a beginning-of-sequence
    token). ``document_mask`` sets ``Batch.documents``, so attention stays inside each segment;
    ``document_positions="restart"`` starts positions at 0 at each segment (the first segment of a
    row starts at 0 wherever its document was cut), ``"continue"`` numbers the row 0..seq_len-1.
    Masked and restarted, a packed row computes what each of its segments would alone.
    """

    def __init__(
        self,
        split: TokenSplit,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        packed: bool = False,
        document_mask: bool = False,
        document_positions: str = "continue",
    ):
        super().__init__(split, seq_len, batch_size, seed, rank, world_size)
        if document_positions not in ("continue", "restart"):
            raise UserError(
                f"document_positions must be 'continue' or 'restart', got {document_positions!r}."
            )
        if not packed and (document_mask or document_positions != "continue"):
            raise UserError("Document masks and restarted positions apply to packed windows only.")
        self.packed, self.document_mask, self.document_positions = packed, document_mask, document_positions
        self._tail = packed  # packed: a last, padded window holds the stream's remainder
        if packed:
            # Document d starts at offsets[d] + d in the packed stream (one end-of-text per earlier doc).
            self._packed_offsets = split.offsets + np.arange(len(split.offsets), dtype=np.int64)
            self._stream_length = split.num_tokens + split.num_docs
        else:
            doc_index, start_in_doc = windows_in_documents(split.doc_lengths, seq_len + 1, seq_len)
            self._starts = split.offsets[doc_index] + start_in_doc
        self._set_packed_starts()
        self._check_not_empty("packed window" if packed else "window")
        self._positions = torch.arange(seq_len, dtype=torch.int64)

    def _set_packed_starts(self) -> None:
        if not self.packed:
            return
        targets = max(self._stream_length - 1, 0)  # every stream token but the first is a target
        count = -(-targets // self.seq_len) if self._tail else targets // self.seq_len
        self._starts = np.arange(count, dtype=np.int64) * self.seq_len

    @property
    def num_items(self) -> int:
        return len(self._starts)

    def coverage(self) -> tuple[int, int]:
        """(tokens of the split that some window of an epoch predicts, tokens of the split).

        Unpacked windows reach only documents of at least seq_len + 1 tokens, and of those all but
        the remainder; packed windows reach every token but the stream's first."""
        total = self.split.num_tokens
        if not self.packed:
            return int(len(self._starts)) * self.seq_len, total
        end = min(len(self._starts) * self.seq_len + 1, self._stream_length)  # stream tokens [1, end)
        first = self._packed_offsets[:-1]
        lengths = self.split.doc_lengths
        reached = np.clip(np.minimum(first + lengths, end) - np.maximum(first, 1), 0, None)
        return int(reached.sum()), total

    def _packed_gather(self, starts: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokens of the stream windows at ``starts`` (len(starts), span), which of them are end-of-text
        (or padding past the stream's end), and which lie past the stream's end."""
        stream_index = starts[:, None] + np.arange(span, dtype=np.int64)
        past = stream_index >= self._stream_length
        stream_index = np.minimum(stream_index, self._stream_length - 1)
        doc = np.searchsorted(self._packed_offsets, stream_index, side="right") - 1
        in_doc = stream_index - self._packed_offsets[doc]
        is_eot = in_doc == self.split.doc_lengths[doc]
        token_index = np.where(is_eot, 0, self.split.offsets[doc] + in_doc)
        out = np.asarray(self.split.tokens[token_index.ravel()], dtype=np.int64).reshape(stream_index.shape)
        out[is_eot | past] = self.split.eot_id
        return out, is_eot | past, past

    def _segments(self, eot: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Per input token (rows, seq_len): the row's document numbers (0, 0, 1, 1, 1, 2, ...) and the
        positions the row's ``document_positions`` asks for. The end-of-text ending document d - 1
        opens d's segment (each padding token past the stream is a segment of its own)."""
        opens = np.zeros(eot[:, :-1].shape, dtype=bool)
        opens[:, 1:] = eot[:, 1:-1]  # a row's first token opens its first segment whatever it is
        segment = np.cumsum(opens, axis=1)
        documents = torch.from_numpy(segment)
        if self.document_positions == "continue":
            return documents, self._positions.repeat(len(eot), 1)
        index = np.broadcast_to(np.arange(self.seq_len, dtype=np.int64), segment.shape)
        seg_start = np.maximum.accumulate(np.where(opens, index, 0), axis=1)
        return documents, torch.from_numpy(index - seg_start)

    def _build_batch(self, items: np.ndarray, epochs: np.ndarray) -> Batch:
        starts = self._starts[items]
        span = self.seq_len + 1
        rows = len(items)
        if not self.packed:
            windows = torch.from_numpy(gather(self.split.tokens, starts, span))
            return Batch(
                tokens=windows[:, :-1].contiguous(),
                targets=windows[:, 1:].contiguous(),
                positions=self._positions.repeat(rows, 1),
                loss_mask=torch.ones(rows, self.seq_len, dtype=torch.bool),
            )
        gathered, eot, past = self._packed_gather(starts, span)
        windows = torch.from_numpy(gathered)
        if self.document_mask or self.document_positions == "restart":
            documents, positions = self._segments(eot)
        else:
            documents, positions = None, self._positions.repeat(rows, 1)
        return Batch(
            tokens=windows[:, :-1].contiguous(),
            targets=windows[:, 1:].contiguous(),
            positions=positions,
            loss_mask=torch.from_numpy(~past[:, 1:]).contiguous(),
            documents=documents if self.document_mask else None,
        )

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "packed": self.packed}
        if self.packed:
            state.update(
                tail=self._tail, document_mask=self.document_mask, document_positions=self.document_positions
            )
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("packed", False) != self.packed:
            raise UserError(
                "Cannot resume the data stream: it was saved with packed="
                f"{state.get('packed')}, now packed={self.packed}."
            )
        if self.packed:
            for key, default in (("document_mask", False), ("document_positions", "continue")):
                if state.get(key, default) != getattr(self, key):
                    raise UserError(
                        f"Cannot resume the data stream: it was saved with {key}="
                        f"{state.get(key, default)!r}, now {getattr(self, key)!r}; resume with the same "
                        "data settings."
                    )
            # a stream saved before packed epochs kept their remainder resumes without it, exactly as it was
            self._tail = bool(state.get("tail", False))
            self._set_packed_starts()
            self._order_cache = None
        super().load_state_dict(state)
