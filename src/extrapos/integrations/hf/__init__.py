"""Hugging Face checkpoints in and out of extrapos runs.

``import_pretrained(SOURCE, RUN)`` turns a Hugging Face causal LM (a local directory with
``config.json``, safetensors weights and tokenizer files, or a hub name) into an ordinary run
directory: ``config.toml``, the model's own tokenizer, ``checkpoints/step-0/`` and ``source.json``
(architecture, where it came from, its context limit). ``load_run``, eval, extend and generate
read it like any trained run. ``export_pretrained(RUN, DIR)`` writes the other direction: a
directory ``transformers.AutoModelForCausalLM.from_pretrained`` loads with the same logits.

Layout (docs/huggingface.md): one adapter per architecture family in ``architectures/`` (config in,
config out, one weight map read in both directions, what blocks an export), found by ``registry.py``
the way encodings are; the shared machinery beside it: ``source.py`` (local directory or hub,
config.json, shard list), ``config_checks.py`` (every key checked), ``rope.py`` (RoPE settings both
ways), ``weight_map.py``, ``shards.py`` (safetensors headers and streaming), ``tokenizer.py``,
``importer.py``, ``exporter.py`` and ``failures.py`` (failed writes told in the user's paths).
"""

from __future__ import annotations

from extrapos.integrations.hf.config_checks import MAX_CONTEXT, check_hf_config
from extrapos.integrations.hf.exporter import (
    export_architecture,
    export_context,
    export_pretrained,
    hf_config_for,
    hf_state_dict,
)
from extrapos.integrations.hf.failures import write_failure
from extrapos.integrations.hf.importer import (
    ImportedConfig,
    import_pretrained,
    load_hf_weights,
    model_options_from_hf,
)
from extrapos.integrations.hf.registry import adapter_for, adapters, model_types
from extrapos.integrations.hf.rope import rope_options_from_hf
from extrapos.integrations.hf.shards import check_shards, iter_hf_tensors, shard_header
from extrapos.integrations.hf.source import read_hf_config, resolve_source, weight_files

__all__ = [
    "MAX_CONTEXT",
    "ImportedConfig",
    "adapter_for",
    "adapters",
    "check_hf_config",
    "check_shards",
    "export_architecture",
    "export_context",
    "export_pretrained",
    "hf_config_for",
    "hf_state_dict",
    "import_pretrained",
    "iter_hf_tensors",
    "load_hf_weights",
    "model_options_from_hf",
    "model_types",
    "read_hf_config",
    "resolve_source",
    "rope_options_from_hf",
    "shard_header",
    "weight_files",
    "write_failure",
]
