"""`extrapos generate`: sample text from a run with a KV cache, for every encoding.

The prompt may be longer than the training length (that is the point of these encodings): it is
prefilled into the cache in chunks, then each new token costs one single-token forward at its own
position. ``use_cache=False`` recomputes the whole prefix every step instead (the benchmark's
baseline, and a check that both give the same tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from extrapos.console import STDERR
from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.model import Decoder, ModelConfig

logger = logging.getLogger(__name__)


def filter_logits(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """Temperature, then top-k, then nucleus (top-p) filtering of one row of logits (V,)."""
    logits = logits.float() / max(temperature, 1e-8)
    if top_k is not None and 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, -1) > top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


@torch.no_grad()
def generate_tokens(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int = 0,
    eot_id: int | None = None,
    use_cache: bool = True,
    prefill_chunk: int = 1024,
    progress: bool = False,
    label: str = "generate",
) -> Iterator[int]:
    """Yield new token ids one at a time (greedy when temperature == 0).

    ``progress`` shows a bar over the prompt's tokens while a prompt of more than one chunk is prefilled
    (a long prompt is where the time goes before the first new token; a short one needs no bar).
    """
    if not prompt:
        raise UserError("the prompt is empty after tokenization; give at least one character of prompt.")
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    model.eval()
    tokens = torch.tensor(prompt, device=device).unsqueeze(0)
    cache = model.new_cache() if use_cache else None
    logits: Tensor | None = None
    if use_cache:
        from tqdm import tqdm

        total = tokens.shape[1]
        bar = tqdm(
            total=total, unit="tok", desc=f"prefill {label}", disable=not progress or total <= prefill_chunk
        )
        for s in range(0, total, prefill_chunk):
            chunk = tokens[:, s : s + prefill_chunk]
            pos = torch.arange(s, s + chunk.shape[1], device=device).unsqueeze(0)
            h = model.hidden_states(chunk, pos, cache)
            bar.update(chunk.shape[1])
        bar.close()
        logits = model.logits(h[:, -1])[0]
    for _ in range(max_new_tokens):
        if not use_cache:
            pos = torch.arange(tokens.shape[1], device=device).unsqueeze(0)
            logits = model(tokens, pos)[0, -1]
        assert logits is not None  # the prefill or the full forward above set it
        if temperature == 0:
            nxt = int(torch.argmax(logits))
        else:
            probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), -1).cpu()
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        yield nxt
        if eot_id is not None and nxt == eot_id:
            return
        new = torch.tensor([[nxt]], device=device)
        if use_cache:
            pos = torch.tensor([[tokens.shape[1]]], device=device)
            logits = model(new, pos, cache)[0, -1]
        tokens = torch.cat([tokens, new], dim=1)


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None, seed: int = 0
) -> None:
    """Sampling settings checked before a model is loaded (a wrong one is never silently ignored)."""
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {max_new_tokens}.")
    if not temperature >= 0:
        raise UserError(f"--temperature must be >= 0 (0 is greedy decoding), got {temperature}.")
    if top_k is not None and top_k < 1:
        raise UserError(f"--top-k must be at least 1 (or omitted), got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {top_p}.")
    if not 0 <= seed < 2**63:  # torch's generator takes a non-negative 64-bit seed
        raise UserError(f"--seed must be a non-negative integer below 2^63, got {seed}.")


def check_prompt_memory(model_cfg: ModelConfig, tokens: int, use_cache: bool, device: str) -> None:
    """Refuse a prompt whose KV cache (or, without one, whose full forward) cannot fit in memory, in one
    sentence naming the limit (``run.memory.forward_bytes``: tokens x layers x heads x head_dim x 2 x 4
    bytes for the cache, one prefill chunk's activations)."""
    from extrapos.run.memory import check_memory, forward_bytes

    need = (
        forward_bytes(model_cfg, tokens, cache=True)
        - forward_bytes(model_cfg, tokens)
        + forward_bytes(model_cfg, min(tokens, 1024))
        if use_cache
        else forward_bytes(model_cfg, tokens)
    )
    check_memory(
        need,
        device,
        f"a prompt and continuation of {tokens} tokens",
        "give a shorter prompt or fewer --max-new-tokens",
    )


def check_generation_time(
    model_cfg: ModelConfig,
    prompt: int,
    new: int,
    use_cache: bool,
    device: str,
    force: bool,
    ask: bool = False,
) -> float | None:
    """Say the least time the prefill and the continuation take when past a minute, and refuse them past
    a day unless ``force``, past an hour confirmed with ``ask``; returns the estimate (``run.timing``: a 5 MB
    prompt ran for hours): with a KV cache the prompt once and each new token against the keys before it;
    without one, every new token runs the whole prefix again."""
    from extrapos.run.timing import check_time, forward_flops

    if use_cache:
        flops = forward_flops(model_cfg, prompt, prompt / 2) + forward_flops(model_cfg, new, prompt + new / 2)
    else:
        flops = forward_flops(model_cfg, prompt + new * (prompt + new // 2), (prompt + new) / 2)
    return check_time(
        flops,
        device,
        f"a prompt of {prompt:,} tokens and {new:,} new ones",
        "give a shorter prompt or fewer --max-new-tokens",
        force,
        say=lambda line: logger.info(line, extra=STDERR),  # the continuation streams on stdout
        ask=ask,
    )


def generate_text(
    run_dir: str | Path,
    prompt: str,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int = 0,
    use_cache: bool = True,
    position_options: dict | None = None,
    device: str = "cpu",
    on_text: Callable[[str], None] | None = None,
    progress: bool = False,
    force: bool = False,
    ask: bool = False,
) -> str:
    """Generate a continuation of ``prompt``; ``on_text`` receives each new piece of text as it appears;
    ``progress`` shows the prefill of a long prompt on stderr; ``force`` runs work estimated past a day;
    ``ask`` (the command): work estimated past an hour is confirmed on a terminal, refused without one
    unless ``force``, and shows its prefill's progress (``run.timing``)."""
    from extrapos.run.directory import load_run
    from extrapos.run.timing import shows_progress

    check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
    run = load_run(run_dir, device=device)
    if position_options:
        run.model.pos.set_options(**position_options)
    ids = run.tokenizer.encode(prompt)
    check_prompt_memory(run.cfg.model, len(ids) + max_new_tokens, use_cache, device)
    seconds = check_generation_time(run.cfg.model, len(ids), max_new_tokens, use_cache, device, force, ask)
    progress = shows_progress(progress, seconds, ask)
    out: list[int] = []
    shown = ""
    for tok in generate_tokens(
        run.model,
        ids,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        eot_id=run.tokenizer.eot_id,
        use_cache=use_cache,
        progress=progress,
        label=Path(run_dir).name,
    ):
        if tok == run.tokenizer.eot_id:
            break
        out.append(tok)
        text = run.tokenizer.decode(out)
        # stream only complete characters: a byte-level token may end mid-character
        if on_text is not None and not text.endswith("\ufffd"):
            on_text(text[len(shown) :])
            shown = text
    text = run.tokenizer.decode(out)
    if on_text is not None and len(text) > len(shown):
        on_text(text[len(shown) :])
    return text
