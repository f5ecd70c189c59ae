"""The documents protocol of `extrapos eval` (the default; ``extrapos.evaluate``'s docstring): held-out
spans of max(k) x L_t targets, split into non-overlapping windows of each length, every window starting
at position 0, so every length scores the same targets and only the context differs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from extrapos.evaluate.inputs import load_eval_inputs
from extrapos.evaluate.request import EvalRequest
from extrapos.evaluate.scoring import Scored, bucketed, score_windows
from extrapos.evaluate.spans import per_document, targets_digest
from extrapos.evaluate.window_options import per_window_options
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard

if TYPE_CHECKING:
    from extrapos.run.checkpoint import Checkpoint


def score_documents(
    handle: Run,
    req: EvalRequest,
    ckpt: Checkpoint | None,
    device: str | torch.device,
    batch_tokens: int,
    progress: bool,
    shard: Shard | None = None,
) -> Scored:
    """The documents protocol: the spans of max(lengths) x L_t tokens, split into windows of each length."""
    from tqdm.auto import tqdm

    inputs = load_eval_inputs(handle, req, ckpt, device, progress)
    run, L, max_len = inputs.run, inputs.L, inputs.max_len
    lengths, per_window = inputs.lengths, inputs.per_window
    spans_np, owners = inputs.spans, inputs.owners
    spans = torch.from_numpy(spans_np)
    n_targets = spans.shape[0] * max_len
    n_bytes = sum(len(run.tokenizer.decode(s[1:].tolist()).encode("utf-8")) for s in spans_np)
    digest = targets_digest(spans_np[:, 1:], owners)

    rows, per_position = [], None
    bar = tqdm(
        total=n_targets * len(lengths), unit="tok", disable=not progress, desc=f"eval {handle.path.name}"
    )
    for k, window in zip(lengths, inputs.windows):
        if per_window:  # e.g. a learned table interpolated to each evaluated window, as §3.2 does per L_e
            run.model.pos.set_options(**per_window_options(run.model.pos, per_window, window, L))
        losses = score_windows(run.model, spans, window, batch_tokens, req.precision, req.stride, bar, shard)
        tail = losses.view(spans.shape[0], -1, window)[:, :, -L:] if req.stride is None else losses[:, -L:]
        mean = float(losses.mean())
        rows.append(
            {
                "ev": k,
                "window": window,
                "windows": spans.shape[0] * (max_len // window),
                "tokens": int(losses.numel()),
                "loss": mean,
                "ppl": math.exp(mean),
                "bpb": float(losses.double().sum()) / (math.log(2) * max(n_bytes, 1)),
                "tail_loss": float(tail.mean()),
                # the segmented-sequences paper's eq. 3: the mean of per-sequence (per-window) perplexities
                "seq_ppl": (
                    float(losses.view(spans.shape[0], -1, window).double().mean(-1).exp().mean())
                    if req.stride is None
                    else None
                ),
                "targets": digest,
                **per_document(losses, owners),
            }
        )
        if window == max_len:
            per_position = bucketed(losses.mean(0), req.buckets)
    bar.close()
    facts = {
        "documents_used": inputs.docs_used,
        "documents_skipped": inputs.docs_skipped,
        "spans": int(spans.shape[0]),
        "target_tokens": int(n_targets),
        "target_bytes": int(n_bytes),
    }
    return Scored(run, L, inputs.data_dir, rows, per_position, facts)
