"""The model card (README.md) an export writes into the folder: what a person handed the folder needs to
know and to run, without the run directory beside it.

It names the encoding and its options, the training length and what the folder's context limit is and
why (context_limit.py), the data and budget the model was trained on (or the checkpoint it was
imported from, or the run it extends), the run's loss evaluations of this checkpoint with their 95%
intervals over held-out documents, and how to load it (transformers, lm-eval's ``hf`` backend, the
Python route of extrapos). Nothing in it is a path of the machine that exported it: a path the run
records (its data, a local corpus or tokenizer file, its parent) is written as its last component.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from extrapos.run.handle import LoadedRun


def _named(spec: Any) -> str:
    """A corpus or tokenizer spec as the card may print it: a path becomes its last component."""
    text = str(spec)
    if "/" in text or "\\" in text:
        if text.startswith("hf:") or (text.count("/") == 1 and not text.startswith((".", "/", "~"))):
            return text  # a hub dataset or model name (owner/name), not a local path
        return f"a local file or directory named {Path(text).name!r}"
    return text


def _training(run: LoadedRun) -> list[str]:
    """Lines saying what the weights were trained on (or imported from, or extended from)."""
    path, cfg = run.path, run.cfg
    source = path / "source.json"
    if source.is_file():
        record = json.loads(source.read_text())
        where = record.get("source", "a Hugging Face checkpoint")
        origin = where if record.get("hub") else _named(where)
        arch = record.get("architecture", "?")
        return [
            f"- **Weights**: imported from {origin} ({arch}) with `extrapos import`; L_t is its "
            f"{record.get('context_key', 'context length')} ({record.get('train_length')})."
        ]
    lines = []
    manifest = _manifest(run)
    corpus = manifest.get("corpus", cfg.data.corpus)
    tokenizer = (manifest.get("tokenizer") or {}).get("spec", cfg.data.tokenizer)
    lines.append(
        f"- **Data**: corpus {_named(corpus)}, tokenizer {_named(tokenizer)} ({run.tokenizer.vocab_size} "
        "tokens)" + (", documents packed into rows" if cfg.data.packed else "") + "."
    )
    tokens = _tokens_at(path, run.step)
    budget = f"{run.step} steps" + (f", {tokens:,} tokens" if tokens else "")
    lines.append(f"- **Training**: {budget} at {cfg.model.train_length} tokens per example.")
    parent = path / "parent.json"
    if parent.is_file():
        record = json.loads(parent.read_text())
        alpha = f", alpha {record['alpha']}" if record.get("alpha") is not None else ""
        parent_name = Path(str(record.get("parent", "?"))).name
        lines.append(
            f"- **Extended** from run {parent_name!r} (step {record.get('step')}) "
            f"with `extrapos extend --method {record.get('method')}` x{record.get('factor')}{alpha}: L_t "
            f"{record.get('train_length')} -> L_e {record.get('extended_length')}."
        )
    return lines


def _manifest(run: LoadedRun) -> dict[str, Any]:
    """The prepared data's manifest (corpus and tokenizer as prepared), or {} when the data is gone."""
    try:
        directory = run.data_dir
        return json.loads((directory / "manifest.json").read_text()) if directory is not None else {}
    except (OSError, ValueError):
        return {}


def _tokens_at(path: Path, step: int) -> int | None:
    """The tokens trained by checkpoint ``step`` (metrics.jsonl's last count at or before it)."""
    tokens = None
    try:
        with (path / "metrics.jsonl").open() as lines:
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row.get("tokens"), int) and row.get("step", step + 1) <= step:
                    tokens = row["tokens"]
    except OSError:
        return None
    return tokens


def _evaluation(evaluated: list[dict[str, Any]], train_length: int) -> list[str]:
    """One table per loss evaluation: each length's loss, perplexity and 95% interval."""
    from extrapos.report.stats import length_interval, protocol_name

    if not evaluated:
        return [
            "This checkpoint has no loss evaluation in its run (`extrapos eval RUN` before exporting puts "
            "one here)."
        ]
    lines = [
        "Loss on held-out text by input length (`extrapos eval`), of this checkpoint. The "
        "interval is a 95% percentile bootstrap over the held-out documents: it covers the choice of "
        "documents for this one trained model, not training noise (seeds)."
    ]
    for result in evaluated:
        objective = "masked-LM loss" if result.get("objective") == "mlm" else "loss"
        lines += [
            "",
            f"**{result['file']}**: split {result.get('split', '?')}, {protocol_name(result)}, "
            f"{result.get('target_tokens', '?')} target tokens per length from "
            f"{result.get('documents_used', '?')} documents.",
            "",
            f"| length (tokens) | x L_t | {objective} | perplexity | 95% interval |",
            "|---:|---:|---:|---:|---|",
        ]
        for row in result["results"]:
            _, interval = length_interval(result, row.get("ev"))
            lines.append(
                f"| {row['window']} | {row['window'] / train_length:g} | {row['loss']:.4f} | "
                f"{row.get('ppl', float('nan')):.2f} | {interval} |"
            )
    return lines


def _loading(name: str, remote: bool, causal: bool) -> list[str]:
    trust = ", trust_remote_code=True" if remote else ""
    auto = "AutoModelForCausalLM" if causal else "AutoModelForMaskedLM"
    lines = [
        "```python",
        f"from transformers import {auto}, AutoTokenizer",
        "",
        f'model = {auto}.from_pretrained("{name}"{trust})',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}"{", trust_remote_code=False" if remote else ""})',
    ]
    if causal:
        lines += [
            'inputs = tokenizer("Fellow citizens", return_tensors="pt")',
            "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))",
        ]
    lines.append("```")
    if remote:
        lines += [
            "",
            "The folder's model code is extrapos' own, copied into it when it was exported (the "
            "`extrapos_*.py` files; `extrapos_provenance.py` names the extrapos version and commit): it "
            "loads with torch and transformers alone, no extrapos installed. With `import extrapos` done "
            "first, the folder loads without `trust_remote_code`, built by the installed library. The "
            "tokenizer is a standard fast tokenizer and runs no code (`trust_remote_code=False` only keeps "
            "transformers from asking about the model's code while it reads config.json).",
        ]
    if causal:
        args = f"pretrained={name}" + (",trust_remote_code=True" if remote else "")
        lines += [
            "",
            "lm-evaluation-harness (its `hf` backend reads the context limit above as the model's window):",
            "",
            "```bash",
            f"lm_eval --model hf --model_args {args} --device cpu --tasks arc_easy",
            "```",
        ]
    return lines


def model_card(
    run: LoadedRun,
    *,
    name: str,
    remote: bool,
    architecture: str | None,
    context: int,
    context_why: str,
    trained: int,
    evaluated: list[dict[str, Any]],
) -> str:
    """README.md of a folder exported from ``run`` (a LoadedRun) as ``name`` (the folder's own name).
    ``architecture``: the native model_type, or None for remote code; ``trained``: L_t or L_e."""
    from extrapos import __version__

    cfg = run.cfg.model
    plan = cfg.positions_plan()
    positions = json.dumps(cfg.positions, sort_keys=True)
    causal = cfg.causal
    kind = "causal language model" if causal else "masked-language-model encoder"
    params = sum(p.numel() for p in {id(p): p for p in run.model.parameters()}.values())
    origin = "imported into" if (run.path / "source.json").is_file() else "trained with"
    key = "`max_position_embeddings`" if not architecture else "context length"
    form = (
        f"a native `{architecture}` model (no remote code)"
        if architecture
        else "extrapos' own model classes (remote code)"
    )
    header = [
        "---",
        "library_name: transformers",
        "tags:",
        "- extrapos",
        "- length-extrapolation",
        f"- {plan.name}",
        "---",
        "",
        f"# {name}",
        "",
        f"A {kind} {origin} extrapos (positional encodings for length extrapolation: train short, test "
        f"long), exported as {form}.",
        "",
        f"- **Positional encoding**: `{plan.name}` (`{positions}`).",
        f"- **Model**: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads "
        f"({cfg.flavour} block), {params:,} parameters.",
        f"- **Training length L_t**: {cfg.train_length} tokens (config.json's `train_length`).",
        f"- **Context limit**: {context} tokens (config.json's {key} and the tokenizer's "
        f"`model_max_length`): {context_why}."
        + (f" The model was trained at up to {trained} tokens." if trained != cfg.train_length else ""),
        *_training(run),
        f"- **Checkpoint**: step {run.step}, exported by extrapos {__version__}.",
        "",
        "## Evaluation",
        "",
        *_evaluation(evaluated, cfg.train_length),
        "",
        "## How to load",
        "",
        *_loading(name, remote, causal),
    ]
    return "\n".join(header) + "\n"
