"""Segmented-sequence samplers for context extension (Karypis et al., segmented sequences §3.3).

A model trained at L_t learns to use an extended context L_e without ever training on L_e-long
inputs: every example has L_t tokens cut from one L_e window of one document and keeps each
token's ORIGINAL position in that window (and its original next token as target).

Windows: ``windows_in_documents(doc_lengths, L_e + 1, L_e)``, i.e. non-overlapping L_e-token windows
of single documents (a document's remainder and documents shorter than L_e + 1 are dropped; the
extra token is the target of the window's last position). Position p of a window is token
``window[p]`` with target ``window[p + 1]``, p in [0, L_e).

Samplers (``data.sampler``):

* ``chunk`` (alpha): 1/alpha contiguous, non-overlapping segments of alpha * L_t tokens, placed
  uniformly at random in the window (stars and bars: every ordered placement equally likely) and
  kept in order. Every token counts in the loss. ``chunk_targets`` says what a segment's last
  token predicts: ``"original"`` (default) its original next token in the window, like every other
  token; ``"concatenated"`` the next token of the concatenated example, i.e. the first token of
  the next segment (the example's very last token keeps its original next token). Only the
  1/alpha - 1 segment ends whose next segment does not touch them differ (docs/extension.md says
  why the default is ``original``).
* ``prefix`` (alpha): a suffix of alpha * L_t contiguous tokens starting at i, with
  ``(1 - alpha) L_t <= i <= L_e - alpha L_t`` (uniform), and a prefix of (1 - alpha) L_t positions
  sampled without replacement from [0, i), sorted. Loss on the suffix only (the prefix tokens keep
  their original next token as target, masked). The paper writes strict inequalities
  ``(1 - alpha) L_t < i < L_e - alpha L_t``; we include both ends because both are valid cuts
  (i = (1 - alpha) L_t is a fully contiguous example, i = L_e - alpha L_t a suffix ending on the
  window's last position, whose target exists) and excluding them would make the window's first
  and last positions rarer for no reason.
* ``full``: the L_e windows themselves (sequence length L_e, positions 0..L_e-1).
* ``randompos`` (Ruoss et al. 2023): L_t contiguous tokens from a uniformly random start in the
  window, with positions a sorted sample without replacement from [0, L_e).
* ``pose`` (Zhu et al. 2023, positional skip-wise training, §3.2): L_t contiguous tokens from a
  uniformly random start in the window, split into N chunks (``data.pose_chunks``, default 2) of random
  lengths (a uniform composition of L_t into N non-empty parts); chunk i keeps its tokens'
  consecutive positions shifted by a skip u_i, u_0 = 0 and u_i uniform in [u_{i-1}, L_e - L_t],
  so positions increase, lie in [0, L_e) and reach L_e - 1. Only positions skip: the text stays
  contiguous (the authors' released code also takes the later chunk's text from later in the
  document, and draws the first of two chunks' length from [1, ceil(L_t / 2)]).

Compute-equivalent budget (§4.4): one example per L_e window per epoch, so L_e / L_t epochs of
the L_t-token samplers and one epoch of ``full`` process the same number of tokens
(``compute_equivalent_tokens``).

Determinism: the window order is the base class's (``(seed, epoch)`` permutation, rank-sharded,
resumable mid-epoch); the random cut of an item is drawn from an RNG seeded by
``(seed, epoch, item, sampler)``, so it does not depend on the batch size, the rank or where a run
was resumed.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from extrapos.data.batch import Batch
from extrapos.data.sampling import Sampler, gather, windows_in_documents
from extrapos.data.shards import TokenSplit
from extrapos.errors import UserError

SEGMENTED = ("chunk", "prefix", "full", "randompos", "pose")
_SALT = {"chunk": 1, "prefix": 2, "full": 3, "randompos": 4, "pose": 5}
#: PoSE's number of chunks (the paper's default, 2)
POSE_CHUNKS = 2
CHUNK_TARGETS = ("original", "concatenated")


def segment_length(train_length: int, alpha: float) -> int:
    """alpha * L_t as an exact integer (a UserError if it is not one)."""
    if not 0 < alpha <= 1:
        raise UserError(f"data.alpha must be in (0, 1], got {alpha}.")
    n = alpha * train_length
    if abs(n - round(n)) > 1e-9 or round(n) < 1:
        raise UserError(
            f"data.alpha={alpha} times the training length {train_length} is {n:g}, not a positive "
            "integer; choose alpha so that alpha * L_t is a whole number of tokens."
        )
    return int(round(n))


def chunk_positions(
    rng: np.random.Generator, train_length: int, extended_length: int, alpha: float
) -> np.ndarray:
    """Sorted positions of 1/alpha contiguous segments of alpha * L_t tokens inside [0, L_e).

    Stars and bars: shrink each segment to one slot, so the window has L_e - L_t + k slots for
    k segments; choosing k of them uniformly (sorted) gives every ordered, non-overlapping
    placement the same probability. Segment j then starts at c_j + j (s - 1).
    """
    s = segment_length(train_length, alpha)
    k = train_length // s
    if k * s != train_length:
        raise UserError(
            f"chunk needs 1/alpha segments of alpha * L_t tokens to fill L_t={train_length} exactly; "
            f"alpha={alpha} gives segments of {s} tokens; use alpha = 1/2, 1/4, 1/8, ..."
        )
    slots = np.sort(rng.choice(extended_length - train_length + k, size=k, replace=False))
    starts = slots + np.arange(k) * (s - 1)
    return (starts[:, None] + np.arange(s)).ravel()


def prefix_positions(
    rng: np.random.Generator, train_length: int, extended_length: int, alpha: float
) -> tuple[np.ndarray, int]:
    """(sorted positions, prefix length): a random sorted prefix from [0, i), then alpha * L_t from i."""
    suffix = segment_length(train_length, alpha)
    prefix = train_length - suffix
    i = int(rng.integers(prefix, extended_length - suffix + 1))  # both ends included (see the module doc)
    head = np.sort(rng.choice(i, size=prefix, replace=False)) if prefix else np.empty(0, dtype=np.int64)
    return np.concatenate([head, i + np.arange(suffix)]), prefix


def pose_positions(
    rng: np.random.Generator, train_length: int, extended_length: int, chunks: int = POSE_CHUNKS
) -> np.ndarray:
    """PoSE positions of L_t contiguous tokens: N chunks, chunk i shifted by a skip u_i (see the module
    doc)."""
    if not 1 <= chunks <= train_length:
        raise UserError(f"pose needs between 1 and L_t={train_length} chunks, got {chunks}.")
    cuts = np.sort(rng.choice(np.arange(1, train_length), size=chunks - 1, replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [train_length]]))
    skips = np.zeros(chunks, dtype=np.int64)
    for i in range(1, chunks):  # u_i uniform in [u_{i-1}, L_e - L_t]
        skips[i] = rng.integers(skips[i - 1], extended_length - train_length + 1)
    return np.arange(train_length) + np.repeat(skips, lengths)


class SegmentedSampler(Sampler):
    """Examples cut from non-overlapping L_e windows of single documents (see the module doc)."""

    def __init__(
        self,
        split: TokenSplit,
        method: str,
        train_length: int,
        extended_length: int,
        batch_size: int,
        alpha: float = 0.25,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        chunk_targets: str = "original",
        pose_chunks: int = POSE_CHUNKS,
    ):
        if method not in SEGMENTED:
            raise UserError(f"unknown segmented sampler {method!r}; choose one of: {', '.join(SEGMENTED)}.")
        if chunk_targets not in CHUNK_TARGETS or (chunk_targets != "original" and method != "chunk"):
            raise UserError(
                f"data.chunk_targets must be {' or '.join(CHUNK_TARGETS)} and applies to "
                f"data.sampler=chunk only; got {chunk_targets!r} with {method}."
            )
        self.chunk_targets = chunk_targets
        if extended_length < train_length:
            raise UserError(
                f"data.extended_length={extended_length} is shorter than the training length "
                f"{train_length}; L_e must be at least L_t."
            )
        self.method, self.train_length, self.extended_length, self.alpha = (
            method,
            train_length,
            extended_length,
            alpha,
        )
        if method in ("chunk", "prefix"):
            segment_length(train_length, alpha)  # check alpha early
            if method == "chunk":
                chunk_positions(np.random.default_rng(0), train_length, extended_length, alpha)
        self.pose_chunks = pose_chunks
        if method == "pose":  # check the number of chunks early
            pose_positions(np.random.default_rng(0), train_length, extended_length, pose_chunks)
        seq_len = extended_length if method == "full" else train_length
        super().__init__(split, seq_len, batch_size, seed, rank, world_size)
        doc_index, start_in_doc = windows_in_documents(
            split.doc_lengths, extended_length + 1, extended_length
        )
        self._starts = split.offsets[doc_index] + start_in_doc
        if self.windows_per_epoch == 0:
            raise UserError(
                f"No window of {extended_length + 1} tokens (L_e + 1) fits in split '{split.split}' of "
                f"'{split.directory}' ({split.num_docs} documents, longest "
                f"{int(split.doc_lengths.max(initial=0))} tokens) for {world_size} rank(s); use a shorter "
                "data.extended_length or longer documents."
            )

    @property
    def num_items(self) -> int:
        return len(self._starts)

    def cut(self, item: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indices into the window, positions, loss mask) of one example; a pure function of (seed, epoch,
        item)."""
        L, E = self.train_length, self.extended_length
        if self.method == "full":
            idx = np.arange(E)
            return idx, idx, np.ones(E, dtype=bool)
        rng = np.random.default_rng([self.seed, epoch, item, _SALT[self.method]])
        mask = np.ones(L, dtype=bool)
        if self.method == "chunk":
            idx = chunk_positions(rng, L, E, self.alpha)
            return idx, idx, mask
        if self.method == "prefix":
            idx, prefix = prefix_positions(rng, L, E, self.alpha)
            mask[:prefix] = False
            return idx, idx, mask
        start = int(rng.integers(0, E - L + 1))  # contiguous content
        if self.method == "pose":  # positions with skips between chunks
            return start + np.arange(L), pose_positions(rng, L, E, self.pose_chunks), mask
        # randompos: positions spread over [0, L_e)
        positions = np.sort(rng.choice(E, size=L, replace=False))
        return start + np.arange(L), positions, mask

    def _build_batch(self, items: np.ndarray, epochs: np.ndarray) -> Batch:
        windows = gather(self.split.tokens, self._starts[items], self.extended_length + 1)
        rows = len(items)
        idx = np.empty((rows, self.seq_len), dtype=np.int64)
        pos = np.empty((rows, self.seq_len), dtype=np.int64)
        mask = np.empty((rows, self.seq_len), dtype=bool)
        for r, (item, epoch) in enumerate(zip(items.tolist(), epochs.tolist())):
            idx[r], pos[r], mask[r] = self.cut(item, epoch)
        target_idx = idx + 1
        if self.chunk_targets == "concatenated":
            target_idx[:, :-1] = idx[:, 1:]  # a segment's last token predicts the next segment's first
        return Batch(
            tokens=torch.from_numpy(np.take_along_axis(windows, idx, axis=1)),
            targets=torch.from_numpy(np.take_along_axis(windows, target_idx, axis=1)),
            positions=torch.from_numpy(pos),
            loss_mask=torch.from_numpy(mask),
        )

    def state_dict(self) -> dict:
        state = {
            **super().state_dict(),
            "method": self.method,
            "alpha": self.alpha,
            "extended_length": self.extended_length,
        }
        if self.chunk_targets != "original":  # absent = original, so older checkpoints' state is unchanged
            state["chunk_targets"] = self.chunk_targets
        if self.pose_chunks != POSE_CHUNKS:  # likewise
            state["pose_chunks"] = self.pose_chunks
        return state

    def load_state_dict(self, state: dict) -> None:
        state = {"chunk_targets": "original", "pose_chunks": POSE_CHUNKS, **state}
        for key in ("method", "alpha", "extended_length", "chunk_targets", "pose_chunks"):
            if state.get(key) != getattr(self, key):
                raise UserError(
                    f"Cannot resume the data stream: its {key} was {state.get(key)!r}, now "
                    f"{getattr(self, key)!r}; resume with the same data settings."
                )
        super().load_state_dict(state)


def compute_equivalent_tokens(split: TokenSplit, train_length: int, extended_length: int) -> int:
    """Tokens of the paper's budget: L_e / L_t epochs of one L_t example per L_e window (= windows x L_e)."""
    doc_index, _ = windows_in_documents(split.doc_lengths, extended_length + 1, extended_length)
    epochs = extended_length / train_length
    return int(math.floor(epochs * len(doc_index) * train_length))
