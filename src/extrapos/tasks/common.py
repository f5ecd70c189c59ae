"""Shared pieces of the task evaluations: batched greedy decoding, candidate scoring, the run a task
scores and the fields its result opens with (the result slot itself is ``evaluate.slot``'s)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
import torch.nn.functional as F

from extrapos.errors import UserError
from extrapos.evaluate.slot import ResultSlot
from extrapos.files import save_png
from extrapos.run.handle import Run

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from extrapos.model import Decoder
    from extrapos.run.config import RunConfig
    from extrapos.run.handle import LoadedRun


@torch.no_grad()
def greedy_batch(
    model: Decoder,
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
    h: torch.Tensor | None = None
    for s in range(0, T, prefill_chunk):
        chunk = prompts[:, s : s + prefill_chunk]
        pos = torch.arange(s, s + chunk.shape[1], device=device).expand(B, -1)
        h = model.hidden_states(chunk, pos, cache)
    logits = model.logits(cast(torch.Tensor, h)[:, -1])  # set by the prefill: a prompt holds a token
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
    model: Decoder, prompt: Sequence[int], continuations: Sequence[Sequence[int]], batch_tokens: int = 16_384
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


O = TypeVar("O", bound="DataclassInstance")  # a task's options are a dataclass


def given_options(cls: type[O], options: O | None, fields: dict[str, Any]) -> O:
    """A task's options: ``options`` (default ``cls()``) with the keyword ``fields`` replaced, so that
    ``passkey(run, PasskeyOptions(...))`` and ``passkey(run, lengths=[1, 2])`` ask for the same thing."""
    if options is not None and not isinstance(options, cls):
        raise TypeError(f"options must be a {cls.__name__}, got {type(options).__name__}")
    return dataclasses.replace(options if options is not None else cls(), **fields)


def load_task_run(
    run: Run,
    slot: ResultSlot,
    device: str,
    base_length: int | None,
    position_options: dict[str, Any],
    longest: int,
) -> tuple[LoadedRun, int, dict[str, Any]]:
    """The run loaded at the checkpoint its slot scores, with the request's inference-time encoding options
    set ("max": the longest length, ``longest`` x L_t): (the run, L_t, the options applied)."""
    from extrapos.run.directory import load_run

    loaded = load_run(run, device=device, checkpoint=slot.ckpt)
    L = base_length or loaded.cfg.model.train_length
    options = resolve_position_options(position_options, longest * L)
    if options:
        loaded.model.pos.set_options(**options)
    return loaded, L, options


def task_result(
    name: str,
    task: str,
    run_dir: Path,
    request: dict[str, Any],
    run: LoadedRun,
    applied: dict[str, Any],
    L: int,
    slot: ResultSlot,
) -> dict[str, Any]:
    """The fields every task result opens with: what was asked of which run, and the checkpoint scored."""
    return {
        "name": name,
        "task": task,
        "run": str(run_dir),
        "request": request,
        "encoding": run.cfg.model.positions_plan().name,
        "applied": applied,
        "train_length": L,
        "checkpoint_step": run.step,
        "checkpoint": slot.checkpoint,
    }


def examples_digest(*arrays: Any) -> str:
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


def known_tokenizer(data: Any, run_dir: Path | None) -> Any:
    """A sweep row's tokenizer where it exists before the row trains: the run a ``run = ...`` row scores, a
    prepared ``data.dir``, a tokenizer file named by ``data.tokenizer``; None otherwise (a ``bpe:N`` the
    sweep trains later, a named tokenizer not fetched yet) or where it cannot be read (refused when the row
    trains, in its own words)."""
    from extrapos.data.tokenizer import load_tokenizer
    from extrapos.run.runtime import is_file_spec, run_tokenizer_file

    spec = str(data.tokenizer).strip()
    found = run_tokenizer_file(run_dir) if run_dir is not None else None
    if found is None and data.dir and (Path(data.dir) / "manifest.json").is_file():
        found = Path(data.dir)
    if found is None and not data.dir and is_file_spec(spec) and Path(spec).is_file():
        found = Path(spec)
    if found is None:
        return None
    try:
        return load_tokenizer(found)
    except UserError:
        return None


def check_seed(seed: int | None, flag: str = "--seed") -> None:
    """A seed numpy's generators accept: a non-negative integer (None: the default)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise UserError(f"{flag} must be a non-negative integer, got {seed!r}.")


def refuse_encoder(run: Run, command: str) -> None:
    """A UserError when ``run`` is an encoder (objective mlm): ``command`` scores next-token
    predictions, which a masked-LM encoder does not make (it would rank keys by a bidirectional model's
    guesses at positions it was never trained to predict)."""
    if run.is_encoder:
        raise UserError(
            f"{run.path} is an encoder run (objective mlm) and {command} scores a decoder's next-token "
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


def check_encoding_options(
    cfg: RunConfig, options: dict[str, Any], given_as: str = "the encoding options"
) -> None:
    """Inference-time encoding options checked against a run's config before any work, by the validator a
    training config goes through (``config.validate``): an unknown option, a value of the wrong type
    (``base=abc``) or one that makes every loss NaN (``base=0``: RoPE's frequencies base^(-2i/d), Su et
    al. 2021) is one sentence naming ``given_as``. The values resolved at evaluation time ("max": the
    longest length, "ev": its multiple of L_t, "window": each window's length) stand in as 2. A config
    an older extrapos wrote under other rules is left to the encoding's own checks."""
    import dataclasses

    from extrapos.run.config import validate

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


def computed_metrics(result: dict[str, Any]) -> list[str]:
    """Every metric a retrieval result's cells hold, the primary one first: rank mode's accuracy, mean
    rank and mean reciprocal rank, generate mode's exact match (both: all four)."""
    first = result["metric"]
    cells = result["results"]
    found = [m for m in ("rank_accuracy", "mean_rank", "mrr", "exact_match") if cells and m in cells[0]]
    return [first] + [m for m in found if m != first]


def format_every_metric(result: dict[str, Any], format_one: Callable[[dict[str, Any], str], str]) -> str:
    """One grid per computed metric, what the console shows after a passkey or RULER run: the first grid
    carries the run's description, the others name only their metric."""
    first, *others = computed_metrics(result)
    parts = [format_one(result, first)]
    for metric in others:
        lines = format_one(result, metric).split("\n")
        lines[0] = f"{metric.replace('_', ' ')} (the same cells):"
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def accuracy_heatmap(
    grid: Any,
    rows: list[str],
    lengths: list[int],
    *,
    train_length: int,
    title: str,
    xlabel: str,
    ylabel: str | None,
    path: str | Path,
    size: tuple[float, float],
    edge_line: bool = False,
) -> Path:
    """Save a rows x lengths heatmap of accuracies in [0, 1] (matplotlib), each cell written in, a dashed
    line before the first length beyond ``train_length`` (at the right edge when ``edge_line`` and none
    is beyond). ``size`` is (extra width, row height) in inches."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plots need matplotlib; run `pip install 'extrapos[plots]'`.") from None
    fig, ax = plt.subplots(figsize=(1.1 * len(lengths) + size[0], size[1] * len(rows) + 1.8))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    for i in range(len(rows)):
        for j in range(len(lengths)):
            ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    beyond = next((j - 0.5 for j, n in enumerate(lengths) if n > train_length), None)
    if beyond is None and edge_line:
        beyond = len(lengths) - 0.5
    if beyond is not None:
        ax.axvline(beyond, color="k", lw=1, ls="--")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path)  # written whole or not at all
    plt.close(fig)
    return path
