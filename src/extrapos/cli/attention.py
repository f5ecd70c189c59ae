"""`extrapos attention`: attention diagnostics of a run at k x L_t (docs/attention-diagnostics.md)."""

from __future__ import annotations

from pathlib import Path

from extrapos.cli.eval import add_length_flags, add_position_flags


def register(sub) -> None:
    p = sub.add_parser(
        "attention",
        help="attention entropy, sinks and attended distance per layer and head at each length",
        description="Read a run's attention on the held-out windows `extrapos eval` scores: per layer and "
        "head, at each length, the entropy, the mass on the first tokens and the mean and median distance "
        "attended to (docs/attention-diagnostics.md). Writes RUN/attention/<name>.json and a plot beside it.",
    )
    p.add_argument("run", help="a run directory")
    add_length_flags(
        p, "window lengths in tokens, e.g. 15360; alone or beside --lengths (as in `extrapos eval`)"
    )
    p.add_argument("--max-tokens", type=int, default=16_384, help="tokens read per length (default 16384)")
    add_position_flags(p)
    p.add_argument("--split", default="test", help="split of the run's data (default test)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--name", default=None, help="result name in RUN/attention/ (default: from the options)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing different result")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true", help="run even when it is estimated past a day")
    p.set_defaults(func=run)


def run(args) -> int:
    from extrapos.cli.eval import (
        check_position_options,
        eval_lengths,
        lengths_for_factor,
        position_options,
    )
    from extrapos.evaluate import EvalRequest
    from extrapos.evaluate.attention_stats import diagnose, format_result
    from extrapos.run.runtime import resolve_device

    lengths, tokens = eval_lengths(args)  # the lengths `extrapos eval` takes, parsed as it parses them
    options = position_options(args, lengths_for_factor(args.run, lengths, tokens))
    check_position_options(args.run, options)
    req = EvalRequest(
        lengths=lengths,
        tokens=tokens,
        split=args.split,
        max_tokens=args.max_tokens,
        position_options=options,
        step=args.step,
    )
    result = diagnose(
        args.run,
        req,
        name=args.name,
        overwrite=args.overwrite,
        device=str(resolve_device(args.device, "--device")),
        progress=not args.no_progress,
        force=args.force,
    )
    print(format_result(result))
    out = Path(args.run) / "attention" / (result["name"] + ".json")
    print(f"-> {out} (plot: {out.with_suffix('.png')})")
    return 0
