"""An encoder run as a sentence-transformers model: ``ExtraposEncoder`` (tokenizer + extrapos encoder), then
sentence-transformers' own ``Pooling`` (mean or [CLS]) and, optionally, ``Normalize``.

``export_sentence_transformers(RUN, DIR)`` (``extrapos export RUN --format sentence-transformers --out
DIR``) writes a directory ``SentenceTransformer(DIR, trust_remote_code=True)`` loads: ``modules.json``
lists this module by its import path (``extrapos.integrations.sentence_transformers.ExtraposEncoder``),
so any encoding extrapos has (CABLE, ExPE, ALiBi, learned, ...) is exported as it runs here, not
translated to a Hugging Face architecture. Since sentence-transformers 6, a module class outside its
own package is imported only with ``trust_remote_code=True``; here that code is the installed
extrapos package (nothing is downloaded or run from the directory). The directory holds:

- ``modules.json``, ``config_sentence_transformers.json``, ``README.md``: sentence-transformers' files
- ``extrapos_encoder.json``: the model config, the maximum text length, [CLS]/[SEP] wrapping
- ``model.safetensors``: the encoder's weights (tied weights stored once), ``tokenizer.json`` (or the
  run's other tokenizer file): the run's tokenizer, with [CLS], [SEP], [MASK], [PAD]
- ``1_Pooling/`` (and ``2_Normalize/``): sentence-transformers' modules
- ``extrapos.json``: the run and checkpoint step it came from

Embeddings equal ``extrapos.inference.embeddings.embed_texts`` on the run: both tokenize with ``text_ids`` and
compute hidden states with ``token_states`` (texts grouped by length, never padded, so a batch's
padding never changes a text's embedding); ``Pooling`` then averages over the attention mask, which
covers exactly the text's tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from sentence_transformers.base.modules import InputModule
from torch import Tensor

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.tokenizer import Tokenizer
    from extrapos.model import Decoder

CONFIG_FILE = "extrapos_encoder.json"
WEIGHTS_FILE = "model.safetensors"


class ExtraposEncoder(InputModule):
    """Texts -> token embeddings of an extrapos encoder (``features["token_embeddings"]``, padded with
    zeros to the longest text, and ``features["attention_mask"]``) for a following ``Pooling``."""

    config_file_name = CONFIG_FILE
    config_keys = ["max_seq_length", "wrap"]
    save_in_root = True
    model: Decoder
    # sentence-transformers declares a Hugging Face tokenizer here; this module's is extrapos's own, which
    # only its preprocess and save use
    tokenizer: Tokenizer  # type: ignore[assignment]

    def __init__(
        self, model: Decoder, tokenizer: Tokenizer, max_seq_length: int | None = None, wrap: bool = True
    ):
        from extrapos.data.mlm import encoder_special_tokens
        from extrapos.inference.embeddings import check_max_length

        super().__init__()
        if model.cfg.causal:
            raise UserError("ExtraposEncoder needs an encoder (model.flavour encoder), not a decoder.")
        self.model = model
        self.tokenizer = tokenizer
        self.source: dict[str, Any] | None = None  # the run and step it came from (from_run)
        self.specials = encoder_special_tokens(tokenizer)
        self.wrap = bool(wrap)
        self.max_seq_length = check_max_length(
            model.cfg.train_length if max_seq_length is None else max_seq_length, self.wrap
        )

    @classmethod
    def from_run(
        cls, run_dir: str | Path, max_seq_length: int | None = None, step: int | None = None
    ) -> ExtraposEncoder:
        """The module of an encoder run's checkpoint (the latest, or ``step``); the run's tokenizer."""
        from extrapos.inference.embeddings import encoder_run_dir
        from extrapos.run.directory import load_run

        run = load_run(encoder_run_dir(run_dir), step=step)
        module = cls(run.model, run.tokenizer, max_seq_length)
        # the run by name: its absolute path would name the exporting machine in every shared copy
        module.source = {"run": Path(run_dir).resolve().name, "step": run.step}
        return module

    # ---- sentence-transformers' interface ------------------------------------------------------
    def preprocess(
        self, inputs: Sequence[Any], prompt: str | None = None, **kwargs: Any
    ) -> dict[str, Tensor]:
        from extrapos.inference.embeddings import text_ids

        texts = [x for x in inputs if isinstance(x, str)]
        if len(texts) != len(inputs):
            raise ValueError("ExtraposEncoder embeds texts (strings) only, not pairs or other inputs.")
        if prompt:
            texts = self._prepend_prompt(texts, prompt)
        ids = text_ids(self.tokenizer, texts, self.max_seq_length, self.specials, self.wrap)
        longest = max((len(x) for x in ids), default=0)
        input_ids = torch.full((len(ids), longest), self.specials.pad, dtype=torch.long)
        mask = torch.zeros((len(ids), longest), dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[i, : len(x)] = 1
        return {"input_ids": input_ids, "attention_mask": mask}

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        from extrapos.inference.embeddings import token_states

        ids, mask = features["input_ids"], features["attention_mask"].bool()
        where = [row.nonzero().squeeze(1) for row in mask]
        states = token_states(self.model, [ids[b, w].tolist() for b, w in enumerate(where)], len(where))
        T, d = ids.shape[1], self.model.cfg.d_model
        features["token_embeddings"] = torch.stack(
            [s.new_zeros(T, d).index_copy(0, w.to(s.device), s) for s, w in zip(states, where)]
        )
        return features

    def __repr__(self) -> str:
        m = self.model.cfg
        return (
            f"ExtraposEncoder(encoding={m.positions_plan().name}, layers={m.n_layers}, d_model={m.d_model}, "
            f"L_t={m.train_length}, max_seq_length={self.max_seq_length}, wrap={self.wrap})"
        )

    def get_word_embedding_dimension(self) -> int:
        return self.model.cfg.d_model

    def get_embedding_dimension(self) -> int:
        return self.model.cfg.d_model

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "max_seq_length": self.max_seq_length,
            "wrap": self.wrap,
            "model": dataclasses.asdict(self.model.cfg),
            "tokenizer_files": _tokenizer_files(self.tokenizer),
            "source": getattr(self, "source", None),
        }

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        from safetensors.torch import save_model

        out = Path(output_path)
        save_model(self.model, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
        self.tokenizer.save(out)
        (out / CONFIG_FILE).write_text(json.dumps(self.get_config_dict(), indent=1))

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        init_defaults: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ExtraposEncoder:
        from safetensors.torch import load_model

        from extrapos.data import load_tokenizer
        from extrapos.model import Decoder, ModelConfig
        from extrapos.run.config import build_section

        hub: dict[str, Any] = {
            "subfolder": subfolder,
            "token": token,
            "cache_folder": cache_folder,
            "revision": revision,
            "local_files_only": local_files_only,
        }
        config = cls.load_config(model_name_or_path, **hub)
        if "model" not in config:
            raise ValueError(f"{model_name_or_path} has no {CONFIG_FILE}; it is not an extrapos export.")

        def file(name: str) -> str:
            found = cls.load_file_path(model_name_or_path, filename=name, **hub)
            if found is None:
                raise ValueError(f"{model_name_or_path} has no {name}; export the encoder run again.")
            return found

        files = [file(f) for f in config["tokenizer_files"]]
        model = Decoder(build_section(ModelConfig, dict(config["model"]), "model"))
        load_model(model, file(WEIGHTS_FILE))
        module = cls(
            model.eval(), load_tokenizer(Path(files[0]).parent), config["max_seq_length"], config["wrap"]
        )
        module.source = config.get("source")
        return module


def _tokenizer_files(tokenizer: Tokenizer) -> list[str]:
    """The file names ``tokenizer.save`` writes (the first is the one ``load_tokenizer`` reads)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main = tokenizer.save(tmp)
        return [main.name] + sorted(p.name for p in Path(tmp).iterdir() if p.name != main.name)


def export_sentence_transformers(
    run_dir: str | Path,
    out: str | Path,
    *,
    pooling: str = "mean",
    max_length: int | None = None,
    normalize: bool = False,
    step: int | None = None,
) -> Path:
    """Write ``out``, a sentence-transformers model of an encoder run (module docstring); returns ``out``.

    ``pooling``: mean or cls; ``max_length``: tokens per text with [CLS] and [SEP] (default L_t; the
    loaded model's ``max_seq_length`` changes it); ``normalize``: L2-normalised embeddings. ``out`` is
    built in a temporary directory and renamed into place, so it appears whole or not at all.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    from extrapos.files import fresh_output_dir
    from extrapos.inference.embeddings import check_max_length, check_pooling, encoder_run_dir

    out = Path(out)
    check_pooling(pooling)
    if max_length is not None:
        check_max_length(max_length)
    encoder_run_dir(run_dir)  # a decoder is refused before any weights are read
    if out.exists():
        raise UserError(f"{out} already exists; choose another output directory or remove it first.")
    encoder = ExtraposEncoder.from_run(run_dir, max_length, step)
    modules = [encoder, Pooling(encoder.get_embedding_dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    tmp = fresh_output_dir(out, "export")
    try:
        model.save(str(tmp))
        assert encoder.source is not None  # from_run records the run and step
        (tmp / "extrapos.json").write_text(
            json.dumps({**encoder.source, "positions": encoder.model.cfg.positions}, indent=1)
        )
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
