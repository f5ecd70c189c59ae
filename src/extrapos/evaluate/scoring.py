"""Scoring a model's next-token losses: per-token cross-entropy with the logits formed in chunks, the
documents protocol's windows (plain or sliding, dealt out to the ranks by ``runtime.Shard``), the
per-position curve in buckets, and ``Scored``, what a protocol hands back to the evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from extrapos.run.runtime import Shard

if TYPE_CHECKING:
    from tqdm import tqdm

    from extrapos.model import Decoder


@torch.no_grad()
def token_losses(
    model: Decoder,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    precision: str = "fp32",
    logit_chunk: int = 1024,
) -> torch.Tensor:
    """Per-token cross-entropy (B, T) in fp32; logits are formed in chunks of positions to save memory."""
    from extrapos.run.runtime import autocast

    device = tokens.device
    with autocast(device, precision):
        h = model.hidden_states(tokens, positions)
    out = torch.empty(targets.shape, dtype=torch.float32, device=device)
    for s in range(0, h.shape[1], logit_chunk):
        with autocast(device, precision):
            logits = model.logits(h[:, s : s + logit_chunk])
        out[:, s : s + logit_chunk] = F.cross_entropy(
            logits.float().flatten(0, 1), targets[:, s : s + logit_chunk].flatten(), reduction="none"
        ).view(targets.shape[0], -1)
    return out


def score_windows(
    model: Decoder,
    spans: torch.Tensor,
    window: int,
    batch_tokens: int,
    precision: str,
    stride: int | None = None,
    bar: tqdm | None = None,
    shard: Shard | None = None,
) -> torch.Tensor:
    """Loss of every target of every span, scored in windows of ``window`` tokens: (n_spans, span_len).

    Plain mode: non-overlapping windows, each starting at position 0. Sliding mode (``stride``):
    windows advance by ``stride`` and each scores only its last ``stride`` targets (the first window
    scores all of its own), so every target is scored once with up to ``window - 1`` tokens of context.
    Under torchrun the batches are dealt out to the ranks (``shard``, default the group this process
    joined) and the losses summed: each target is scored by one rank in the batch a single process would
    put it in, so the result is the same.
    """
    n, span_plus = spans.shape
    span_len = span_plus - 1
    device = next(model.parameters()).device
    shard = shard or Shard.of_group(device)
    # others' targets stay 0 and are summed in
    out = torch.empty(n, span_len) if shard.world == 1 else torch.zeros(n, span_len)
    if stride is None or stride >= window:
        starts = [(s, s, s + window) for s in range(0, span_len, window)]  # (window start, score from, to)
    else:
        starts, s = [(0, 0, window)], window
        while s < span_len:  # the last window ends on the span's end even when stride does not divide it
            e = min(s + stride, span_len)
            starts.append((e - window, s, e))
            s = e
    # all (span, window) pairs, scored in batches of about batch_tokens
    jobs = [(i, w) for i in range(n) for w in starts]
    per_batch = max(1, batch_tokens // window)
    positions = torch.arange(window, device=device).unsqueeze(0)
    for b in range(0, len(jobs), per_batch):
        if not shard.take():
            continue
        chunk = jobs[b : b + per_batch]
        toks = torch.stack([spans[i, w0 : w0 + window] for i, (w0, _, _) in chunk]).to(device)
        tgts = torch.stack([spans[i, w0 + 1 : w0 + window + 1] for i, (w0, _, _) in chunk]).to(device)
        losses = token_losses(model, toks, positions.expand(len(chunk), -1), tgts, precision).cpu()
        for row, (i, (w0, s0, s1)) in enumerate(chunk):
            out[i, s0:s1] = losses[row, s0 - w0 : s1 - w0]
        if bar is not None:
            bar.update(sum(s1 - s0 for _, (_, s0, s1) in chunk) * shard.world)
    return shard.sum(out)  # every target was written by exactly one rank and is 0 on the others: exact


def bucketed(curve: torch.Tensor, buckets: int, window: int | None = None) -> dict[str, Any]:
    """Bucket means of a loss curve over the last ``curve.numel()`` positions of windows of ``window``
    tokens (default: the whole window)."""
    n = curve.numel()
    window = n if window is None else window
    buckets = max(1, min(buckets, n))
    edges = np.linspace(0, n, buckets + 1).astype(int)
    return {
        "window": window,
        "starts": (edges[:-1] + window - n).tolist(),
        "ends": (edges[1:] + window - n).tolist(),
        "loss": [float(curve[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])],
    }


@dataclass
class Scored:
    """One protocol's scores of a run: a row per length, the per-position curve of the longest, and what
    the result says about the targets (documents used, tokens, bytes, ...)."""

    run: Any
    L: int
    data_dir: str
    rows: list[dict[str, Any]]
    per_position: dict[str, Any] | None
    facts: dict[str, Any]
