"""extrapos run -> Hugging Face directory: the pipeline every architecture shares.

The run's encoding picks the adapter (learned -> GPT-2, rope -> Llama, Qwen2 or GPT-NeoX, alibi ->
Bloom; registry.py), which writes config.json and names the weights through the same map the import
reads; anything no adapter can hold is refused with the reason before any weight is loaded.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from extrapos import __version__
from extrapos.errors import UserError
from extrapos.files import fresh_output_dir
from extrapos.integrations.hf.context_limit import evaluations, supported_context
from extrapos.integrations.hf.failures import write_failure
from extrapos.integrations.hf.model_card import model_card
from extrapos.integrations.hf.registry import adapter_for, adapters, exporting_adapter
from extrapos.integrations.hf.special_tokens import SpecialTokens
from extrapos.integrations.hf.special_tokens import of_run as special_tokens_of

if TYPE_CHECKING:
    from extrapos.model import Decoder, ModelConfig
    from extrapos.run.config import RunConfig

# what every refusal of a native export offers instead (integrations/hf_remote/)
REMOTE_CODE_HINT = (
    "export it with --format remote-code, which any run exports to (loaded with trust_remote_code=True, "
    "or after import extrapos)."
)


def export_architecture(cfg: ModelConfig) -> str:
    """The Hugging Face model_type a run's ModelConfig exports to, or a UserError saying why none fits."""
    if cfg.flavour == "encoder":
        raise UserError(
            "an encoder run has no Hugging Face causal-LM architecture; export it with --format "
            "sentence-transformers, or with --format remote-code (AutoModel, AutoModelForMaskedLM)."
        )
    plan = cfg.positions_plan()
    name = plan.name
    if plan.layers is not None:
        raise UserError(
            "a layer schedule (model.positions.layers) has no Hugging Face architecture export "
            f"covers; {REMOTE_CODE_HINT}"
        )
    adapter = exporting_adapter(cfg)
    if adapter is None:
        covered: dict[str, list[str]] = {}
        for a in adapters():
            if a.exports:
                covered.setdefault(a.exports, []).append(a.label)
        raise UserError(
            f"positional encoding {name!r} has no Hugging Face architecture; export covers "
            + ", ".join(f"{enc} ({', '.join(labels)})" for enc, labels in covered.items())
            + f"; {REMOTE_CODE_HINT}"
        )
    adapter.check_export(cfg)
    return adapter.model_type


def export_context(run_cfg: RunConfig) -> int:
    """The context length an export records: L_t, or L_e for a run extended to longer windows."""
    return max(run_cfg.model.train_length, run_cfg.data.extended_length or 0)


def hf_config_for(
    cfg: ModelConfig,
    eot_id: int | None = None,
    context: int | None = None,
    special: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The config.json of an exported run (written in the pre-5.0 key names, which 5.x also reads);
    ``context``: the context length it records (default L_t); ``special``: the ``bos_token_id`` /
    ``eos_token_id`` / ``pad_token_id`` (special_tokens.py; default end of text as begin and end)."""
    adapter = adapter_for(export_architecture(cfg))
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        **(special if special is not None else {"bos_token_id": eot_id, "eos_token_id": eot_id}),
    }
    return adapter.config_for(cfg, common, context or cfg.train_length)


def hf_state_dict(model: Decoder, arch: str) -> dict[str, Tensor]:
    """The exported weights under Hugging Face names (absent biases written as zeros): the adapter's
    weight map read backwards."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return adapter_for(arch).weights.export(state, model.cfg)


def tokenizer_config(special: SpecialTokens, context: int) -> dict[str, Any]:
    """tokenizer_config.json: a standard fast tokenizer (tokenizer.json read by transformers' own class,
    no code of the folder's), its special tokens and the context limit."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{k: v for k, v in special.tokenizer_fields().items() if v is not None},
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,  # decode gives the text back as the run's tokenizer does
    }


def export_pretrained(
    run_dir: str | Path,
    out: str | Path,
    *,
    step: int | None = None,
    remote_code: bool = False,
    context: int | None = None,
) -> Path:
    """Write ``out``: config.json, model.safetensors, the run's tokenizer, a model card (README.md) and
    extrapos.json (the run's name, step and encoding, and the extrapos version and commit), for
    transformers.

    ``step`` picks a checkpoint (default: the latest). UserError when the run's encoding or block has
    no Hugging Face architecture (see ``export_architecture``), unless ``remote_code``: then any run is
    written with extrapos' own model classes (integrations/hf_remote/), whose context limit is
    ``context`` or what the run was evaluated at (context_limit.py). ``out`` is written atomically.
    """
    from safetensors.torch import save_file

    from extrapos.run.config import load_run_config
    from extrapos.run.directory import load_run

    out = Path(out)
    run_cfg = load_run_config(Path(run_dir))  # every refusal before any weights are loaded
    if not remote_code:
        arch = export_architecture(run_cfg.model)
        if context is not None:
            raise UserError(
                "--context sets the context limit of a remote-code export (a native config.json's length "
                "is what its architecture reads: GPT-2's table, RoPE's scaling); export with --format "
                "remote-code, or give lm-eval max_length=N."
            )
    elif context is not None:
        supported_context(run_cfg.model, export_context(run_cfg), [], context)
    run = load_run(run_dir, step=step)
    tmp = fresh_output_dir(out, "export")
    try:
        tokenizer: Any = run.tokenizer  # any of data/tokenizer.py's kinds: all decode
        special = special_tokens_of(run.path, tokenizer)
        trained = export_context(run.cfg)
        evaluated = evaluations(run.path, run.step)
        from extrapos.integrations.hf_remote.vendor import source_commit

        if remote_code:
            from extrapos.integrations.hf_remote.export import write_remote_model

            limit, why = supported_context(run.cfg.model, trained, evaluated, context)
            write_remote_model(run.model, tmp, limit, special=special.config_fields(), train_length=trained)
        else:
            limit, why = trained, "the training length, which a native architecture's config records"
            config = hf_config_for(run.cfg.model, context=trained, special=special.config_fields())
            config["train_length"] = trained
            (tmp / "config.json").write_text(json.dumps(config, indent=1))
            save_file(
                hf_state_dict(run.model, arch), str(tmp / "model.safetensors"), metadata={"format": "pt"}
            )
        for name in ("tokenizer.json", "tokenizer.model"):
            if (run.path / name).is_file():
                shutil.copyfile(run.path / name, tmp / name)
        if (run.path / "tokenizer.json").is_file():
            (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(special, limit), indent=1))
        (tmp / "README.md").write_text(
            model_card(
                run,
                name=out.name,
                remote=remote_code,
                architecture=None if remote_code else arch,
                context=limit,
                context_why=why,
                trained=trained,
                evaluated=evaluated,
            )
        )
        # provenance by name: the run's absolute path would name the exporting machine in a shared folder
        (tmp / "extrapos.json").write_text(
            json.dumps(
                {
                    "run": Path(run_dir).resolve().name,
                    "step": run.step,
                    "positions": run.cfg.model.positions,
                    "extrapos_version": __version__,
                    "extrapos_commit": source_commit(),
                    "context": {"limit": limit, "why": why, "train_length": trained},
                },
                indent=1,
            )
        )
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = write_failure(e, tmp)
        if reason is not None:  # one sentence naming out, never the temporary directory just removed
            raise UserError(
                f"cannot write {out} ({reason}); free some space or raise the file-size limit, then "
                "export again."
            ) from None
        raise
    return out
