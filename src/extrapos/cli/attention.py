"""`extrapos attention`: attention diagnostics of a run at k x L_t (docs/attention-diagnostics.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from extrapos.cli.eval import add_length_flags, add_position_flags


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "attention",
        help="attention entropy, sinks and attended distance per layer and head at each length",
        description="Read a run's attention on the held-out windows `extrapos eval` scores: per layer and "
        "head, at each length, the entropy, the mass on the first tokens and the mean and median distance "
        "attended to (docs/attention-diagnostics.md). Writes RUN/attention/<name>.json and a plot beside it.",
    )
    p.add_argument(
        "run",
        nargs="+",
        help="a run directory; several (a parent and its extended children) with --figure compare them",
    )
    p.add_argument(
        "--base-length",
        type=int,
        default=None,
        metavar="L_T",
        help="the training length that --lengths multiply and that 'past L_t' means (default: each run's "
        "own); an extended child read with its parent's L_t compares with the parent",
    )
    p.add_argument(
        "--figure",
        default=None,
        metavar="DIR",
        help="also write DIR/median-weight.{md,png}: the median attention weight past L_t of every run, "
        "the first as the baseline (the segmented-sequences paper's Figure 3; docs/attention-diagnostics.md)",
    )
    p.add_argument(
        "--labels",
        default=None,
        help="comma-separated names of the runs in the figure (default: folders); runs that share a label "
        "are the seeds of one row: give every label once per seed, in the same seed order",
    )
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
    p.add_argument(
        "--force",
        action="store_true",
        help="run without asking when it is estimated past an hour, and past a day",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from extrapos.cli.eval import (
        check_position_options,
        eval_lengths,
        lengths_for_factor,
        open_run,
        position_options,
    )
    from extrapos.errors import UserError
    from extrapos.evaluate import EvalRequest
    from extrapos.evaluate.attention_stats import diagnose, format_result
    from extrapos.run.runtime import resolve_device

    labels = [x.strip() for x in args.labels.split(",")] if args.labels else [Path(r).name for r in args.run]
    if len(labels) != len(args.run):
        raise UserError(f"--labels names {len(labels)} runs but {len(args.run)} were given; name each once.")
    if len(args.run) > 1 and args.figure is None:
        raise UserError("several runs are compared in a figure: add --figure DIR, or read one run at a time.")
    if args.base_length is not None and args.base_length < 1:
        raise UserError(f"--base-length must be a positive number of tokens, got {args.base_length}.")
    if args.figure is not None:
        from extrapos.report.attention_figure import seed_groups

        check_figure_dir(Path(args.figure))
        seed_groups(labels)  # runs that share a label are one row's seeds: refused before any is read
    lengths, tokens = eval_lengths(args)  # the lengths `extrapos eval` takes, parsed as it parses them
    device = str(resolve_device(args.device, "--device"))
    results = []
    for run_dir in args.run:
        handle = open_run(run_dir)  # each run's directory read once
        options = position_options(args, lengths_for_factor(handle, lengths, tokens))
        check_position_options(handle, options)
        req = EvalRequest(
            lengths=lengths,
            tokens=tokens,
            split=args.split,
            max_tokens=args.max_tokens,
            position_options=options,
            step=args.step,
            base_length=args.base_length,
        )
        result = diagnose(
            handle,
            req,
            name=args.name,
            overwrite=args.overwrite,
            device=device,
            progress=not args.no_progress,
            force=args.force,
            ask=True,
        )
        print(format_result(result))
        out = Path(run_dir) / "attention" / (result["name"] + ".json")
        print(f"-> {out} (plot: {out.with_suffix('.png')})")
        results.append(result)
    if args.figure is not None:
        from extrapos.report.attention_figure import write_figure

        md, png = write_figure(list(zip(labels, results)), Path(args.figure))
        print(f"-> {md}" + (f" (figure: {png})" if png else ""))
    return 0


def check_figure_dir(path: Path) -> None:
    """The figure's folder is a plain output folder: never a run (whose tree holds its own results), nor a
    file."""
    from extrapos.errors import UserError

    if path.exists() and not path.is_dir():
        raise UserError(f"--figure {path} is a file; name a folder for median-weight.md and .png.")
    for parent in (path, *path.resolve().parents):
        if (parent / "config.toml").is_file():
            raise UserError(
                f"--figure {path} is inside the run {parent}; name a folder outside every run's tree."
            )
