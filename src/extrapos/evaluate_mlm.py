"""Masked-LM loss at 1..16 x L_t: the length-extrapolation protocol of ``evaluate.py`` for encoders.

The spans are ``evaluate.collect_spans``' (held-out documents cut into spans of max(k) x L_t tokens).
The BERT mask (data/mlm.py: 15% selected, 80/10/10) is drawn once per span, keyed by (seed, span
index), before any window is cut, so every length scores exactly the same masked tokens with the
same corrupted inputs; only the context around them differs. Each span is then split into
non-overlapping windows of k x L_t tokens at positions 0..kL_t - 1, as the decoders' windows are.
Reported per length: the mean cross-entropy over the masked tokens, its perplexity, the accuracy of
the top prediction and the number of masked tokens.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from extrapos.data.mlm import encoder_special_tokens, mask_tokens, rng_for
from extrapos.errors import UserError
from extrapos.evaluate import (
    EvalRequest,
    _eval_split,
    check_request,
    check_result_name,
    collect_spans,
    default_name,
    result_key,
    results_dir,
)
from extrapos.files import atomic_write, ensure_writable_dir


def mask_spans(spans: np.ndarray, specials, vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(corrupted, selected) for every span (n, L): span s masked with the draw keyed by (seed, s)."""
    corrupted, selected = np.empty_like(spans), np.empty(spans.shape, dtype=bool)
    for s in range(len(spans)):
        corrupted[s], selected[s] = mask_tokens(spans[s], rng_for((seed, s)), specials, vocab_size)
    return corrupted, selected


@torch.no_grad()
def score_masked(
    model,
    corrupted: torch.Tensor,
    text: torch.Tensor,
    window: int,
    batch_tokens: int,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and top-1 correctness (n, L) of every span scored in windows of ``window`` tokens."""
    from extrapos.runtime import autocast

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
    run_dir: str | Path,
    req: EvalRequest | None = None,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """MLM loss of an encoder run at every length of ``req``; writes and returns ``RUN/eval/<name>.json``.

    ``req.stride`` and ``req.position_options`` "window"/"max" values are not supported here.
    """
    from extrapos import checkpoint as ckpt_io
    from extrapos.runs import load_run

    req = req or EvalRequest()
    check_request(req)
    if req.stride is not None:
        raise UserError("the MLM evaluation scores non-overlapping windows only; drop --stride.")
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise UserError(
            f"{run_dir} is not a run directory (no config.toml); pass the --out of `extrapos train`."
        )
    name = check_result_name(name or f"mlm-{default_name(req)}")
    ckpt = ckpt_io.checkpoint_at(run_dir, req.step)
    digest = ckpt_io.weights_digest(ckpt)
    key = result_key(req, ckpt.step, digest) + f"-mlm{seed}"
    out_path = results_dir(run_dir) / f"{name}.json"
    if out_path.is_file() and not overwrite:
        previous = json.loads(out_path.read_text())
        if previous.get("result_key") == key:
            return previous
        raise UserError(f"{out_path} holds another evaluation; pass another name or overwrite it.")
    ensure_writable_dir(out_path.parent, "evaluation results")

    t0 = time.perf_counter()
    run = load_run(run_dir, device=device, checkpoint=ckpt)
    if run.cfg.train.objective != "mlm":
        raise UserError(
            f"{run_dir} is a decoder run (objective {run.cfg.train.objective}); use `extrapos eval`."
        )
    if req.position_options:
        run.model.pos.set_options(**req.position_options)
    lengths = sorted(set(req.lengths))
    L = req.base_length or run.cfg.model.train_length
    max_len = max(lengths) * L
    split, data_dir = _eval_split(run, req, progress)
    spans_np, docs_used, docs_skipped = collect_spans(split, max_len, req.max_tokens)
    text_np = spans_np[:, :max_len]  # collect_spans keeps one extra token for next-token targets
    specials = encoder_special_tokens(run.tokenizer)
    corrupted_np, selected_np = mask_spans(text_np, specials, run.tokenizer.vocab_size, seed)
    corrupted, text = torch.from_numpy(corrupted_np), torch.from_numpy(text_np)
    selected = torch.from_numpy(selected_np)

    rows = []
    for k in lengths:
        losses, correct = score_masked(run.model, corrupted, text, k * L, batch_tokens, req.precision)
        mean = float(losses[selected].double().mean())
        rows.append(
            {
                "ev": k,
                "window": k * L,
                "windows": len(text) * (max_len // (k * L)),
                "masked_tokens": int(selected.sum()),
                "loss": mean,
                "ppl": math.exp(mean),
                "accuracy": float(correct[selected].double().mean()),
            }
        )
        if progress:
            print(f"extrapos eval (mlm): ev {k}: loss {mean:.4f}", flush=True)
    result = {
        "name": name,
        "run": str(run_dir),
        "objective": "mlm",
        "request": asdict(req),
        "request_key": req.key(),
        "result_key": key,
        "weights_sha256": digest,
        "mask_seed": seed,
        "encoding": run.cfg.model.positions["name"],
        "applied": req.position_options,
        "train_length": L,
        "checkpoint_step": run.step,
        "data_dir": data_dir,
        "documents_used": docs_used,
        "documents_skipped": docs_skipped,
        "spans": len(text),
        "target_tokens": int(selected.sum()),
        "results": rows,
        "wall_time": time.perf_counter() - t0,
    }
    atomic_write(out_path, json.dumps(result, indent=1, default=str))
    return result


def format_mlm_result(result: dict[str, Any]) -> str:
    lines = [
        f"{result['run']}  encoding={result['encoding']}  L_t={result['train_length']}  (masked LM)",
        f"{result['target_tokens']:,} masked tokens per length from {result['documents_used']} documents",
        "| ev | window | MLM loss | ppl | accuracy |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['ev']} | {r['window']} | {r['loss']:.4f} | {r['ppl']:.2f} | {r['accuracy']:.3f} |"
        )
    return "\n".join(lines)
