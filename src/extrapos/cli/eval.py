"""`extrapos eval`: score a run at 1x..16x its training length."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any


def add_length_flags(p: argparse.ArgumentParser, tokens_help: str) -> None:
    """--lengths (multiples of L_t) and --tokens (window lengths), as eval and attention read them."""
    p.add_argument(
        "--lengths",
        default=None,
        help="multiples of the training length, fractional where k x L_t is whole, e.g. 0.5,1,2 (default "
        "1,2,4,8,16, or none with --tokens)",
    )
    p.add_argument("--tokens", default=None, help=tokens_help)


def add_position_flags(p: argparse.ArgumentParser) -> None:
    """The inference-time encoding changes, the same flags on every command that scores a run (eval,
    attention, passkey, ruler, synthetic-eval, lm-eval); ``position_options`` reads them."""
    p.add_argument(
        "--scale", type=float, default=None, help="ExPE/ExQPE inference-time scale (the paper's 0.5)"
    )
    p.add_argument(
        "--rope-scaling",
        default=None,
        metavar="NAME",
        help="a RoPE scaling applied at inference: linear, ntk, dynamic, yarn, llama3 or longrope",
    )
    p.add_argument(
        "--factor", type=float, default=None, help="RoPE scaling factor (default: the longest length)"
    )
    p.add_argument(
        "--interpolate",
        action="store_true",
        help="interpolate a learned table to each evaluated window longer than the table (none at ev=1; an "
        "extended run's L_e-row table is read as trained up to L_e): the same flag for a parent and its "
        "extension",
    )
    p.add_argument(
        "--position-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any option of the encoding for this evaluation (repeatable)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a run at 1x..16x its training length",
        description="Score the same held-out tokens with windows of k x L_t for each k (protocols: "
        "docs/evaluation.md).",
    )
    p.add_argument("run", help="a run directory")
    add_length_flags(
        p, "window lengths in tokens, e.g. 15360 (the CABLE paper's 15 x 1024); alone or beside --lengths"
    )
    add_position_flags(p)
    p.add_argument("--corpus", default=None, help="another corpus spec, tokenized with the run's tokenizer")
    p.add_argument("--data", default=None, help="a prepared data directory to score instead")
    p.add_argument("--split", default="test", help="split of the run's data (default test)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=65_536,
        help="target tokens scored per length (an encoder: tokens of text, of which 15%% are masked)",
    )
    p.add_argument(
        "--stride", type=int, default=None, help="sliding-window mode with this stride (decoders only)"
    )
    p.add_argument(
        "--protocol",
        choices=["documents", "stream"],
        default="documents",
        help="documents (default): spans inside held-out documents of max length + 1 tokens; stream: the "
        "documents joined with end-of-text, for corpora of short documents (docs/evaluation.md)",
    )
    p.add_argument(
        "--boundary",
        choices=["cross", "mask"],
        default=None,
        help="the stream protocol: context crosses document boundaries (cross, default) or each target "
        "sees only its own document (mask)",
    )
    p.add_argument(
        "--selection",
        choices=["spread", "first"],
        default="spread",
        help="the documents protocol's spans: spread over as many documents as --max-tokens allows "
        "(default) or taken from the first documents (as results saved before the spread were)",
    )
    p.add_argument(
        "--mask-seed",
        type=int,
        default=None,
        help="an encoder run (objective mlm): seed of the BERT mask drawn once per span (default 0)",
    )
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--name", default=None, help="result name in RUN/eval/ (default: from the options)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing different result")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--force",
        action="store_true",
        help="score without asking when it is estimated past an hour, and past a day",
    )
    p.set_defaults(func=run)


def parse_lengths(text: str) -> list[int]:
    from extrapos.errors import UserError

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"--lengths must be integers separated by commas (e.g. 1,2,4,8,16), got {text!r}."
        ) from None


def parse_eval_lengths(text: str) -> list[int | float]:
    """--lengths of `extrapos eval`: multiples of L_t, whole (kept ints, as results record them) or
    fractional (0.5); whether k x L_t is a whole number of tokens is checked once L_t is known."""
    from extrapos.errors import UserError
    from extrapos.evaluate.lengths import ev_value

    values = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        try:
            k = float(x)
        except ValueError:
            k = math.nan
        if not math.isfinite(k) or k <= 0:
            raise UserError(
                f"--lengths must be positive numbers separated by commas (e.g. 0.5,1,2,4), got {text!r}."
            )
        values.append(ev_value(k))
    return values


def parse_tokens(text: str) -> list[int]:
    """--tokens: window lengths in whole tokens."""
    from extrapos.errors import UserError
    from extrapos.evaluate.lengths import MIN_WINDOW

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(n < MIN_WINDOW for n in values):
        raise UserError(
            f"--tokens must be whole numbers of at least {MIN_WINDOW} tokens separated by commas (e.g. "
            f"15360,4096), got {text!r}."
        )
    return values


def eval_lengths(args: argparse.Namespace) -> tuple[list[int | float], list[int] | None]:
    """(multiples, tokens) of the request: --lengths defaults to 1,2,4,8,16 unless --tokens alone is given."""
    tokens = parse_tokens(args.tokens) if args.tokens is not None else None
    if args.lengths is None:
        from extrapos.evaluate import DEFAULT_LENGTHS

        return ([] if tokens else list(DEFAULT_LENGTHS)), tokens
    return parse_eval_lengths(args.lengths), tokens


def lengths_for_factor(run: Any, lengths: list, tokens: list[int] | None) -> list:
    """The multiples of L_t that --rope-scaling's default factor (the longest) is read from: with --tokens,
    each window over the run's L_t as well (none to read without a run: the evaluation then says so).
    ``run``: the command's ``run.handle.Run``."""
    if not tokens or not run.exists:
        return lengths or [1]
    L = run.cfg.model.train_length
    return [*lengths, *(n / L for n in tokens)]


def parse_value(text: str) -> Any:
    """A command-line option value: int, float, true/false/none, else the string itself. An integer past
    64 bits is read as a float: no integer option holds it, and torch takes no such int."""
    for cast in (int, float):
        try:
            value = cast(text)
            return float(value) if isinstance(value, int) and not -(2**63) <= value < 2**63 else value
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def position_options(args: argparse.Namespace, lengths: list[int]) -> dict[str, Any]:
    """The inference-time encoding changes the flags ask for."""
    from extrapos.errors import UserError

    options: dict[str, Any] = {}
    if args.scale is not None:
        options["scale"] = args.scale
    if args.rope_scaling:
        options["scaling"] = args.rope_scaling
        options["factor"] = args.factor if args.factor is not None else float(max(lengths))
    elif args.factor is not None:
        raise UserError("--factor needs --rope-scaling (linear, ntk, dynamic or yarn).")
    if args.interpolate:
        options["interpolate_to"] = "window"
    for text in args.position_option:
        key, sep, value = text.partition("=")
        if not sep:
            raise UserError(f"--position-option '{text}' must look like key=value.")
        options[key.strip()] = parse_value(value.strip())
    return options


def check_position_options(run: Any, options: dict[str, Any]) -> None:
    """The --position-option (and --scale, --rope-scaling) values checked against the run's encoding before
    any work (``tasks.common.check_encoding_options``); nothing to check without a run (the command then
    says what is missing). ``run``: the command's ``run.handle.Run``."""
    from extrapos.tasks.common import check_encoding_options

    if options and run.exists:
        check_encoding_options(run.cfg, options)


def open_run(run_dir: str) -> Any:
    """The run in ``run_dir`` as the whole command holds it (``run.handle.Run``): each of its files read
    once, on first use, so a missing or damaged run is reported where the command always reported it."""
    from extrapos.run.handle import Run

    return Run(run_dir)


def run(args: argparse.Namespace) -> int:
    from extrapos.errors import UserError
    from extrapos.evaluate import EvalRequest
    from extrapos.evaluate.driver import drive
    from extrapos.evaluate.evaluator import Scoring, loss_evaluator
    from extrapos.run.runtime import Shard, init_distributed, resolve_device

    for flag, value in (("--corpus", args.corpus), ("--data", args.data)):
        if value is not None and not str(value).strip():
            raise UserError(
                f"{flag} is empty; name a corpus spec or a prepared data directory, or drop {flag}."
            )
    lengths, tokens = eval_lengths(args)
    handle = open_run(args.run)
    options = position_options(args, lengths_for_factor(handle, lengths, tokens))
    check_position_options(handle, options)
    req = EvalRequest(
        lengths=lengths,
        tokens=tokens,
        corpus=args.corpus,
        data_dir=args.data,
        split=args.split,
        max_tokens=args.max_tokens,
        position_options=options,
        stride=args.stride,
        precision=args.precision,
        step=args.step,
        protocol=args.protocol,
        boundary=args.boundary,
        selection=args.selection,
    )
    # the run's loss evaluation (next-token, or masked-LM for an encoder) refuses what it cannot do
    loss = loss_evaluator(handle)
    request = loss.loss_request(handle, req, args.mask_seed)
    # under torchrun the windows are scored by all ranks together (each ends with the whole result)
    rank, _, device = init_distributed(resolve_device(args.device, "--device"))
    progress = not args.no_progress and rank == 0
    how = Scoring(args.name, args.overwrite, str(device), progress, args.force, ask=True)
    result = drive(loss, handle, request, Shard.of_group(device), how)
    if rank == 0:
        print(loss.format(result))
        print(f"-> {Path(args.run) / 'eval' / (result['name'] + '.json')}")
    return 0
