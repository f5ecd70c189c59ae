"""`extrapos eval`: train short, test long, measured the way the papers do.

Two protocols (``ev = k`` means windows of k x L_t tokens; docs/evaluation.md explains both):

**documents** (the default; needs held-out documents of ``max(k) * L_t + 1`` tokens):

1. Cut held-out documents long enough into non-overlapping spans of ``max(k) * L_t`` targets (shorter
   documents are skipped and counted), spread over as many documents as the budget allows: the first
   span of every document before the second of any (evenly spaced documents when the budget holds
   fewer spans than there are documents).
2. Split every span into non-overlapping windows of each length; every window starts at position 0.
   So every length scores exactly the same target tokens, and only the context differs.

**stream** (for corpora of documents shorter than the longest window, ``evaluate.stream``): the
held-out documents joined with end-of-text; fixed blocks of L_t targets, each scored at every length
by the window of k x L_t tokens that ends with it, its context crossing document boundaries
(``boundary = "cross"``) or masked to the target's own document (``"mask"``).

Either way:

3. Report per length: mean token loss, perplexity, bits per byte (nats of the scored tokens over
   the UTF-8 bytes they decode to), and the loss of each window's last L_t tokens ("tail": does
   a longer context help the tokens that have the most of it?).
4. Per-position loss in the longest windows, in buckets: where the model breaks.
5. For confidence intervals (``extrapos.report.stats``), per length and per document: the sum of its
   scored token losses and its number of scored tokens, with the documents' indices in the split
   (``doc_index``), so that rows scoring the same documents are paired. And the mean over windows
   of each window's perplexity (``seq_ppl``), the segmented-sequences paper's aggregate (Karypis
   et al., eq. 3), beside exp(mean loss).

Inference-time changes (ExPE/ExQPE ``scale``, RoPE scalings, learned-table interpolation) are
options of the encoding, set with ``set_options`` before scoring and recorded in the result.

Modules beside this one: ``lengths`` (multiples of L_t and window lengths), ``slot`` (the result slot
every evaluator shares), ``stream`` (the stream protocol), ``mlm`` (the same protocol for encoders:
masked-LM loss) and ``attention_stats`` (`extrapos attention`: what each head attends to at every
length).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from extrapos.errors import UserError
from extrapos.evaluate.lengths import (
    MIN_WINDOW,
    EvalLength,
    check_windows_divide,
    is_multiple,
    is_token_count,
    resolve_lengths,
)
from extrapos.evaluate.slot import (
    ResultSlot,
    check_result_name,
    open_slot,
    results_dir,
    slug,
)
from extrapos.evaluate.window_options import per_window_options
from extrapos.run.handle import Run

DEFAULT_LENGTHS = (1, 2, 4, 8, 16)
PROTOCOLS = ("documents", "stream")
BOUNDARIES = ("cross", "mask")  # the stream protocol: context crosses documents, or stays in its own
SELECTIONS = ("spread", "first")  # the documents protocol's spans: spread over documents, or the first ones

# Fields added after results were first saved, with the values that reproduce the requests of that time
# (spans taken from the first documents). A field at its legacy value is left out of the keys, so a request
# with all of them at these values has the key it had before they existed, and no other request does.
LEGACY_FIELDS: dict[str, Any] = {"protocol": "documents", "boundary": None, "selection": "first"}
# Fields added later that change nothing while unset: left out of the key and of the request a result
# records at these values, so a request that does not use them has the key and the result file it had
# before they existed.
UNSET_FIELDS: dict[str, Any] = {"tokens": None}


@dataclass
class EvalRequest:
    """Everything that defines an evaluation (the result file records it; equal requests reuse it)."""

    lengths: list[int | float] = field(default_factory=lambda: list(DEFAULT_LENGTHS))  # multiples of L_t
    tokens: list[int] | None = None  # windows given in tokens, beside (or instead of) the multiples
    base_length: int | None = None  # L_t; None -> the run's training length
    corpus: str | None = None  # None -> the run's own held-out split
    data_dir: str | None = None
    split: str = "test"
    max_tokens: int = 65_536  # target tokens scored per length (at most)
    position_options: dict[str, Any] = field(default_factory=dict)  # inference-time encoding changes
    stride: int | None = None  # sliding-window mode: score the last `stride` tokens per window
    buckets: int = 32  # per-position loss buckets over the longest window
    precision: str = "fp32"
    step: int | None = None  # checkpoint step (None: latest)
    protocol: str = "documents"  # "documents": spans inside documents; "stream": documents joined
    boundary: str | None = None  # stream only: "cross" (None means cross) or "mask"
    selection: str = "spread"  # documents only: spans "spread" over documents, or the "first" documents'

    def written(self) -> dict[str, Any]:
        """The request as a result records it (fields added later left out at their unset value)."""
        return {k: v for k, v in asdict(self).items() if k not in UNSET_FIELDS or v != UNSET_FIELDS[k]}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.key_fields(), sort_keys=True).encode()).hexdigest()[:12]

    def key_fields(self) -> dict[str, Any]:
        """The fields a key hashes: all of them, less those added later that hold their legacy value."""
        legacy = {**LEGACY_FIELDS, **UNSET_FIELDS}
        return {k: v for k, v in asdict(self).items() if k not in legacy or v != legacy[k]}

    @classmethod
    def from_saved(cls, request: dict[str, Any]) -> EvalRequest:
        """The request a saved result records; one saved before a field existed gets its legacy value."""
        known = {f.name for f in fields(cls)}
        return cls(**{**LEGACY_FIELDS, **{k: v for k, v in request.items() if k in known}})


def result_key(req: EvalRequest, step: int, weights_sha256: str) -> str:
    """The request, the checkpoint step it resolved to and the digest of the weights it scored."""
    text = json.dumps({"request": req.key_fields(), "step": step, "weights": weights_sha256}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_request(req: EvalRequest) -> EvalRequest:
    """``req`` with the stream protocol's boundary made explicit (None -> "cross"), so that a result always
    names it and the two spellings of one evaluation share a key."""
    if req.protocol == "stream" and req.boundary is None:
        return replace(req, boundary="cross")
    return req


def check_request(req: EvalRequest) -> None:
    """Every field of an evaluation request checked before a model is loaded."""
    if (not req.lengths and not req.tokens) or not all(is_multiple(k) for k in req.lengths):
        raise UserError(
            "evaluation lengths must be positive multiples of the training length, e.g. 1,2,4,8,16 (or 0.5 "
            "where 0.5 x L_t is a whole number of tokens), or windows in tokens with --tokens."
        )
    if req.tokens is not None and (not req.tokens or not all(is_token_count(n) for n in req.tokens)):
        raise UserError(
            f"--tokens must be whole numbers of at least {MIN_WINDOW} tokens separated by commas (e.g. "
            f"15360), got {req.tokens!r}."
        )
    integral = req.tokens is None and all(isinstance(k, int) for k in req.lengths)
    # fractional and token lengths are checked in tokens once L_t is known (``resolve_lengths``)
    if integral and req.protocol == "documents" and any(max(req.lengths) % k for k in req.lengths):
        raise UserError(
            f"every length must divide the longest ({max(req.lengths)}) so that each span splits into whole "
            f"windows, got {','.join(map(str, req.lengths))}; use e.g. 1,2,4,8,16, or --protocol stream."
        )
    if req.stride is not None and req.stride < 1:
        raise UserError(f"--stride must be a positive number of tokens, got {req.stride}.")
    if req.max_tokens < 1 or req.buckets < 1:
        raise UserError("--max-tokens and the per-position buckets must be positive.")
    if req.precision not in ("fp32", "bf16"):
        raise UserError(f"--precision must be fp32 or bf16, got {req.precision!r}.")
    if req.split not in ("train", "val", "test"):
        raise UserError(f"--split must be train, val or test, got {req.split!r}.")
    if req.base_length is not None and req.base_length < 1:
        raise UserError(f"the base length must be positive, got {req.base_length}.")
    if req.protocol not in PROTOCOLS:
        raise UserError(f"--protocol must be documents or stream, got {req.protocol!r}.")
    if req.protocol == "documents" and req.boundary is not None:
        raise UserError(
            "--boundary applies to the stream protocol only (a documents window never leaves its document); "
            "drop it or add --protocol stream."
        )
    if req.boundary not in (None, *BOUNDARIES):
        raise UserError(f"--boundary must be cross or mask, got {req.boundary!r}.")
    if req.selection not in SELECTIONS:
        raise UserError(f"--selection must be spread or first, got {req.selection!r}.")
    if req.protocol == "stream" and req.selection != "spread":
        raise UserError(
            "the stream protocol always spreads its target blocks over the stream; --selection first "
            "applies to the documents protocol only."
        )
    if req.protocol == "stream" and req.stride is not None:
        raise UserError(
            "--stride is the documents protocol's sliding window; the stream protocol already scores each "
            "block with all the preceding stream its window holds, so drop --stride."
        )


def default_name(req: EvalRequest) -> str:
    parts = [
        req.split
        if req.corpus is None and req.data_dir is None
        else _slug(req.corpus or Path(req.data_dir).name)
    ]
    if req.protocol == "stream":
        parts += ["stream", req.boundary or "cross"]
    elif req.selection != "spread":
        parts.append(req.selection)
    for k, v in sorted(req.position_options.items()):
        parts.append(f"{k}{v}")
    if req.stride:
        parts.append(f"stride{req.stride}")
    if req.precision != "fp32":
        parts.append(req.precision)
    if req.step is not None:
        parts.append(f"step{req.step}")
    if req.base_length is not None:  # another L_t: other windows and another "past L_t"
        parts.append(f"base{req.base_length}")
    return "-".join(_slug(str(p)) for p in parts)


def _slug(text: str) -> str:
    return slug(text, keep=".+_", empty="eval")  # no "-" inside a piece: the pieces are joined with it


# ---- data --------------------------------------------------------------------------------------------


def _eval_split(run, req: EvalRequest, progress: bool):
    """The token split to score: the run's held-out split, or another corpus tokenized with the run's
    tokenizer; data tokenized with another tokenizer is refused (its ids would be scored as other tokens)."""
    from extrapos.data import open_split, prepare_data
    from extrapos.run.runtime import check_data_tokenizer, prepare_run_data

    if req.data_dir:
        check_data_tokenizer(req.data_dir, run.tokenizer.hash, run.path, "pass DIR as --data")
        return open_split(req.data_dir, req.split), req.data_dir
    if req.corpus:
        # every document of a foreign corpus is held out for this model: put them all in `test`
        tok_spec = str(_tokenizer_file(run.path))
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


def _tokenizer_file(run_dir: Path) -> Path:
    from extrapos.run.runtime import run_tokenizer_file

    return run_tokenizer_file(run_dir) or run_dir


def collect_spans(
    split, span_len: int, max_tokens: int, with_documents: bool = False, selection: str = "spread"
):
    """Non-overlapping spans of ``span_len + 1`` tokens from documents long enough, up to a target budget
    of ``max(1, max_tokens // span_len)`` spans.

    ``selection`` "spread" reaches as many documents as the budget allows (``spread_counts``): each
    document's first span before any document's second, and evenly spaced documents when the budget holds
    fewer spans than there are documents. "first" fills the budget from the first documents, as every
    evaluation did before (a few long documents gave all the spans, so the intervals were wide).
    Returns (spans (n, span_len + 1) int64 in document order, documents used, documents skipped as too
    short), and with ``with_documents`` a fourth item: the split index of each span's document, (n,) int64.
    """
    lengths = np.asarray(split.doc_lengths)
    long_enough = np.flatnonzero(lengths >= span_len + 1)
    skipped = int(len(lengths) - len(long_enough))
    if len(long_enough) == 0:
        longest = int(lengths.max()) if len(lengths) else 0
        raise UserError(
            f"no held-out document has the {span_len + 1} tokens the longest length needs (the longest has "
            f"{longest}); use lengths whose longest window is at most {max(longest - 1, 0)} tokens, "
            "--protocol stream (documents joined), or another corpus."
        )
    budget = max(1, max_tokens // span_len)
    counts = (lengths[long_enough] - 1) // span_len  # spans each document holds
    if selection == "first":
        before = np.cumsum(counts) - counts
        take = np.clip(budget - before, 0, counts)
    else:
        take = spread_counts(counts, budget)
    spans, owners = [], []
    for d, n in zip(long_enough[take > 0].tolist(), take[take > 0].tolist()):
        doc = np.asarray(split.doc(d))
        for s in range(n):
            spans.append(doc[s * span_len : s * span_len + span_len + 1].astype(np.int64))
            owners.append(d)
    out = (np.stack(spans), int((take > 0).sum()), skipped)
    return (*out, np.asarray(owners, dtype=np.int64)) if with_documents else out


def spread_counts(counts: np.ndarray, budget: int) -> np.ndarray:
    """How many of its ``counts[d]`` items to take from each document for ``budget`` items in all, reaching
    as many documents as possible: round r takes the r-th item of every document that has one while the
    budget lasts; the round the budget runs out in takes evenly spaced documents (the i-th of m drawn from n
    is ``i * n // m``), so a small budget samples the whole split, not its first documents."""
    counts = np.asarray(counts, dtype=np.int64)
    take = np.zeros_like(counts)
    left, r = int(budget), 0
    while left > 0:
        have = np.flatnonzero(counts > r)
        if len(have) == 0:
            break
        if len(have) > left:
            have = have[(np.arange(left) * len(have)) // left]
        take[have] += 1
        left -= len(have)
        r += 1
    return take


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


def load_scored_run(handle: Run, req: EvalRequest, ckpt, device, progress: bool) -> ScoredRun:
    """Load the run at ``ckpt``, set the request's fixed position options and open the held-out split."""
    from extrapos.run.directory import load_run

    run = load_run(handle, device=device, checkpoint=ckpt)
    L = req.base_length or run.cfg.model.train_length
    resolved = request_lengths(req, L)
    lengths, windows = [x.ev for x in resolved], [x.window for x in resolved]
    max_len = max(windows)
    per_window = {k for k, v in req.position_options.items() if v == "window"}
    fixed = {
        k: v for k, v in _resolve_options(req.position_options, max_len, L).items() if k not in per_window
    }
    if fixed:
        run.model.pos.set_options(**fixed)
    split, data_dir = _eval_split(run, req, progress)
    return ScoredRun(run, lengths, L, max_len, per_window, split, data_dir, windows)


def check_lengths(run: Run, req: EvalRequest) -> list[EvalLength]:
    """The request's lengths checked against the run's L_t (``request_lengths``) before anything is read or
    written."""
    return request_lengths(req, req.base_length or run.cfg.model.train_length)


def request_lengths(req: EvalRequest, L: int) -> list[EvalLength]:
    """The request's lengths at training length ``L`` in windows of tokens, checked (whole windows of at
    least MIN_WINDOW tokens; under the documents protocol each dividing the longest)."""
    resolved = resolve_lengths(req.lengths, req.tokens, L)
    if req.protocol == "documents":
        check_windows_divide([x.window for x in resolved])
    elif resolved[0].window < L:  # the stream scores blocks of L_t targets, each inside every window
        raise UserError(
            f"the stream protocol scores blocks of L_t = {L} targets, so its windows must be at least {L} "
            f"tokens, and {resolved[0].ev:g} x L_t is {resolved[0].window}; drop it or use the documents "
            "protocol."
        )
    return resolved


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


def load_eval_inputs(handle: Run, req: EvalRequest, ckpt, device, progress: bool) -> EvalInputs:
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


def result_slot(
    run: Run, req: EvalRequest, name: str, overwrite: bool, progress: bool, suffix: str = ""
) -> ResultSlot:
    """The slot (``evaluate.slot``) of ``RUN/eval/<name>.json`` for ``req``, keyed by the request and the
    checkpoint it scores (``suffix`` tells apart evaluations of the same request, e.g. the masked-LM one and
    its mask seed). The same request of an older checkpoint is evaluated again, and so is the same request
    as an older extrapos scored it, with spans from the first documents instead of spread over them."""
    ckpt, digest = run.checkpoint(req.step)
    key, request_key = result_key(req, ckpt.step, digest) + suffix, req.key() + suffix
    out_path = results_dir(run.path) / f"{name}.json"
    older: list[tuple[dict[str, Any], str | None]] = []
    if req.protocol == "documents" and req.selection != "first":
        first = replace(req, selection="first").key() + suffix
        note = (
            f"extrapos eval: {out_path} scored spans from the first held-out documents (an older "
            "extrapos); evaluating again with the targets spread over the documents."
        )
        older.append(({"request_key": first}, note if progress else None))

    def stale(previous: dict[str, Any]) -> str:
        return (
            f"extrapos eval: {out_path} scored checkpoint step {previous.get('checkpoint_step')}; the run is "
            f"now at step {ckpt.step}, evaluating again."
        )

    return open_slot(
        run.path,
        name,
        ckpt,
        digest,
        request={"request_key": request_key},
        result={"result_key": key},
        overwrite=overwrite,
        refusal="holds a different evaluation; pass --name to keep both or --overwrite to replace it.",
        older=older,
        stale=stale if progress else None,
        key=key,
        request_key=request_key,
    )


def targets_digest(targets: np.ndarray, owners: np.ndarray) -> str:
    """A digest of the scored target tokens and the documents they belong to, recorded in every row: reports
    pair two cells only when they scored the same targets (e.g. never two lengths of a sweep that evaluates
    each length alone, whose spans differ)."""
    h = hashlib.sha256(np.ascontiguousarray(targets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(owners, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def per_document(losses: torch.Tensor, owners: np.ndarray) -> dict[str, list]:
    """Per-document loss sums (float64) and scored token counts of (n_spans, span_len) losses, in document
    order; ``owners`` gives each span's document (n_spans,) or each target's (n_spans, span_len), as a
    stream block's targets may belong to several documents."""
    owners = np.asarray(owners)
    if owners.ndim == 1:
        owners = np.repeat(owners[:, None], losses.shape[1], axis=1)
    docs, which = np.unique(owners.ravel(), return_inverse=True)
    sums = losses.double().reshape(-1).numpy()
    return {
        "doc_index": docs.tolist(),
        "doc_loss_sums": np.bincount(which, weights=sums, minlength=len(docs)).tolist(),
        "doc_tokens": np.bincount(which, minlength=len(docs)).tolist(),
    }


# ---- scoring -----------------------------------------------------------------------------------------


@torch.no_grad()
def token_losses(
    model,
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
    model,
    spans: torch.Tensor,
    window: int,
    batch_tokens: int,
    precision: str,
    stride: int | None = None,
    bar=None,
) -> torch.Tensor:
    """Loss of every target of every span, scored in windows of ``window`` tokens: (n_spans, span_len).

    Plain mode: non-overlapping windows, each starting at position 0. Sliding mode (``stride``):
    windows advance by ``stride`` and each scores only its last ``stride`` targets (the first window
    scores all of its own), so every target is scored once with up to ``window - 1`` tokens of context.
    Under torchrun the batches are dealt out to the ranks and the losses all-reduced: each target is
    scored by one rank in the batch a single process would put it in, so the result is the same.
    """
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rank = dist.get_rank() if world > 1 else 0
    n, span_plus = spans.shape
    span_len = span_plus - 1
    out = torch.empty(n, span_len) if world == 1 else torch.zeros(n, span_len)  # others' targets: summed in
    device = next(model.parameters()).device
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
    for b in range(rank * per_batch, len(jobs), world * per_batch):
        chunk = jobs[b : b + per_batch]
        toks = torch.stack([spans[i, w0 : w0 + window] for i, (w0, _, _) in chunk]).to(device)
        tgts = torch.stack([spans[i, w0 + 1 : w0 + window + 1] for i, (w0, _, _) in chunk]).to(device)
        losses = token_losses(model, toks, positions.expand(len(chunk), -1), tgts, precision).cpu()
        for row, (i, (w0, s0, s1)) in enumerate(chunk):
            out[i, s0:s1] = losses[row, s0 - w0 : s1 - w0]
        if bar is not None:
            bar.update(sum(s1 - s0 for _, (_, s0, s1) in chunk) * world)
    if world > 1:
        # every target was written by exactly one rank and is 0 on the others: the sum is exact
        summed = out.to(device)  # NCCL reduces device tensors, gloo CPU ones
        dist.all_reduce(summed)
        out = summed.cpu()
    return out


def evaluate(
    run_dir: Run | str | Path,
    req: EvalRequest | None = None,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """Evaluate a run (a directory, or a ``Run`` already open) at every length of ``req``; writes and
    returns ``RUN/eval/<name>.json``. Scoring estimated past a day is refused unless ``force``
    (``check_eval_time``)."""
    req = resolve_request(req or EvalRequest())
    check_request(req)
    handle = Run.of(run_dir)
    check_lengths(handle, req)
    name = check_result_name(name or default_name(req))
    slot = result_slot(handle, req, name, overwrite, progress)
    if slot.previous is not None:
        return slot.previous  # the same evaluation of the same weights was done: reuse it

    check_eval_memory(handle, req, device, batch_tokens)
    check_eval_time(handle, req, device, force)
    t0 = time.perf_counter()
    if req.protocol == "stream":
        from extrapos.evaluate.stream import score_stream

        scored = score_stream(handle, req, slot.ckpt, device, batch_tokens, progress)
    else:
        scored = _score_documents(handle, req, slot.ckpt, device, batch_tokens, progress)
    run = scored.run
    result = {
        "name": name,
        "run": str(handle.path),
        "request": req.written(),
        "request_key": slot.request_key,
        "result_key": slot.key,
        "weights_sha256": slot.digest,
        "encoding": run.cfg.model.positions_plan().name,
        "encoding_options": _jsonable(asdict(run.model.pos.options)),
        "applied": _jsonable(req.position_options),
        "train_length": scored.L,
        "checkpoint_step": run.step,
        "tokenizer_hash": run.tokenizer.hash,  # reports never put two tokenizers' losses in one table
        "data_dir": scored.data_dir,
        "split": req.split if not req.corpus else "test",
        "protocol": req.protocol,
        "boundary": req.boundary,
        "selection": req.selection,
        "precision": req.precision,  # the forward's (bf16: autocast); the losses are fp32 either way
        **scored.facts,
        "results": scored.rows,
        "per_position": scored.per_position,
        "wall_time": time.perf_counter() - t0,
    }
    slot.write(result, req.position_options, "evaluation")  # rank 0 writes; every process waits for it
    return result


def check_eval_memory(run: Run, req: EvalRequest, device: str, batch_tokens: int) -> None:
    """Refuse, before the model is loaded, lengths whose windows cannot fit in memory: one batch of the
    longest window (``memory.forward_bytes``) and its chunk of logits with their cross-entropy
    (``token_losses`` forms them 1,024 positions at a time)."""
    from extrapos.run.memory import check_memory, forward_bytes

    model = run.cfg.model
    L = req.base_length or model.train_length
    longest = request_lengths(req, L)[-1]  # fractional and token lengths refused here, before any loading
    window = longest.window
    rows = max(1, batch_tokens // window)
    need = forward_bytes(model, window, rows) + 2 * rows * min(window, 1024) * model.vocab_size * 4
    check_memory(
        need,
        device,
        f"evaluation windows of {longest.ev} x {L} = {window} tokens",
        "ask for shorter --lengths",
    )


def check_eval_time(run: Run, req: EvalRequest, device: str, force: bool) -> None:
    """Print the least time the scoring takes when past a minute and refuse it past a day unless ``force``
    (``run.timing``): each length runs about ``max_tokens`` targets through windows of its length (with a
    ``stride``, ``window / stride`` tokens computed per target), each token seeing half its window."""
    from extrapos.run.timing import check_time, forward_flops

    model = run.cfg.model
    L = req.base_length or model.train_length
    lengths = request_lengths(req, L)
    flops = sum(
        forward_flops(model, req.max_tokens * x.window // min(req.stride or x.window, x.window), x.window / 2)
        for x in lengths
    )
    what = f"scoring {len(lengths)} length(s) up to {lengths[-1].window:,} tokens"
    check_time(flops, device, what, "ask for shorter --lengths or fewer --max-tokens", force)


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


def _score_documents(
    handle: Run, req: EvalRequest, ckpt, device, batch_tokens: int, progress: bool
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
        losses = score_windows(run.model, spans, window, batch_tokens, req.precision, req.stride, bar)
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
            per_position = _bucketed(losses.mean(0), req.buckets)
    bar.close()
    facts = {
        "documents_used": inputs.docs_used,
        "documents_skipped": inputs.docs_skipped,
        "spans": int(spans.shape[0]),
        "target_tokens": int(n_targets),
        "target_bytes": int(n_bytes),
    }
    return Scored(run, L, inputs.data_dir, rows, per_position, facts)


def _resolve_options(options: dict[str, Any], max_len: int, L: int) -> dict[str, Any]:
    # "max": stretch to the longest evaluated window (in tokens); "ev": the longest window over L_t (a RoPE
    # scaling's factor, so each column of an eval_each_length sweep scales by its own k); "window" (the
    # CLI's --interpolate): to each window, set per window by the caller
    named = {"max": max_len, "ev": max_len / L}
    return {k: (named[v] if isinstance(v, str) and v in named else v) for k, v in options.items()}


def _bucketed(curve: torch.Tensor, buckets: int, window: int | None = None) -> dict[str, Any]:
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


def _jsonable(d: Any) -> Any:
    return json.loads(json.dumps(d, default=str))


def format_result(result: dict[str, Any]) -> str:
    from extrapos.report.stats import length_difference, length_interval, protocol_name

    if result.get("protocol") == "stream":
        scored = (
            f"scored {result['target_tokens']:,} target tokens per length ({result['blocks']} blocks of "
            f"{result['block']}, each ending its window at every length) owned by "
            f"{result['documents_used']} of the {result['documents_in_split']} documents joined in a stream "
            f"of {result['stream_tokens']:,} tokens"
        )
    else:
        scored = (
            f"scored {result['target_tokens']:,} target tokens per length from {result['documents_used']} "
            f"documents ({result['documents_skipped']} too short, skipped)"
        )
    ref = min((r["ev"] for r in result["results"]), default=1)  # the shortest length: 1x unless not scored
    lines = [
        f"{result['run']}  encoding={result['encoding']}  L_t={result['train_length']}  "
        f"applied={result['applied'] or 'nothing'}",
        f"protocol: {protocol_name(result)}",
        scored,
        "| ev | window | loss | ppl | bits/byte | tail loss | loss 95% interval | "
        f"loss - ev={ref} (paired 95%) |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['ev']} | {r['window']} | {r['loss']:.4f} | {r['ppl']:.2f} | {r['bpb']:.4f} | "
            f"{r['tail_loss']:.4f} | {length_interval(result, r['ev'])[1]} | "
            f"{length_difference(result, r['ev'], ref)[1]} |"
        )
    return "\n".join([*lines, INTERVAL_NOTE, PAIRED_NOTE])


# printed under every console table of `extrapos eval` (and its masked-LM form)
INTERVAL_NOTE = (
    "loss 95% interval: percentile bootstrap over the held-out documents, as compare reports compute it "
    "(docs/evaluation.md)."
)
PAIRED_NOTE = (
    "last column: each length's loss minus the shortest length's, the same target tokens at both, one "
    "bootstrap resample of the documents applied to both, so the spread the lengths share cancels; it is "
    'the interval to read for "does the loss change with length" ("within noise" when it contains 0). '
    "Both intervals cover the choice of held-out documents of this one trained model, not training noise "
    "(seeds, another machine)."
)
