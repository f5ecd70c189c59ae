"""Masked-LM loss at 1..16 x L_t: the length-extrapolation protocol of ``extrapos.evaluate`` for encoders.

The spans are ``evaluate.collect_spans``' (held-out documents cut into spans of max(k) x L_t tokens).
The BERT mask (data/mlm.py: 15% selected, 80/10/10) is drawn once per span, keyed by (seed, span
index), before any window is cut, so every length scores exactly the same masked tokens with the
same corrupted inputs; only the context around them differs. Each span is then split into
non-overlapping windows of k x L_t tokens at positions 0..kL_t - 1, as the decoders' windows are.
Reported per length: the mean cross-entropy over the masked tokens, its perplexity, the accuracy of
the top prediction, the number of masked tokens, the loss of the masked tokens among each window's last
L_t positions (``tail_loss``), and, for the bootstrap intervals of ``extrapos.report.stats``, each document's
masked-token loss sum and count (``doc_index``, ``doc_loss_sums``, ``doc_tokens``, as ``evaluate``
records them). The mask is per span, so per document: every length scores the same masked tokens of
the same documents, and rows of a sweep pair. Beside them, ``unigram_loss``: what a model that ignores
context scores on the same masked tokens, the line a row must get below before its curve over length
says anything about positions.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from extrapos.data.mlm import encoder_special_tokens, mask_tokens, rng_for
from extrapos.errors import UserError
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import Evaluator, Prepared, Scoring, Unsupported
from extrapos.evaluate.format import INTERVAL_NOTE
from extrapos.evaluate.inputs import load_eval_inputs
from extrapos.evaluate.next_token import result_slot
from extrapos.evaluate.request import EvalRequest, check_lengths, check_request, default_name
from extrapos.evaluate.slot import ResultSlot, check_result_name, jsonable
from extrapos.evaluate.window_options import per_window_options
from extrapos.report.stats import length_interval
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard, distributed_env

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from extrapos.model import Decoder
    from extrapos.run.handle import LoadedRun


def mask_spans(
    spans: np.ndarray, specials: Any, vocab_size: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(corrupted, selected) for every span (n, L): span s masked with the draw keyed by (seed, s)."""
    corrupted, selected = np.empty_like(spans), np.empty(spans.shape, dtype=bool)
    for s in range(len(spans)):
        corrupted[s], selected[s] = mask_tokens(spans[s], rng_for((seed, s)), specials, vocab_size)
    return corrupted, selected


def unigram_loss(run: LoadedRun, targets: np.ndarray, specials: Any) -> float | None:
    """Cross-entropy of ``targets`` under the token frequencies of the run's training split (special tokens
    excluded, add-one smoothed over the vocabulary): the loss of a model that ignores context. None when
    the run's prepared data is no longer there."""
    from extrapos.data import open_split

    if run.data_dir is None:
        return None
    train = np.asarray(open_split(run.data_dir, "train").tokens)
    vocab = max(run.tokenizer.vocab_size, int(targets.max(initial=0)) + 1, int(train.max(initial=0)) + 1)
    counts = np.bincount(train, minlength=vocab).astype(np.float64)
    counts[list(specials.ids)] = 0.0  # never a masked target
    counts += 1.0
    return float(np.log(counts.sum()) - np.log(counts[targets]).mean())


@torch.no_grad()
def score_masked(
    model: Decoder,
    corrupted: torch.Tensor,
    text: torch.Tensor,
    window: int,
    batch_tokens: int,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and top-1 correctness (n, L) of every span scored in windows of ``window`` tokens."""
    from extrapos.run.runtime import autocast

    n, length = corrupted.shape
    device = next(model.parameters()).device
    losses, correct = torch.empty(n, length), torch.empty(n, length, dtype=torch.bool)
    jobs = [(i, w) for i in range(n) for w in range(0, length, window)]
    per_batch = max(1, batch_tokens // window)
    positions = torch.arange(window, device=device).unsqueeze(0)
    for b in range(0, len(jobs), per_batch):
        chunk = jobs[b : b + per_batch]
        toks = torch.stack([corrupted[i, w : w + window] for i, w in chunk]).to(device)
        tgts = torch.stack([text[i, w : w + window] for i, w in chunk]).to(device)
        with autocast(device, precision):
            logits = model(toks, positions.expand(len(chunk), -1)).float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgts.flatten(), reduction="none")
        hit = (logits.argmax(-1) == tgts).cpu()
        loss = loss.view(len(chunk), window).cpu()
        for row, (i, w) in enumerate(chunk):
            losses[i, w : w + window], correct[i, w : w + window] = loss[row], hit[row]
    return losses, correct


def evaluate_mlm(
    run_dir: Run | str | Path,
    req: EvalRequest | None = None,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """MLM loss of an encoder run at every length of ``req``; writes and returns ``RUN/eval/<name>.json``.

    Position options as in ``evaluate``: "window" (e.g. a learned table interpolated to each window) and
    "max" (to the longest window) are resolved per length. ``req.stride`` does not apply (a UserError).
    The evaluation is ``MaskedLMEvaluator`` through the driver, in this one process.
    """
    how = Scoring(name, overwrite, device, progress, batch_tokens=batch_tokens)
    return drive(MaskedLMEvaluator(), run_dir, MaskedLMRequest(req or EvalRequest(), seed), Shard(), how)


def score_mlm(
    handle: Run, req: EvalRequest, slot: ResultSlot, name: str, seed: int, how: Scoring
) -> dict[str, Any]:
    """The masked-LM rows of a run at every length (``MaskedLMEvaluator.score``): the result to write."""
    t0 = time.perf_counter()
    inputs = load_eval_inputs(handle, req, slot.ckpt, how.device, how.progress)
    run, L, max_len = inputs.run, inputs.L, inputs.max_len
    lengths, per_window = inputs.lengths, inputs.per_window
    spans_np, owners = inputs.spans, inputs.owners
    text_np = spans_np[:, :max_len]  # collect_spans keeps one extra token for next-token targets
    specials = encoder_special_tokens(run.tokenizer)
    corrupted_np, selected_np = mask_spans(text_np, specials, run.tokenizer.vocab_size, seed)
    corrupted, text = torch.from_numpy(corrupted_np), torch.from_numpy(text_np)
    selected = torch.from_numpy(selected_np)

    rows, per_position = [], None
    for k, window in zip(lengths, inputs.windows):
        if per_window:  # as evaluate: e.g. a learned table interpolated to each window (none at L_t)
            run.model.pos.set_options(**per_window_options(run.model.pos, per_window, window, L))
        losses, correct = score_masked(run.model, corrupted, text, window, how.batch_tokens, req.precision)
        mean = float(losses[selected].double().mean())
        tail = selected.view(len(text), -1, window)[:, :, -L:]
        rows.append(
            {
                "ev": k,
                "window": window,
                "windows": len(text) * (max_len // window),
                "tokens": int(selected.sum()),
                "masked_tokens": int(selected.sum()),
                "loss": mean,
                "ppl": math.exp(mean),
                "accuracy": float(correct[selected].double().mean()),
                # the masked tokens among each window's last L_t positions: does more context help?
                "tail_loss": float(losses.view(len(text), -1, window)[:, :, -L:][tail].double().mean()),
                **per_document_masked(losses, selected, owners),
            }
        )
        if window == max_len:
            per_position = _bucketed_masked(losses, selected, window, req.buckets)
        if how.progress:
            logger.info(f"extrapos eval (mlm): ev {k}: loss {mean:.4f}")
    return {
        "name": name,
        "run": str(handle.path),
        "objective": "mlm",
        "request": req.written(),
        "request_key": slot.request_key,
        "result_key": slot.key,
        "weights_sha256": slot.digest,
        "mask_seed": seed,
        "encoding": run.cfg.model.positions_plan().name,
        "encoding_options": jsonable(asdict(run.model.pos.options)),
        "applied": jsonable(req.position_options),
        "train_length": L,
        "checkpoint_step": run.step,
        "data_dir": inputs.data_dir,
        "split": req.split if not req.corpus else "test",
        "precision": req.precision,  # the forward's (bf16: autocast); the losses are fp32 either way
        "documents_used": inputs.docs_used,
        "documents_skipped": inputs.docs_skipped,
        "spans": len(text),
        "target_tokens": int(selected.sum()),
        "unigram_loss": unigram_loss(run, text_np[selected_np], specials),
        "results": rows,
        "per_position": per_position,
        "wall_time": time.perf_counter() - t0,
    }


def per_document_masked(losses: torch.Tensor, selected: torch.Tensor, owners: np.ndarray) -> dict[str, list]:
    """Per document (in document order): the sum of its masked tokens' losses and their number, for the
    bootstrap of ``extrapos.report.stats``. The mask is the same at every length, so the counts are too and
    rows pair. A document whose spans drew no masked token (possible only for very short spans) is left
    out."""
    sums = torch.where(selected, losses.double(), 0.0).sum(1).numpy()
    counts = selected.sum(1).numpy()
    docs, which = np.unique(owners, return_inverse=True)
    doc_sums = np.bincount(which, weights=sums, minlength=len(docs))
    doc_counts = np.bincount(which, weights=counts, minlength=len(docs)).astype(np.int64)
    keep = doc_counts > 0
    return {
        "doc_index": docs[keep].tolist(),
        "doc_loss_sums": doc_sums[keep].tolist(),
        "doc_tokens": doc_counts[keep].tolist(),
    }


def _bucketed_masked(
    losses: torch.Tensor, selected: torch.Tensor, window: int, buckets: int
) -> dict[str, Any]:
    """Mean loss of the masked tokens by position in the windows of ``window`` tokens, in buckets."""
    by_pos = losses.reshape(-1, window).double()
    sel = selected.reshape(-1, window)
    sums, counts = torch.where(sel, by_pos, 0.0).sum(0), sel.sum(0).double()
    buckets = max(1, min(buckets, window))
    edges = np.linspace(0, window, buckets + 1).astype(int)
    return {
        "window": window,
        "starts": edges[:-1].tolist(),
        "ends": edges[1:].tolist(),
        "loss": [
            float(sums[a:b].sum() / counts[a:b].sum()) if counts[a:b].sum() > 0 else None
            for a, b in zip(edges[:-1], edges[1:])
        ],
    }


def format_mlm_result(result: dict[str, Any]) -> str:
    lines = [
        f"{result['run']}  encoding={result['encoding']}  L_t={result['train_length']}  "
        f"applied={result.get('applied') or 'nothing'}  (masked LM, mask seed {result.get('mask_seed', 0)})",
        f"{result['target_tokens']:,} masked tokens per length from {result['documents_used']} documents "
        f"({result['documents_skipped']} too short, skipped)"
        + (
            f"; a context-free (unigram) model scores {result['unigram_loss']:.4f} on them"
            if result.get("unigram_loss") is not None
            else ""
        ),
        "| ev | window | MLM loss | ppl | accuracy | tail loss | loss 95% interval |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["results"]:
        tail = r.get("tail_loss")
        lines.append(
            f"| {r['ev']} | {r['window']} | {r['loss']:.4f} | {r['ppl']:.2f} | {r['accuracy']:.3f} | "
            + ("–" if tail is None else f"{tail:.4f}")
            + f" | {length_interval(result, r['ev'])[1]} |"
        )
    return "\n".join([*lines, INTERVAL_NOTE])


@dataclass
class MaskedLMRequest:
    """The masked-LM evaluation of an encoder: the loss request and the seed of the BERT mask drawn once per
    span (a result of another seed is another result: ``evaluate_mlm`` keys it)."""

    request: EvalRequest = field(default_factory=EvalRequest)
    mask_seed: int = 0


class MaskedLMEvaluator(Evaluator[MaskedLMRequest]):
    """`extrapos eval` of an encoder: the masked-LM loss at every length on the same masked tokens. It runs
    in one process (``loss_request`` refuses torchrun), so ``shard`` is a group of one."""

    name: ClassVar[str] = "mlm"
    request_type: ClassVar[type] = MaskedLMRequest
    refused_as: ClassVar[str] = "evaluation"
    name_prefix: ClassVar[str] = "mlm-"  # a sweep's result names, beside its decoders' (compare)

    def loss_request(self, run: Run, req: EvalRequest, mask_seed: int | None) -> MaskedLMRequest:
        """The loss request of `extrapos eval` or a sweep as an encoder is scored: what an encoder cannot
        do refused (``Unsupported``, naming the request's field), the mask seed 0 by default."""
        if req.stride is not None:
            raise Unsupported(
                "stride",
                "--stride is a sliding window for next-token loss; an encoder run is scored on "
                "non-overlapping windows only, so drop --stride.",
            )
        if req.protocol != "documents":
            raise Unsupported(
                "protocol",
                "an encoder run (objective mlm) is scored with the documents protocol only; drop --protocol "
                f"{req.protocol}.",
            )
        if distributed_env()[1] > 1:
            raise Unsupported(
                "torchrun",
                "the MLM evaluation of an encoder runs in one process; run `extrapos eval` without torchrun.",
            )
        return MaskedLMRequest(req, 0 if mask_seed is None else mask_seed)

    def format(self, result: dict[str, Any]) -> str:
        return format_mlm_result(result)

    def prepare(
        self, run: Run | str | Path, request: MaskedLMRequest, how: Scoring
    ) -> Prepared[MaskedLMRequest]:
        req, seed = request.request, request.mask_seed
        check_request(req)
        handle = Run.open(run)
        objective = handle.cfg.train.objective
        if objective != "mlm":
            raise UserError(
                f"{handle.path} is a decoder run (objective {objective}); score it with `extrapos eval`."
            )
        if req.stride is not None:
            raise UserError("the MLM evaluation scores non-overlapping windows only; drop --stride.")
        if req.protocol != "documents":  # the library refuses what `extrapos eval` and a sweep refuse
            raise UserError(
                f"the MLM evaluation scores whole documents only (protocol 'documents'), got protocol "
                f"{req.protocol!r}; drop it from the request."
            )
        check_lengths(handle, req)  # fractional and token lengths against L_t, before anything is loaded
        if not isinstance(seed, int) or seed < 0:
            raise UserError(f"the mask seed must be a non-negative integer, got {seed!r}.")
        name = f"{self.name_prefix}{default_name(req)}" + (f"-mask{seed}" if seed else "")
        return Prepared(handle, request, check_result_name(how.name or name))

    def open_slot(self, prepared: Prepared[MaskedLMRequest], how: Scoring) -> ResultSlot:
        request = prepared.request
        suffix = f"-mlm{request.mask_seed}"
        return result_slot(prepared.run, request.request, prepared.name, how.overwrite, how.progress, suffix)

    def estimate(self, prepared: Prepared[MaskedLMRequest], how: Scoring) -> float | None:
        """Nothing: the masked-LM evaluation has never estimated its memory or time (kept as it was)."""

    def options(self, request: MaskedLMRequest) -> dict[str, Any]:
        return request.request.position_options

    def score(
        self, prepared: Prepared[MaskedLMRequest], slot: ResultSlot, shard: Shard, how: Scoring
    ) -> dict[str, Any]:
        request = prepared.request
        return score_mlm(prepared.run, request.request, slot, prepared.name, request.mask_seed, how)
