"""The model classes of an exported folder: a ``PreTrainedModel`` holding the library's own ``Decoder``
(``.model``), so that every encoding and layer schedule runs exactly as it does in extrapos.

- ``ExtraposModel`` (``AutoModel``): the final hidden states, of a decoder or an encoder
- ``ExtraposForCausalLM`` (``AutoModelForCausalLM``): decoders; logits, loss, ``generate`` with the KV
  cache (cache.py)
- ``ExtraposForMaskedLM`` (``AutoModelForMaskedLM``): encoders; the MLM head's logits

Inputs as transformers passes them: ``input_ids``, an optional 0/1 ``attention_mask`` over the cached
and new tokens (padding: every run of 1s or 0s is kept apart as a document of a packed row is,
docs/packing.md, and positions count the real tokens from 0, so a left-padded prompt gets the logits
it has alone), optional ``position_ids``, the cache as ``cache`` (transformers 5.24) or
``past_key_values`` (earlier), ``logits_to_keep`` and ``output_hidden_states`` (the input of every
block, then the final normed states, as transformers' own decoders return them).

An exported folder holds a copy of this file as ``modeling_extrapos.py`` (vendor.py), which transformers
runs without extrapos installed; after ``import extrapos`` transformers builds the model from the
installed library's classes instead (registration.py), and loading a folder exported by another extrapos
version warns once (``check_version``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast, MaskedLMOutput
from transformers.modeling_utils import PreTrainedModel

from extrapos.integrations.hf_remote.cache import ExtraposCache
from extrapos.integrations.hf_remote.configuration import ExtraposConfig, model_config_of
from extrapos.model import Decoder

# the outputs' name for the cache: ``cache`` from transformers 5.24, which deprecates ``past_key_values``
CACHE_NAME = next(
    (f.name for f in dataclasses.fields(CausalLMOutputWithPast) if f.name in ("cache", "past_key_values")),
    "past_key_values",
)


def check_version(config: Any) -> None:
    """One warning when the folder was exported by another extrapos than the code building its model (the
    installed library, or a folder's copy of it whose config.json another version wrote)."""
    from extrapos import __version__

    exported = getattr(config, "extrapos_version", None)
    if exported is not None and exported != __version__:
        # this module runs as the library's or as an exported folder's copy (modeling_extrapos.py)
        code = (
            "the installed extrapos" if __name__.startswith("extrapos.") else "the folder's code of extrapos"
        )
        warnings.warn(
            f"this model was exported by extrapos {exported} and is built by {code} {__version__}; if its "
            f"outputs differ from the exporter's, install extrapos=={exported} or export the run again.",
            UserWarning,
            stacklevel=3,
        )


def padding_documents(mask: Tensor) -> Tensor:
    """(B, T) 0/1 mask -> document numbers that change at every switch between padding and tokens
    (0 0 1 1 1 -> 0 0 1 1 1, 1 1 1 0 0 -> 0 0 0 1 1): ascending, as the library's document mask needs."""
    switches = torch.zeros_like(mask)
    switches[:, 1:] = (mask[:, 1:] != mask[:, :-1]).to(mask.dtype)
    return switches.cumsum(1)


class ExtraposPreTrainedModel(PreTrainedModel):
    config_class = ExtraposConfig
    base_model_prefix = "extrapos"  # no submodule has this name: checkpoints load under their own names
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_attention_backend = False
    # the library ties the head to the embedding (ModelConfig.tie_embeddings, mirrored as tie_word_embeddings)
    _tied_weights_keys = {"model.lm_head.weight": "model.tok_emb.weight"}

    def __init__(self, config: ExtraposConfig, decoder: Decoder | None = None) -> None:
        super().__init__(config)
        cfg = model_config_of(config)  # built by this module tree (configuration.py)
        self.check_flavour(cfg)
        # ``decoder``: an existing model to wrap (export); otherwise the library builds one
        self.model = decoder if decoder is not None else Decoder(cfg)
        self.post_init()

    def check_flavour(self, cfg: Any) -> None:
        """Refuse a run this class does not fit (a decoder loaded as a masked LM, ...)."""

    def _init_weights(self, module: Any) -> None:
        """Nothing: the Decoder initialises itself when built; loading replaces every weight."""

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        model = super().from_pretrained(*args, **kwargs)
        model.restore_computed_buffers()
        check_version(model.config)
        return model

    @torch.no_grad()
    def restore_computed_buffers(self) -> None:
        """transformers builds the model on the meta device, then loads the saved weights; what an
        encoding computes when it is built (RoPE's frequencies as a plain tensor, ALiBi's slopes as an
        unsaved buffer, ...) is not saved, so the encoding is built again on the CPU, given the loaded
        weights and put where the model is."""
        from extrapos.positions.base import EncodingContext
        from extrapos.positions.schedule import build_positions

        cfg, weight = self.model.cfg, self.model.tok_emb.weight
        with torch.device("cpu"):
            fresh = build_positions(cfg.positions_plan(), EncodingContext.of(cfg))
        fresh.load_state_dict({k: v.to("cpu") for k, v in self.model.pos.state_dict().items()})
        self.model.pos = fresh.to(device=weight.device, dtype=weight.dtype)
        for name, module in self.named_modules():  # anything else still on the meta device would fail later
            for key, value in [*vars(module).items(), *module.named_buffers(recurse=False)]:
                if isinstance(value, Tensor) and value.is_meta:
                    raise RuntimeError(f"{name}.{key} was not loaded (still on the meta device).")

    def get_input_embeddings(self) -> Any:
        return self.model.tok_emb

    def set_input_embeddings(self, value: Any) -> None:
        self.model.tok_emb = value

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """transformers' save_pretrained, then the folder's Python files and auto_map (files.py), so a
        saved model loads as the exported one did, however it was loaded itself."""
        from extrapos.integrations.hf_remote.files import write_remote_code

        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(save_directory, self.model.cfg)

    def hidden(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        position_ids: Tensor | None,
        cache: ExtraposCache | None,
        inputs_embeds: Tensor | None,
        kwargs: dict[str, Any],
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """The final hidden states of the new tokens, and with ``output_hidden_states`` (the call's, else
        the config's) every block's input before them; ``cache`` (if any) gains the new tokens."""
        if inputs_embeds is not None:
            raise ValueError("extrapos models take input_ids, not inputs_embeds.")
        if input_ids is None:
            raise ValueError("extrapos models need input_ids.")
        if kwargs.get("output_attentions"):
            raise ValueError("extrapos models do not return attention weights; see `extrapos attention`.")
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        documents = None
        positions = torch.arange(past, past + T, device=input_ids.device).expand(B, T)
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            if attention_mask.dim() != 2 or attention_mask.shape[1] != past + T:
                raise ValueError(
                    f"attention_mask must be (batch, cached + new tokens) = ({B}, {past + T}) of 0 and 1, "
                    f"got {tuple(attention_mask.shape)}."
                )
            mask = attention_mask.long()
            documents = padding_documents(mask)[:, past:]
            positions = (mask.cumsum(1) - 1).clamp(min=0)[:, past:]
        if position_ids is not None:
            positions = position_ids.expand(B, T)
        args = (input_ids, positions, cache.cache if cache is not None else None, documents)
        wanted = kwargs.get("output_hidden_states")
        if not (wanted if wanted is not None else getattr(self.config, "output_hidden_states", False)):
            return self.model.hidden_states(*args), None
        # the library's model returns only the last states: each block's input is taken as it enters it
        inputs: list[Tensor] = []
        hooks = [
            block.register_forward_pre_hook(lambda _module, given: inputs.append(given[0]))
            for block in self.model.blocks
        ]
        try:
            h = self.model.hidden_states(*args)
        finally:
            for hook in hooks:
                hook.remove()
        return h, (*inputs, h)


def _cache_of(cache: ExtraposCache | None, past_key_values: Any) -> ExtraposCache | None:
    given = cache if cache is not None else past_key_values
    if given is not None and not isinstance(given, ExtraposCache):
        raise ValueError(
            f"extrapos models keep their own KV cache (ExtraposCache), not {type(given).__name__}; leave "
            "cache unset and pass the one a previous call returned."
        )
    return given


class ExtraposModel(ExtraposPreTrainedModel):
    """Final hidden states (``last_hidden_state``) of any extrapos run, decoder or encoder."""

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: ExtraposCache | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        cache = _cache_of(cache, past_key_values)
        if use_cache and cache is None and self.model.cfg.causal:
            cache = ExtraposCache(self.model.new_cache)
        h, states = self.hidden(input_ids, attention_mask, position_ids, cache, inputs_embeds, kwargs)
        cached: dict[str, Any] = {CACHE_NAME: cache}
        return BaseModelOutputWithPast(last_hidden_state=h, hidden_states=states, **cached)


class ExtraposForCausalLM(ExtraposPreTrainedModel, GenerationMixin):
    """A decoder run: next-token logits, the shifted cross-entropy with ``labels``, and ``generate``."""

    def check_flavour(self, cfg: Any) -> None:
        if not cfg.causal:
            raise ValueError(
                "this is an extrapos encoder (masked LM); load it with AutoModelForMaskedLM or AutoModel."
            )

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own ExtraposCache on the first call with use_cache

    def get_output_embeddings(self) -> Any:
        return self.model.lm_head

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: ExtraposCache | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        labels: Tensor | None = None,
        logits_to_keep: int | Tensor = 0,
        inputs_embeds: Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        cache = _cache_of(cache, past_key_values)
        if cache is None and use_cache and labels is None:  # generate passes use_cache=True
            cache = ExtraposCache(self.model.new_cache)
        h, states = self.hidden(input_ids, attention_mask, position_ids, cache, inputs_embeds, kwargs)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.model.logits(h[:, keep])
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(),
                labels[:, 1:].flatten().to(logits.device),
                ignore_index=-100,
            )
        cached: dict[str, Any] = {CACHE_NAME: cache}
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=states, **cached)


class ExtraposForMaskedLM(ExtraposPreTrainedModel):
    """An encoder run: the MLM head's logits at every position, the cross-entropy with ``labels``
    (-100: not scored)."""

    def check_flavour(self, cfg: Any) -> None:
        if cfg.causal:
            raise ValueError("this is an extrapos decoder; load it with AutoModelForCausalLM or AutoModel.")

    def get_output_embeddings(self) -> Any:
        return self.model.lm_head

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        h, states = self.hidden(input_ids, attention_mask, position_ids, None, inputs_embeds, kwargs)
        logits = self.model.logits(h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten().to(logits.device), ignore_index=-100
            )
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=states)
