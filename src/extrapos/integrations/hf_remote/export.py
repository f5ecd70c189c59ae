"""``write_remote_model``: the config.json, weights and Python files of an extrapos run as a Hugging Face
model folder that transformers loads through this package's classes (``extrapos export RUN --format
remote-code``; the rest of the folder, tokenizer, model card and provenance, is written by
``integrations/hf/exporter.py`` as for a native export)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from extrapos.integrations.hf_remote.configuration import ExtraposConfig


def remote_config(
    model_cfg: Any,
    context: int,
    eot_id: int | None = None,
    *,
    special: dict[str, Any] | None = None,
    train_length: int | None = None,
) -> ExtraposConfig:
    """The ExtraposConfig of a run: its whole ModelConfig, the context limit it is exported with, the
    length it was trained at (default the ModelConfig's L_t) and its special tokens (``special``: the
    ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of integrations/hf/special_tokens.py; default
    end of text as begin, end and padding)."""
    from extrapos import __version__

    tokens = (
        special
        if special is not None
        else dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), eot_id)
    )
    return ExtraposConfig(
        extrapos_model=dataclasses.asdict(model_cfg),
        max_position_embeddings=context,
        train_length=train_length if train_length is not None else model_cfg.train_length,
        extrapos_version=__version__,
        dtype="float32",
        **tokens,
    )


def write_remote_model(
    model: Any,
    directory: Path,
    context: int,
    eot_id: int | None = None,
    *,
    special: dict[str, Any] | None = None,
    train_length: int | None = None,
) -> None:
    """``model``: the run's Decoder (its weights are written as they are); ``context``: the context limit
    (integrations/hf/context_limit.py); ``train_length``: L_t, or L_e for an extended run."""
    from transformers.utils import logging as hf_logging

    from extrapos.integrations.hf_remote.modeling import ExtraposForCausalLM, ExtraposForMaskedLM

    config = remote_config(model.cfg, context, eot_id, special=special, train_length=train_length)
    cls = ExtraposForCausalLM if model.cfg.causal else ExtraposForMaskedLM
    # save_pretrained draws a "Writing model shards" bar on stderr (one shard here): an export says its one
    # line, and one that fails its one sentence and nothing before it (issue 48); the caller's setting back
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        cls(config, decoder=model).save_pretrained(directory)  # also writes the Python files (files.py)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
