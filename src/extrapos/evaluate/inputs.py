"""What an evaluation loads before it scores: the run at the checkpoint its result slot names, with the
request's fixed inference-time options set, the held-out split (the run's own, another corpus
tokenized with the run's tokenizer, or a prepared directory) and, for the documents protocol, the
spans of max(lengths) x L_t tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from extrapos.errors import UserError
from extrapos.evaluate.request import EvalRequest, request_lengths
from extrapos.evaluate.spans import collect_spans
from extrapos.run.handle import Run

if TYPE_CHECKING:
    import torch

    from extrapos.data.shards import TokenSplit
    from extrapos.run.checkpoint import Checkpoint
    from extrapos.run.handle import LoadedRun


def eval_split(run: LoadedRun, req: EvalRequest, progress: bool) -> tuple[TokenSplit, str]:
    """The token split to score: the run's held-out split, or another corpus tokenized with the run's
    tokenizer; data tokenized with another tokenizer is refused (its ids would be scored as other tokens)."""
    from extrapos.data import open_split, prepare_data
    from extrapos.run.runtime import check_data_tokenizer, prepare_run_data

    if req.data_dir:
        check_data_tokenizer(req.data_dir, run.tokenizer.hash, run.path, "pass DIR as --data")
        return open_split(req.data_dir, req.split), req.data_dir
    if req.corpus:
        # every document of a foreign corpus is held out for this model: put them all in `test`
        tok_spec = str(tokenizer_file(run.path))
        data_dir = prepare_data(
            req.corpus, tok_spec, None, split_fractions=(0.0, 0.0, 1.0), progress=progress
        )
        check_data_tokenizer(data_dir, run.tokenizer.hash, run.path, "pass DIR as --data")
        return open_split(data_dir, "test"), str(data_dir)
    data_dir = run.data_dir
    if data_dir is None:
        data_dir = prepare_run_data(run.cfg, progress=progress, run_dir=run.path)
    else:  # data.json names the data the run trained on; it may since have been prepared again
        check_data_tokenizer(data_dir, run.tokenizer.hash, run.path, "pass DIR as --data")
    return open_split(data_dir, req.split), str(data_dir)


def tokenizer_file(run_dir: Path) -> Path:
    """The tokenizer file the run holds (the run directory itself for a named tokenizer)."""
    from extrapos.run.runtime import run_tokenizer_file

    return run_tokenizer_file(run_dir) or run_dir


@dataclass
class ScoredRun:
    """A run loaded for evaluation, with the request's fixed position options set, its lengths and the
    held-out split to score."""

    run: Any
    lengths: list[int | float]  # each length's ev (window / L_t), in the order of ``windows``
    L: int
    max_len: int
    per_window: set[str]  # options set per evaluated window (value "window"), e.g. learned interpolate_to
    split: Any
    data_dir: str
    windows: list[int] = field(default_factory=list)  # each length's window in tokens, ascending


def load_scored_run(
    handle: Run, req: EvalRequest, ckpt: Checkpoint | None, device: str | torch.device, progress: bool
) -> ScoredRun:
    """Load the run at ``ckpt``, set the request's fixed position options and open the held-out split."""
    from extrapos.run.directory import load_run

    run = load_run(handle, device=device, checkpoint=ckpt)
    L = req.base_length or run.cfg.model.train_length
    resolved = request_lengths(req, L)
    lengths, windows = [x.ev for x in resolved], [x.window for x in resolved]
    max_len = max(windows)
    per_window = {k for k, v in req.position_options.items() if v == "window"}
    fixed = {
        k: v for k, v in resolve_options(req.position_options, max_len, L).items() if k not in per_window
    }
    if fixed:
        run.model.pos.set_options(**fixed)
    split, data_dir = eval_split(run, req, progress)
    return ScoredRun(run, lengths, L, max_len, per_window, split, data_dir, windows)


@dataclass
class EvalInputs:
    """What an evaluation of a run scores: the loaded run with its fixed position options set, the
    lengths, and the held-out spans of max(lengths) x L_t (+1) tokens with their documents."""

    run: Any
    lengths: list[int | float]  # each length's ev (window / L_t), in the order of ``windows``
    L: int
    max_len: int
    per_window: set[str]  # options set per evaluated window (value "window"), e.g. learned interpolate_to
    data_dir: str
    spans: np.ndarray
    owners: np.ndarray
    docs_used: int
    docs_skipped: int
    windows: list[int] = field(default_factory=list)  # each length's window in tokens, ascending


def load_eval_inputs(
    handle: Run, req: EvalRequest, ckpt: Checkpoint | None, device: str | torch.device, progress: bool
) -> EvalInputs:
    """Load the run at ``ckpt``, set the request's fixed position options and cut the held-out spans of the
    documents protocol: the shared start of the next-token and the masked-LM evaluations."""
    if req.protocol != "documents":
        raise UserError(
            "the stream protocol scores next-token losses of decoders; a masked-LM (encoder) evaluation uses "
            "the documents protocol only, so drop the stream protocol."
        )
    r = load_scored_run(handle, req, ckpt, device, progress)
    spans, docs_used, docs_skipped, owners = collect_spans(
        r.split, r.max_len, req.max_tokens, with_documents=True, selection=req.selection
    )
    return EvalInputs(
        r.run,
        r.lengths,
        r.L,
        r.max_len,
        r.per_window,
        r.data_dir,
        spans,
        owners,
        docs_used,
        docs_skipped,
        r.windows,
    )


def resolve_options(options: dict[str, Any], max_len: int, L: int) -> dict[str, Any]:
    # "max": stretch to the longest evaluated window (in tokens); "ev": the longest window over L_t (a RoPE
    # scaling's factor, so each column of an eval_each_length sweep scales by its own k); "window" (the
    # CLI's --interpolate): to each window, set per window by the caller
    named = {"max": max_len, "ev": max_len / L}
    return {k: (named[v] if isinstance(v, str) and v in named else v) for k, v in options.items()}
