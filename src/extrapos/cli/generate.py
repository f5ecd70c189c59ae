"""`extrapos generate`: sample text from a run, streamed, with a KV cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a trained run (KV cache, streamed)",
        description="Greedy decoding by default, as transformers' generate; --do-sample or a --temperature "
        "above 0 samples instead (temperature 1.0 and top-k 50 unless given).",
    )
    p.add_argument("run", help="a run directory")
    p.add_argument("--prompt", default=None, help="the prompt text")
    p.add_argument("--prompt-file", default=None, help="read the prompt from a file (long prompts)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (above 0 samples; default 1.0 with --do-sample; 0 is greedy)",
    )
    p.add_argument(
        "--top-k", type=int, default=None, help="sampling: keep the k likeliest tokens (default 50)"
    )
    p.add_argument("--top-p", type=float, default=None, help="sampling: nucleus probability mass")
    p.add_argument("--seed", type=int, default=0, help="sampling: the random seed")
    p.add_argument("--scale", type=float, default=None, help="ExPE/ExQPE inference-time scale")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole prefix every token (slow)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no bar while a long prompt is prefilled")
    p.add_argument(
        "--force",
        action="store_true",
        help="run without asking when the work is estimated past an hour, and past a day",
    )
    p.set_defaults(func=run)


#: the largest prompt file read (a prompt is tokenized, then prefilled into the KV cache)
MAX_PROMPT_BYTES = 16 << 20


def read_prompt_file(path: Path) -> str:
    """The prompt file as text: a regular file of at most ``MAX_PROMPT_BYTES`` of UTF-8 (a binary file is
    refused, never decoded with replacement characters into a prompt nobody meant)."""
    from extrapos.errors import UserError
    from extrapos.files import check_regular_file

    check_regular_file(path, f"prompt file {path}", "give a text file")
    size = path.stat().st_size
    if size > MAX_PROMPT_BYTES:
        raise UserError(
            f"prompt file {path} holds {size} bytes and a prompt may hold at most {MAX_PROMPT_BYTES}; "
            "give a shorter prompt."
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read prompt file {path} ({e.strerror}); check the file.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"prompt file {path} is not UTF-8 text (byte {e.start} is invalid); give a text file."
        ) from None
    if "\x00" in text:
        raise UserError(f"prompt file {path} holds NUL bytes, so it is not text; give a text file.")
    return text


def decoding(args: argparse.Namespace) -> tuple[float, int | None, float | None]:
    """The temperature, top-k and top-p to decode with: greedy (temperature 0) unless sampling is asked
    for (--do-sample, or a --temperature above 0), as transformers' generate does by default."""
    from extrapos.errors import UserError
    from extrapos.inference.generate import check_sampling

    # each value's range first, so that a wrong one is named as such
    check_sampling(args.max_new_tokens, args.temperature or 0.0, args.top_k, args.top_p, args.seed)
    if args.do_sample and args.temperature == 0:
        raise UserError("--do-sample needs a --temperature above 0 (0 is greedy decoding); drop one of them.")
    if not (args.do_sample or args.temperature):
        given = [flag for flag, v in (("--top-k", args.top_k), ("--top-p", args.top_p)) if v is not None]
        if given:  # never ignored in silence: greedy decoding would not use it
            raise UserError(
                f"{given[0]} is a sampling setting and generate decodes greedily unless asked to sample; "
                f"add --do-sample (or --temperature T) or drop {given[0]}."
            )
        return 0.0, None, None
    temperature = 1.0 if args.temperature is None else args.temperature
    return temperature, 50 if args.top_k is None else args.top_k, args.top_p


def run(args: argparse.Namespace) -> int:
    from extrapos.errors import UserError
    from extrapos.inference.generate import generate_text
    from extrapos.run.runtime import resolve_device

    if (args.prompt is None) == (args.prompt_file is None):
        raise UserError("give exactly one of --prompt TEXT and --prompt-file FILE.")
    if args.prompt_file is not None:
        prompt = read_prompt_file(Path(args.prompt_file))
    else:
        prompt = args.prompt
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
            raise UserError("--prompt is not valid UTF-8 text; give the prompt as text.") from None
    temperature, top_k, top_p = decoding(args)
    options = {"scale": args.scale} if args.scale is not None else None
    device = resolve_device(args.device, "--device")

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    sys.stdout.write(prompt)
    generate_text(
        args.run,
        prompt,
        args.max_new_tokens,
        temperature,
        top_k,
        top_p,
        args.seed,
        use_cache=not args.no_cache,
        position_options=options,
        device=str(device),
        on_text=show,
        progress=not args.no_progress,
        force=args.force,
        ask=True,
    )
    if sys.stdout.isatty():  # end the line for a terminal; a pipe or file gets exactly the text
        sys.stdout.write("\n")
    return 0
