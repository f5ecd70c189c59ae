"""Shared pieces of the task evaluations: batched greedy decoding, candidate scoring, result files."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from extrapos.errors import UserError
from extrapos.files import atomic_write, ensure_writable_dir, finite_json
from extrapos.memory import available_bytes, check_memory, forward_bytes  # noqa: F401 (re-exported)


@torch.no_grad()
def greedy_batch(
    model,
    prompts: torch.Tensor,
    max_new_tokens: int,
    prefill_chunk: int = 1024,
    stop: Callable[[torch.Tensor], bool] | None = None,
) -> torch.Tensor:
    """Greedy continuations (B, <= max_new_tokens) of equal-length prompts (B, T), with one shared KV cache.

    The prompts are prefilled in chunks at positions 0..T-1, then each new token costs one forward
    of B single tokens at position T + i (the same positions ``generate.generate_tokens`` uses).
    ``stop(generated)`` is asked after every step and ends the decoding early when it returns True.
    """
    B, T = prompts.shape
    device = prompts.device
    cache = model.new_cache()
    h = None
    for s in range(0, T, prefill_chunk):
        chunk = prompts[:, s : s + prefill_chunk]
        pos = torch.arange(s, s + chunk.shape[1], device=device).expand(B, -1)
        h = model.hidden_states(chunk, pos, cache)
    logits = model.logits(h[:, -1])
    out = []
    for i in range(max_new_tokens):
        nxt = logits.argmax(-1)
        out.append(nxt)
        if stop is not None and stop(torch.stack(out, dim=1)):
            break
        if i + 1 < max_new_tokens:
            pos = torch.full((B, 1), T + i, device=device, dtype=torch.long)
            logits = model(nxt.unsqueeze(1), pos, cache)[:, -1]
    return torch.stack(out, dim=1)


@torch.no_grad()
def continuation_logprobs(
    model, prompt: Sequence[int], continuations: Sequence[Sequence[int]], batch_tokens: int = 16_384
) -> torch.Tensor:
    """Sum of log p(continuation tokens | prompt) for equal-length continuations: (C,) float64.

    Only the continuation tokens are scored; the candidates are batched, each row being the whole
    prompt followed by one candidate at positions 0..T+a-2.
    """
    a = len(continuations[0])
    if a == 0 or any(len(c) != a for c in continuations):
        raise ValueError("continuations must be non-empty and of equal token length")
    device = next(model.parameters()).device
    rows = torch.tensor([list(prompt) + list(c) for c in continuations], dtype=torch.long, device=device)
    inputs, targets = rows[:, :-1], rows[:, -a:]
    per_batch = max(1, batch_tokens // inputs.shape[1])
    positions = torch.arange(inputs.shape[1], device=device).unsqueeze(0)
    out = []
    for s in range(0, rows.shape[0], per_batch):
        x = inputs[s : s + per_batch]
        h = model.hidden_states(x, positions.expand(x.shape[0], -1))[:, -a:]
        logp = F.log_softmax(model.logits(h).float(), dim=-1)
        out.append(logp.gather(-1, targets[s : s + per_batch].unsqueeze(-1)).squeeze(-1).double().sum(-1))
    return torch.cat(out).cpu()


def resolve_position_options(options: dict[str, Any] | None, max_len: int) -> dict[str, Any]:
    """Inference-time encoding options; the value "max" stands for the longest evaluated length."""
    return {k: (max_len if v == "max" else v) for k, v in (options or {}).items()}


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` as JSON atomically (a temporary file renamed into place); one holding a NaN or an
    infinity is refused in one sentence and nothing is written (``files.finite_json``)."""
    text = finite_json(result, result.get("position_options"), "result")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)


def result_path(run_dir: Path, name: str) -> Path:
    """RUN/eval/<name>.json for a checked name, in a writable RUN/eval that is not a symlink."""
    from extrapos.evaluate import check_result_name, results_dir

    path = results_dir(run_dir) / f"{check_result_name(name)}.json"
    ensure_writable_dir(path.parent, "evaluation results")
    return path


def scored_checkpoint(run_dir: Path, step: int | None) -> dict[str, Any]:
    """The checkpoint a task result scores: its step and the sha256 of its weights."""
    from extrapos import checkpoint as ckpt_io

    ckpt = ckpt_io.checkpoint_at(Path(run_dir), step)
    return {"step": ckpt.step, "weights_sha256": ckpt_io.weights_digest(ckpt)}


def check_existing(
    path: Path, request: dict[str, Any], overwrite: bool, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The stored result when the same request was scored on the same weights; None when it must be
    scored (again); UserError when a different request is stored under this name."""
    if not path.is_file() or overwrite:
        return None
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged result is scored again and replaced
    if not isinstance(previous, dict) or previous.get("request") != json.loads(
        json.dumps(request, default=str)
    ):
        raise UserError(
            f"{path} holds a different evaluation; pass another --name (name=...) to keep both or "
            "--overwrite (overwrite=True) to replace it."
        )
    if checkpoint is not None and previous.get("checkpoint") != checkpoint:
        return None  # the run was trained further: the stored numbers are stale
    return previous


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".+_-" else "_" for c in text).strip("_")[:60] or "x"


def examples_digest(*arrays) -> str:
    """A short digest of the scored examples: two rows whose cells carry the same digest scored the same
    examples, so the report may pair their per-example results."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


# ---- what a task may ask for, checked before any work --------------------------------------------------

#: keys of the int64 generator: numpy's ``integers`` draws below 2^63, so at most 18 digits
MAX_KEY_DIGITS = 18
#: candidates ranked per passkey prompt: each is one forward over the whole prompt
MAX_CANDIDATES = 10_000


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    """A seed numpy's generators accept: a non-negative integer (None: the default)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise UserError(f"{flag} must be a non-negative integer, got {seed!r}.")


def refuse_encoder(run_dir: str | Path, command: str) -> None:
    """A UserError when ``run_dir`` holds an encoder (objective mlm): ``command`` scores next-token
    predictions, which a masked-LM encoder does not make (it would rank keys by a bidirectional model's
    guesses at positions it was never trained to predict)."""
    from extrapos.config import load_run_config

    if load_run_config(Path(run_dir)).train.objective == "mlm":
        raise UserError(
            f"{run_dir} is an encoder run (objective mlm) and {command} scores a decoder's next-token "
            "predictions, so score it with `extrapos eval` (its masked-LM loss) instead."
        )


#: few-shot examples per lm-eval prompt: each is a whole document of the task in every prompt's context
MAX_FEWSHOT = 64


def flag_name(key: str, cli: bool = True) -> str:
    """How a message names an option: the command line's ``--num-fewshot`` or a sweep's ``num_fewshot``."""
    return "--" + key.replace("_", "-") if cli else key


def check_lm_eval_request(
    limit: int | float | None,
    batch_size: int,
    num_fewshot: int | None,
    metadata: Any,
    max_length: int | None,
    cli: bool = True,
) -> None:
    """An lm-eval request's numbers checked before the run or the harness is loaded, each named by its flag
    (``cli``) or its sweep key."""
    import math

    def name(key: str) -> str:
        return flag_name(key, cli)

    if limit is not None and (isinstance(limit, bool) or not (math.isfinite(limit) and limit > 0)):
        raise UserError(
            f"{name('limit')} must be a positive count of examples per task (or a fraction below 1), "
            f"got {limit}."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"{name('batch_size')} must be a positive integer, got {batch_size}.")
    if num_fewshot is not None and not 0 <= num_fewshot <= MAX_FEWSHOT:
        raise UserError(f"{name('num_fewshot')} must be between 0 and {MAX_FEWSHOT}, got {num_fewshot}.")
    if metadata is not None and not isinstance(metadata, dict):
        raise UserError(
            f'{name("metadata")} must be a JSON object such as {{"max_seq_lengths": [4096]}}, got '
            f"{metadata!r}."
        )
    if max_length is not None and max_length < 2:
        raise UserError(f"{name('max_length')} must be at least 2 tokens, got {max_length}.")


#: option values an evaluation resolves itself: the longest length, each evaluated window's length
PLACEHOLDERS = ("max", "ev", "window")


def check_encoding_options(cfg, options: dict[str, Any], given_as: str = "the encoding options") -> None:
    """Inference-time encoding options checked against a run's config before any work, by the validator a
    training config goes through (``config.validate``): an unknown option, a value of the wrong type
    (``base=abc``) or one that makes every loss NaN (``base=0``: RoPE's frequencies base^(-2i/d), Su et
    al. 2021) is one sentence naming ``given_as``. The values resolved at evaluation time ("max": the
    longest length, "ev": its multiple of L_t, "window": each window's length) stand in as 2. A config
    an older extrapos wrote under other rules is left to the encoding's own checks."""
    import dataclasses

    from extrapos.config import validate

    if not options:
        return
    try:
        validate(cfg)
    except UserError:
        return
    values = {k: (2 if v in PLACEHOLDERS else v) for k, v in options.items()}
    model = dataclasses.replace(cfg.model, positions={**cfg.model.positions, **values})
    try:
        validate(dataclasses.replace(cfg, model=model))
    except UserError as e:
        given = ", ".join(f"{k}={v}" for k, v in options.items())
        raise UserError(f"{given_as} {given} are refused: {str(e).rstrip('.')}.") from None
