"""The console table of `extrapos eval`: per length the loss, perplexity, bits per byte, tail loss, the
loss's interval over documents and the paired change to the shortest length, with the notes printed
under it (the masked-LM form prints the same notes)."""

from __future__ import annotations

from typing import Any


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
