"""``write_remote_model``: the config.json, weights and Python files of an extrapos run as a Hugging Face
model folder that transformers loads through this package's classes (``extrapos export RUN --format
remote-code``; the rest of the folder, tokenizer and provenance, is written by
``integrations/hf/exporter.py`` as for a native export)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from extrapos.integrations.hf_remote.configuration import ExtraposConfig


def remote_config(model_cfg, context: int, eot_id: int | None) -> ExtraposConfig:
    """The ExtraposConfig of a run: its whole ModelConfig, its context length, end of text as bos / eos."""
    from extrapos import __version__

    return ExtraposConfig(
        extrapos_model=dataclasses.asdict(model_cfg),
        max_position_embeddings=context,
        extrapos_version=__version__,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        dtype="float32",
    )


def write_remote_model(model, directory: Path, context: int, eot_id: int | None) -> None:
    """``model``: the run's Decoder (its weights are written as they are); ``context``: L_t, or L_e for
    an extended run."""
    from extrapos.integrations.hf_remote.modeling import ExtraposForCausalLM, ExtraposForMaskedLM

    config = remote_config(model.cfg, context, eot_id)
    cls = ExtraposForCausalLM if model.cfg.causal else ExtraposForMaskedLM
    cls(config, decoder=model).save_pretrained(directory)  # also writes the Python files (files.py)
