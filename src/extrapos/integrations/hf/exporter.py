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
from typing import Any

from torch import Tensor

from extrapos.errors import UserError
from extrapos.files import fresh_output_dir
from extrapos.integrations.hf.failures import write_failure
from extrapos.integrations.hf.registry import adapter_for, adapters, exporting_adapter

# what every refusal of a native export offers instead (integrations/hf_remote/)
REMOTE_CODE_HINT = (
    "export it with --format remote-code, which any run exports to (loaded with trust_remote_code=True, "
    "or after import extrapos)."
)


def export_architecture(cfg) -> str:
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


def export_context(run_cfg) -> int:
    """The context length an export records: L_t, or L_e for a run extended to longer windows."""
    return max(run_cfg.model.train_length, run_cfg.data.extended_length or 0)


def hf_config_for(cfg, eot_id: int | None = None, context: int | None = None) -> dict[str, Any]:
    """The config.json of an exported run (written in the pre-5.0 key names, which 5.x also reads);
    ``context``: the context length it records (default L_t)."""
    adapter = adapter_for(export_architecture(cfg))
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }
    return adapter.config_for(cfg, common, context or cfg.train_length)


def hf_state_dict(model, arch: str) -> dict[str, Tensor]:
    """The exported weights under Hugging Face names (absent biases written as zeros): the adapter's
    weight map read backwards."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return adapter_for(arch).weights.export(state, model.cfg)


def export_pretrained(
    run_dir: str | Path, out: str | Path, *, step: int | None = None, remote_code: bool = False
) -> Path:
    """Write ``out``: config.json, model.safetensors and the run's tokenizer, for transformers.

    ``step`` picks a checkpoint (default: the latest). UserError when the run's encoding or block has
    no Hugging Face architecture (see ``export_architecture``), unless ``remote_code``: then any run is
    written with extrapos' own model classes (integrations/hf_remote/). ``out`` is written atomically.
    """
    from safetensors.torch import save_file

    from extrapos.run.config import load_run_config
    from extrapos.run.directory import load_run

    out = Path(out)
    if not remote_code:
        arch = export_architecture(load_run_config(Path(run_dir)).model)  # fail before loading any weights
    run = load_run(run_dir, step=step)
    tmp = fresh_output_dir(out, "export")
    try:
        tokenizer: Any = run.tokenizer  # any of data/tokenizer.py's kinds: all decode
        eot = getattr(tokenizer, "eot_id", None)
        context = export_context(run.cfg)
        if remote_code:
            from extrapos.integrations.hf_remote.export import write_remote_model

            write_remote_model(run.model, tmp, context, eot)
        else:
            config = hf_config_for(run.cfg.model, eot, context)
            (tmp / "config.json").write_text(json.dumps(config, indent=1))
            save_file(
                hf_state_dict(run.model, arch), str(tmp / "model.safetensors"), metadata={"format": "pt"}
            )
        for name in ("tokenizer.json", "tokenizer.model"):
            if (run.path / name).is_file():
                shutil.copyfile(run.path / name, tmp / name)
        if (run.path / "tokenizer.json").is_file():
            eot_token = tokenizer.decode([eot]) if eot is not None else None
            (tmp / "tokenizer_config.json").write_text(
                json.dumps(
                    {
                        "tokenizer_class": "PreTrainedTokenizerFast",
                        "eos_token": eot_token,
                        "model_max_length": context,
                    },
                    indent=1,
                )
            )
        (tmp / "extrapos.json").write_text(
            json.dumps(
                {"run": str(Path(run_dir).resolve()), "step": run.step, "positions": run.cfg.model.positions},
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
