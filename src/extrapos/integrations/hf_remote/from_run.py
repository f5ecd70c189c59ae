"""A run directory as a Hugging Face model and tokenizer, in this process, with no export: the Python
route for code written against transformers (``input_ids`` and ``attention_mask`` in; logits, a loss
and a cache out; ``generate``; lm-eval's ``HFLM(pretrained=model, tokenizer=tokenizer)``).

The library's own call is ``model(tokens, positions)`` (``extrapos.run.directory.load_run``); this wraps
the same weights, unchanged and not copied, in the classes an exported folder loads into (modeling.py),
with the config an export writes: the context limit, the training length and the special tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def model_from_run(run: str | Path, step: int | None = None, device: str = "cpu") -> Any:
    """``ExtraposForCausalLM`` (a decoder run) or ``ExtraposForMaskedLM`` (an encoder) holding the run's
    weights at ``step`` (default: the latest), in eval mode on ``device``."""
    from extrapos.integrations.hf.context_limit import evaluations, supported_context
    from extrapos.integrations.hf.exporter import export_context
    from extrapos.integrations.hf.special_tokens import of_run
    from extrapos.integrations.hf_remote.export import remote_config
    from extrapos.integrations.hf_remote.modeling import ExtraposForCausalLM, ExtraposForMaskedLM
    from extrapos.run.directory import load_run

    loaded = load_run(run, device=device, step=step)
    trained = export_context(loaded.cfg)
    context, _ = supported_context(loaded.cfg.model, trained, evaluations(loaded.path, loaded.step), None)
    special = of_run(loaded.path, loaded.tokenizer).config_fields()
    config = remote_config(loaded.cfg.model, context, special=special, train_length=trained)
    cls = ExtraposForCausalLM if loaded.cfg.model.causal else ExtraposForMaskedLM
    return cls(config, decoder=loaded.model).eval()


def tokenizer_from_run(run: str | Path) -> Any:
    """The run's tokenizer as transformers' ``PreTrainedTokenizerFast``, with its special tokens (end of
    text also pads a trained run's batches) and the context limit: what an export's tokenizer loads as.
    A run whose tokenizer is not a tokenizer.json (sentencepiece, tiktoken) has none: use the run's own
    (``load_run(RUN).tokenizer``)."""
    from transformers import PreTrainedTokenizerFast

    from extrapos.errors import UserError
    from extrapos.integrations.hf.context_limit import evaluations, supported_context
    from extrapos.integrations.hf.exporter import export_context, tokenizer_config
    from extrapos.integrations.hf.special_tokens import of_run
    from extrapos.run.handle import Run

    opened = Run.open(run)
    file = opened.path / "tokenizer.json"
    if not file.is_file():
        raise UserError(
            f"{opened.path} has no tokenizer.json, so transformers cannot load its tokenizer; encode with "
            "extrapos' own (load_run(RUN).tokenizer)."
        )
    step = opened.checkpoint()[0].step
    trained = export_context(opened.cfg)
    context, _ = supported_context(opened.cfg.model, trained, evaluations(opened.path, step), None)
    settings = tokenizer_config(of_run(opened.path, opened.tokenizer), context)
    settings.pop("tokenizer_class")
    return PreTrainedTokenizerFast(tokenizer_file=str(file), **settings)
