"""The cost of an evaluation, estimated before any model is loaded: the memory of one batch of the longest
window (refused when it cannot fit) and the time of the whole scoring (said past a minute, refused past
a day unless forced)."""

from __future__ import annotations

from extrapos.evaluate.request import EvalRequest, request_lengths
from extrapos.run.handle import Run


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


def check_eval_time(run: Run, req: EvalRequest, device: str, force: bool, ask: bool = False) -> float | None:
    """Print the least time the scoring takes when past a minute and refuse it past a day unless ``force``
    (past an hour: confirmed with ``ask``; returns the estimate, ``run.timing``): each length runs about
    ``max_tokens`` targets through windows of its length (with a ``stride``, ``window / stride`` tokens
    computed per target), each token seeing half its window."""
    from extrapos.run.timing import check_time, forward_flops

    model = run.cfg.model
    L = req.base_length or model.train_length
    lengths = request_lengths(req, L)
    flops = sum(
        forward_flops(model, req.max_tokens * x.window // min(req.stride or x.window, x.window), x.window / 2)
        for x in lengths
    )
    what = f"scoring {len(lengths)} length(s) up to {lengths[-1].window:,} tokens"
    return check_time(flops, device, what, "ask for shorter --lengths or fewer --max-tokens", force, ask=ask)
