"""Window samplers: turn a memory-mapped token split into an endless stream of ``Batch``es.

Every sampler is deterministic for a seed, shuffles its items again each epoch (with
``(seed, epoch)``), shards them across data-parallel ranks, and can resume mid-epoch from a small
JSON state. The base class ``Sampler`` does all of that; a subclass only says how many items an
epoch has (``num_items``) and how to turn item indices into a batch (``_build_batch``). The
helpers ``windows_in_documents`` and ``gather`` are meant for the segmented samplers
(chunk / prefix / randompos) too: list the windows of L_e tokens, then cut from them.
"""

from __future__ import annotations

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

    def __iter__(self):
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
    unrelated texts. ``packed=True`` instead cuts windows from all documents laid end to end,
    each followed by the end-of-text token. Positions restart at 0 in every window: the model
    sees each window as its own sequence. Every target counts in the loss.
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
    ):
        super().__init__(split, seq_len, batch_size, seed, rank, world_size)
        self.packed = packed
        if packed:
            # Document d starts at offsets[d] + d in the packed stream (one end-of-text per earlier doc).
            self._packed_offsets = split.offsets + np.arange(len(split.offsets), dtype=np.int64)
            stream = split.num_tokens + split.num_docs
            self._starts = np.arange(max(stream - 1, 0) // seq_len, dtype=np.int64) * seq_len
        else:
            doc_index, start_in_doc = windows_in_documents(split.doc_lengths, seq_len + 1, seq_len)
            self._starts = split.offsets[doc_index] + start_in_doc
        self._check_not_empty("packed window" if packed else "window")
        self._positions = torch.arange(seq_len, dtype=torch.int64)

    @property
    def num_items(self) -> int:
        return len(self._starts)

    def _packed_gather(self, starts: np.ndarray, span: int) -> np.ndarray:
        stream_index = starts[:, None] + np.arange(span, dtype=np.int64)
        doc = np.searchsorted(self._packed_offsets, stream_index, side="right") - 1
        in_doc = stream_index - self._packed_offsets[doc]
        is_eot = in_doc == self.split.doc_lengths[doc]
        token_index = np.where(is_eot, 0, self.split.offsets[doc] + in_doc)
        out = np.asarray(self.split.tokens[token_index.ravel()], dtype=np.int64).reshape(stream_index.shape)
        out[is_eot] = self.split.eot_id
        return out

    def _build_batch(self, items: np.ndarray, epochs: np.ndarray) -> Batch:
        starts = self._starts[items]
        span = self.seq_len + 1
        windows = (
            self._packed_gather(starts, span) if self.packed else gather(self.split.tokens, starts, span)
        )
        windows = torch.from_numpy(windows)
        rows = len(items)
        return Batch(
            tokens=windows[:, :-1].contiguous(),
            targets=windows[:, 1:].contiguous(),
            positions=self._positions.repeat(rows, 1),
            loss_mask=torch.ones(rows, self.seq_len, dtype=torch.bool),
        )

    def state_dict(self) -> dict:
        return {**super().state_dict(), "packed": self.packed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("packed", False) != self.packed:
            raise UserError(
                "Cannot resume the data stream: it was saved with packed="
                f"{state.get('packed')}, now packed={self.packed}."
            )
        super().load_state_dict(state)
