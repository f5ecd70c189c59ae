"""`extrapos import` and `extrapos export`: Hugging Face checkpoints in and out of extrapos runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "import",
        help="import a Hugging Face model (GPT-2, Pythia, Bloom, Llama, Mistral, Qwen2, SmolLM3) as a run",
        description="Import a local Hugging Face model directory or a hub name as an extrapos run: "
        "config.toml, the model's tokenizer, weights (streamed from safetensors).",
    )
    p.add_argument("source", help="a local model directory (config.json + safetensors) or a hub name")
    p.add_argument("--out", required=True, help="the run directory to create")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--tokenizer", default=None, help="use this tokenizer file instead of the model's own")
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the training length L_t the run records (default: the model's context limit)",
    )
    p.add_argument(
        "--corpus", default=None, help="corpus the run evaluates and extends on by default (default sotu)"
    )
    p.set_defaults(func=run_import)

    e = sub.add_parser(
        "export",
        help="export a run as a Hugging Face or sentence-transformers model directory",
        description="--format auto (default): hf where a native architecture holds the run, remote-code "
        "otherwise (it says which). --format hf: a directory that "
        "transformers.AutoModelForCausalLM.from_pretrained loads with equal logits (learned -> GPT-2, "
        "RoPE -> GPT-NeoX / Llama, ALiBi -> Bloom), no remote code. "
        "--format remote-code: any run (every encoding, layer schedules, encoders) as a directory the Auto "
        "classes load with trust_remote_code=True, or without it after import extrapos; the folder carries "
        "the model's code, so it loads without extrapos installed (docs/huggingface.md). "
        "--format sentence-transformers: an encoder run (any encoding) as a model "
        "SentenceTransformer(DIR, trust_remote_code=True) loads, with mean or [CLS] pooling "
        "(docs/encoder.md).",
    )
    e.add_argument("run", help="a run directory")
    e.add_argument("--out", required=True, help="the directory to write")
    e.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    e.add_argument(
        "--format",
        choices=["auto", "hf", "remote-code", "sentence-transformers"],
        default="auto",
        help="what to write (default auto: a native Hugging Face architecture where one holds the run, "
        "else remote code; hf refuses a run no native architecture holds)",
    )
    e.add_argument(
        "--pooling",
        choices=["mean", "cls"],
        default=None,
        help="sentence-transformers: mean of the token states (default) or the [CLS] state",
    )
    e.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="sentence-transformers: tokens per text with [CLS] and [SEP] (default: the run's L_t)",
    )
    e.add_argument("--normalize", action="store_true", help="sentence-transformers: L2-normalised embeddings")
    e.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="remote-code: the context limit the folder records (max_position_embeddings, which lm-eval "
        "reads as the window; default: the longest length the run was evaluated at, at least L_t)",
    )
    e.add_argument(
        "--push-to-hub",
        default=None,
        metavar="REPO",
        help="then upload the folder to this Hugging Face Hub model repository (OWNER/NAME, created if "
        "missing) in one commit; needs a token (hf auth login or HF_TOKEN)",
    )
    e.add_argument("--private", action="store_true", help="--push-to-hub: create the repository private")
    e.add_argument(
        "--commit-message",
        default=None,
        help="--push-to-hub: the commit's message (default: the run, its step and the extrapos version)",
    )
    e.set_defaults(func=run_export)


def run_import(args: argparse.Namespace) -> int:
    from extrapos.files import check_text
    from extrapos.integrations.hf import import_pretrained

    # every one of these is written into JSON or TOML, which hold UTF-8 only
    for flag, value in (("--out", args.out), ("--corpus", args.corpus), ("--tokenizer", args.tokenizer)):
        check_text(value, flag)

    data = {"corpus": args.corpus} if args.corpus else None
    out = import_pretrained(
        args.source,
        args.out,
        revision=args.revision,
        tokenizer=args.tokenizer,
        context_length=args.context_length,
        data=data,
    )
    print(f"imported {args.source} -> {out}")
    print(f"  {context_line(out)}")
    return 0


def context_line(run: str | Path) -> str:
    """The training length L_t an import recorded and where it comes from, read from its source.json."""
    import json
    from pathlib import Path

    record = json.loads((Path(run) / "source.json").read_text())
    keys = ("architecture", "train_length", "context_length", "context_key")
    arch, L_t, limit, key = (record[k] for k in keys)
    if L_t != limit:
        why = f"--context-length; the checkpoint's {key} is {limit}"
    elif key in record.get("hf_config", {}):
        why = f"config.json's {key}"
    else:  # Bloom without seq_length: the length it was trained at (the import's note says which)
        why = "; ".join(record.get("notes") or [f"config.json has no {key}"])
    return f"{arch}: L_t = {L_t} ({why})"


def run_export(args: argparse.Namespace) -> int:
    import json

    from extrapos.errors import UserError
    from extrapos.files import check_text

    check_text(args.out, "--out")
    check_push(args)

    if args.format == "sentence-transformers":
        import importlib.util

        if args.context is not None:
            raise UserError(
                "--context applies to Hugging Face folders; a sentence-transformers export takes "
                "--max-length."
            )

        if importlib.util.find_spec("sentence_transformers") is None:
            raise UserError(
                "--format sentence-transformers needs the sentence-transformers package; "
                "pip install 'extrapos[sentence-transformers]'."
            )
        from pathlib import Path

        from extrapos.integrations.hf import write_failure
        from extrapos.integrations.sentence_transformers import export_sentence_transformers

        try:
            out = export_sentence_transformers(
                args.run,
                args.out,
                pooling=args.pooling or "mean",
                max_length=args.max_length,
                normalize=args.normalize,
                step=args.step,
            )
        except Exception as e:  # a full disk or a file-size limit: name --out, not the removed temporary dir
            tmp = Path(args.out).parent / f".tmp-export-{Path(args.out).name}"
            reason = write_failure(e, tmp)
            if reason is None or (isinstance(e, OSError) and e.filename and str(tmp) not in str(e.filename)):
                raise  # not a write into the output (a run file that cannot be read names itself)
            raise UserError(
                f"cannot write {args.out} ({reason}); free some space or raise the file-size limit, then "
                "export again."
            ) from None
        print(
            f"exported {args.run} -> {out} (load it with "
            f"SentenceTransformer({str(out)!r}, trust_remote_code=True))"
        )
        push(args, out)
        return 0
    given = [f for f, v in (("--pooling", args.pooling), ("--max-length", args.max_length)) if v is not None]
    given += ["--normalize"] if args.normalize else []
    if given:
        raise UserError(
            f"{given[0]} applies to --format sentence-transformers only; drop it or add that format."
        )
    from extrapos.integrations.hf import export_pretrained

    remote = args.format == "remote-code"
    if args.format == "auto":
        remote = native_refusal(args.run) is not None
        if remote:
            print(
                f"no native Hugging Face architecture holds {args.run} ({native_refusal(args.run)}): "
                "exporting with remote code (--format hf refuses instead)"
            )
    out = export_pretrained(args.run, args.out, step=args.step, remote_code=remote, context=args.context)
    print(f"exported {args.run} -> {out}")
    if remote:
        print(
            f"  load it with AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True) "
            "(AutoModelForMaskedLM for an encoder); the folder carries its model code, so extrapos need not "
            "be installed where it loads"
        )
    limit = json.loads((out / "extrapos.json").read_text())["context"]
    print(f"  context limit {limit['limit']} tokens ({limit['why']}); README.md is its model card")
    push(args, out)
    return 0


def check_push(args: argparse.Namespace) -> None:
    """--private and --commit-message need --push-to-hub; its repository id is checked before the export."""
    from extrapos.errors import UserError

    if args.push_to_hub is None:
        given = [f for f, v in (("--private", args.private), ("--commit-message", args.commit_message)) if v]
        if given:
            raise UserError(f"{given[0]} applies to --push-to-hub only; drop it or add --push-to-hub REPO.")
        return
    from extrapos.integrations.hf.hub import check_repo_id

    check_repo_id(args.push_to_hub)


def push(args: argparse.Namespace, out: str | Path) -> None:
    if args.push_to_hub is None:
        return
    from extrapos.integrations.hf.hub import push_folder

    url = push_folder(out, args.push_to_hub, private=args.private, commit_message=args.commit_message)
    print(f"pushed {out} -> {args.push_to_hub} ({url})")


def native_refusal(run_dir: str) -> str | None:
    """Why no native Hugging Face architecture holds the run (its first clause), or None when one does; a
    run that cannot be read at all is left to the export itself to refuse."""
    from pathlib import Path

    from extrapos.errors import UserError
    from extrapos.integrations.hf.exporter import export_architecture
    from extrapos.run.config import load_run_config

    try:
        cfg = load_run_config(Path(run_dir))
    except UserError:
        return None
    try:
        export_architecture(cfg.model)
    except UserError as e:
        return str(e).split(";")[0]
    return None
