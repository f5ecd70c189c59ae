"""The stream protocol of `extrapos eval`: train short, test long on corpora of short documents.

The documents protocol (``evaluate/documents.py``) needs held-out documents of max(k) x L_t + 1 tokens; a web
corpus (documents of a few hundred tokens) has none. Here the held-out documents are joined in their
order, each opened by an end-of-text token::

    EOT d0 EOT d1 EOT ... EOT d_{N-1} EOT

As in packed training windows (``data/sampling.py``), the end-of-text that ends document d-1 is the
first input of document d's segment, so d's first token is predicted from an end-of-text; the
stream's leading end-of-text opens d0 the same way, so every document is scored alike. Every stream
token after the first is a target (a document's closing end-of-text included: predicting where a
document ends is part of the stream, as in packed training), owned by the document whose segment
predicts it: its own tokens and its closing end-of-text.

Targets are fixed once for all lengths: blocks of B = L_t consecutive targets, on a grid of B that
starts where the stream first holds a whole longest window (max(k) x L_t inputs) before a block's end,
``max_tokens // B`` of them evenly spaced over the grid, or all of it when the budget is larger. At
ev = k a block is scored by the window of k x L_t tokens that ends with it: its targets sit at the
window's last L_t positions with (k - 1) L_t .. k L_t - 1 tokens of context, and at ev = 1 the window
is the block itself. So every length scores the same targets, and each holds as much preceding stream
as its window allows.

Why B = L_t: at ev = 1 the block is an ordinary training-length window (contexts 0..L_t - 1, as in
training), the reference the other lengths are read against; at ev = k every scored target has at
least (k - 1) L_t tokens of context, so a column measures the positions and contexts past L_t of all
its targets, not a mix in which most targets see less (non-overlapping windows give 1/k of them less
than L_t). A smaller block costs more: a block is one forward pass of k x L_t tokens per length, so
the default lengths 1..16 cost 31 window tokens per target (the documents protocol costs 5); B = 1
would be a sliding window at 31 L_t per target. A larger one cannot be scored by an L_t window.

Crossing a document boundary (``boundary``, named in every result):

* ``cross``: a window is a plain slice of the stream, positions 0..k L_t - 1, its context running back
  over earlier documents, as the CABLE paper's nanoGPT-style evaluation (and packed training without a
  mask) does. Longer windows add unrelated text as well as positions the model never trained on.
* ``mask``: the model's document mask keeps every target to its own document's earlier tokens (and the
  end-of-text opening it), with positions restarting at 0 at each document (the first one of a window
  at the window's start, wherever it cut its document), exactly as packed masked training rows number
  them. A masked window then computes what the document alone would, with the context the window
  leaves it, wherever the document falls in the stream. Once a window holds a whole document the
  document's targets stop changing with length: differences between lengths come only from documents
  longer than the shorter window.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from extrapos.errors import UserError
from extrapos.evaluate.inputs import load_scored_run
from extrapos.evaluate.request import EvalRequest
from extrapos.evaluate.scoring import Scored, bucketed
from extrapos.evaluate.spans import per_document, targets_digest
from extrapos.evaluate.window_options import per_window_options
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard

if TYPE_CHECKING:
    from tqdm import tqdm

    from extrapos.data.shards import TokenSplit
    from extrapos.data.tokenizer import Tokenizer
    from extrapos.model import Decoder
    from extrapos.run.checkpoint import Checkpoint


class TokenStream:
    """The documents of a split joined in their order, each opened by an end-of-text:
    ``EOT d0 EOT d1 ... EOT d_{N-1} EOT`` (stream index i, 0 <= i < length)."""

    def __init__(self, split: TokenSplit):
        self.split = split
        n = split.num_docs
        offsets = np.asarray(split.offsets, dtype=np.int64)
        self.opens = offsets[:-1] + np.arange(n, dtype=np.int64)  # the end-of-text opening each document
        self.doc_lengths = np.asarray(split.doc_lengths, dtype=np.int64)
        self.length = int(offsets[-1]) + n + 1
        self.eot_id = int(split.eot_id)

    def segment(self, index: np.ndarray) -> np.ndarray:
        """The document whose segment holds each stream index (its opening end-of-text and its tokens;
        the stream's last end-of-text is the last document's)."""
        return np.searchsorted(self.opens, index, side="right") - 1

    def owner(self, index: np.ndarray) -> np.ndarray:
        """The document a target at each stream index belongs to: the segment of the input predicting it."""
        return self.segment(np.asarray(index) - 1)

    def gather(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, is end-of-text) at the stream indices ``index`` (any shape), int64 and bool."""
        index = np.asarray(index, dtype=np.int64)
        seg = self.segment(index)
        in_doc = index - self.opens[seg] - 1  # -1: the opening end-of-text
        is_eot = (in_doc < 0) | (in_doc >= self.doc_lengths[seg])
        token_index = np.where(is_eot, 0, np.asarray(self.split.offsets, dtype=np.int64)[seg] + in_doc)
        out = np.asarray(self.split.tokens[token_index.ravel()], dtype=np.int64).reshape(index.shape)
        out[is_eot] = self.eot_id
        return out, is_eot


def select_blocks(stream_length: int, block: int, longest: int, max_tokens: int) -> np.ndarray:
    """The exclusive stream ends of the target blocks (targets ``[end - block, end)``), ascending.

    A block's longest window (``longest`` inputs, ending with its last input) must fit in the stream, so
    ends run from ``longest + 1`` in steps of ``block``; of those candidates, ``max(1, max_tokens //
    block)`` evenly spaced ones (the i-th of m from n is ``i * n // m``), or all when fewer. Raises a
    UserError when the stream cannot hold one longest window."""
    first = longest + 1
    if stream_length < first:
        raise UserError(
            f"the held-out stream has {stream_length:,} tokens, fewer than the {first:,} that the longest "
            f"window ({longest:,} tokens) needs with one block of targets; use lengths whose longest window "
            f"is at most {max(stream_length - 1, 0):,} tokens, a larger split, or another corpus."
        )
    candidates = (stream_length - first) // block + 1
    wanted = max(1, max_tokens // block)
    j = np.arange(candidates) if wanted >= candidates else (np.arange(wanted) * candidates) // wanted
    return first + j.astype(np.int64) * block


def document_rows(segments: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """For windows whose inputs lie in these document segments (rows, T): the document numbers of each
    row (0, 0, 1, 1, 1, 2, ...) and positions restarting at 0 at each document (the first at the window's
    start), as packed masked training rows have them."""
    rows, T = segments.shape
    opens = np.zeros((rows, T), dtype=bool)
    opens[:, 1:] = segments[:, 1:] != segments[:, :-1]
    index = np.broadcast_to(np.arange(T, dtype=np.int64), (rows, T))
    start = np.maximum.accumulate(np.where(opens, index, 0), axis=1)
    documents = np.cumsum(opens, axis=1)
    return torch.from_numpy(documents), torch.from_numpy(index - start)


def window_batch(
    stream: TokenStream, ends: np.ndarray, window: int, mask: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(inputs, targets, positions, documents) of the windows of ``window`` tokens ending with the blocks
    at ``ends``: inputs ``[end - window - 1, end - 1)``, targets one further; ``documents`` only with
    ``mask`` (positions then restart at every document), else positions 0..window - 1."""
    index = (np.asarray(ends, dtype=np.int64) - window - 1)[:, None] + np.arange(window + 1, dtype=np.int64)
    tokens = torch.from_numpy(stream.gather(index)[0])
    if mask:
        documents, positions = document_rows(stream.segment(index[:, :-1]))
    else:
        documents, positions = None, torch.arange(window, dtype=torch.int64).expand(len(ends), -1)
    return tokens[:, :-1], tokens[:, 1:], positions, documents


@torch.no_grad()
def block_losses(
    model: Decoder,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    documents: torch.Tensor | None = None,
    precision: str = "fp32",
    logit_tokens: int = 4096,
) -> torch.Tensor:
    """Cross-entropy (B, b) in fp32 of the last ``b = targets.shape[1]`` positions of windows (B, T); the
    head runs on those positions only, ``logit_tokens`` at a time, to bound the logits' memory."""
    from extrapos.run.runtime import autocast

    device = tokens.device
    with autocast(device, precision):
        h = model.hidden_states(tokens, positions, documents=documents)
    b = targets.shape[1]
    h = h[:, -b:].reshape(-1, h.shape[-1])
    flat = targets.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float32, device=device)
    for s in range(0, len(flat), logit_tokens):
        with autocast(device, precision):
            logits = model.logits(h[s : s + logit_tokens])
        out[s : s + logit_tokens] = F.cross_entropy(
            logits.float(), flat[s : s + logit_tokens], reduction="none"
        )
    return out.view(targets.shape)


def score_blocks(
    model: Decoder,
    stream: TokenStream,
    ends: np.ndarray,
    block: int,
    window: int,
    batch_tokens: int,
    precision: str = "fp32",
    mask: bool = False,
    bar: tqdm | None = None,
    shard: Shard | None = None,
) -> torch.Tensor:
    """Loss (n_blocks, block) of every block's targets, each block scored by the window of ``window``
    tokens that ends with it. Under torchrun the batches are dealt out to the ranks (``shard``, default the
    group this process joined) and the losses summed, as ``score_windows`` does: the result is the same."""
    n = len(ends)
    device = next(model.parameters()).device
    shard = shard or Shard.of_group(device)
    out = torch.empty(n, block) if shard.world == 1 else torch.zeros(n, block)
    per_batch = max(1, batch_tokens // window)
    for b in range(0, n, per_batch):
        if not shard.take():
            continue
        chunk = ends[b : b + per_batch]
        inputs, targets, positions, documents = window_batch(stream, chunk, window, mask)
        losses = block_losses(
            model,
            inputs.to(device),
            positions.to(device),
            targets[:, -block:].to(device),
            None if documents is None else documents.to(device),
            precision,
        )
        out[b : b + len(chunk)] = losses.cpu()
        if bar is not None:
            bar.update(len(chunk) * block * shard.world)
    return shard.sum(out)  # every block was scored by exactly one rank and is 0 on the others


def target_bytes(stream: TokenStream, ends: np.ndarray, block: int, tokenizer: Tokenizer) -> int:
    """UTF-8 bytes of the document text the blocks' targets decode to (an end-of-text counts none); each
    run of one document's tokens is decoded alone."""
    total = 0
    for end in ends.tolist():
        tokens, eot = stream.gather(np.arange(end - block, end))
        cuts = np.flatnonzero(eot)
        for piece, flags in zip(np.split(tokens, cuts), np.split(eot, cuts)):
            text = piece[~flags]
            if len(text):
                total += len(tokenizer.decode(text.tolist()).encode("utf-8"))
    return total


def score_stream(
    handle: Run,
    req: EvalRequest,
    ckpt: Checkpoint | None,
    device: str | torch.device,
    batch_tokens: int = 16_384,
    progress: bool = True,
    shard: Shard | None = None,
) -> Scored:
    """The stream protocol's rows of a run (``evaluate`` writes the result): the same blocks of L_t
    targets at every length, each scored by the window of k x L_t tokens ending with it."""
    from tqdm.auto import tqdm

    scored = load_scored_run(handle, req, ckpt, device, progress)
    run, L, lengths, per_window = scored.run, scored.L, scored.lengths, scored.per_window
    stream = TokenStream(scored.split)
    block = L
    ends = select_blocks(stream.length, block, scored.max_len, req.max_tokens)
    target_index = ends[:, None] - block + np.arange(block)
    owners = stream.owner(target_index)
    digest = targets_digest(stream.gather(target_index)[0], owners)
    n_bytes = target_bytes(stream, ends, block, run.tokenizer)
    mask = req.boundary == "mask"

    rows, per_position = [], None
    total = len(ends) * block * len(lengths)
    bar = tqdm(total=total, unit="tok", disable=not progress, desc=f"eval {handle.path.name} (stream)")
    for k, window in zip(lengths, scored.windows):
        if per_window:  # as the documents protocol: e.g. a learned table interpolated to each window
            run.model.pos.set_options(**per_window_options(run.model.pos, per_window, window, L))
        losses = score_blocks(
            run.model, stream, ends, block, window, batch_tokens, req.precision, mask, bar, shard
        )
        mean = float(losses.mean())
        rows.append(
            {
                "ev": k,
                "window": window,
                "windows": len(ends),
                "tokens": int(losses.numel()),
                "loss": mean,
                "ppl": math.exp(mean),
                "bpb": float(losses.double().sum()) / (math.log(2) * max(n_bytes, 1)),
                "tail_loss": float(losses[:, -L:].mean()),  # the block is the window's last L_t tokens
                "seq_ppl": None,  # a window scores only its block: no per-sequence perplexity
                "targets": digest,
                **per_document(losses, owners),
            }
        )
        if window == scored.max_len:
            per_position = bucketed(losses.mean(0), req.buckets, window)
    bar.close()
    facts = {
        "documents_used": int(len(np.unique(owners))),
        "documents_skipped": 0,  # no document is too short for the stream
        "documents_in_split": int(scored.split.num_docs),
        "stream_tokens": int(stream.length),
        "block": int(block),
        "blocks": int(len(ends)),
        "spans": int(len(ends)),
        "target_tokens": int(len(ends) * block),
        "target_bytes": int(n_bytes),
    }
    return Scored(run, L, scored.data_dir, rows, per_position, facts)
