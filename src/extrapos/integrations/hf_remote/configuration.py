"""``ExtraposConfig``: an extrapos ModelConfig as a Hugging Face ``PreTrainedConfig``.

The run's ModelConfig is kept whole under ``extrapos_model`` (what the library builds the model from);
the keys other tools read from any config (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``max_position_embeddings``) are derived from it,
written for them and never read back. Imports only ``transformers.configuration_utils``, which is
loaded before transformers' AutoConfig (registration.py registers this class while that loads).
"""

from __future__ import annotations

from typing import Any

from transformers.configuration_utils import PreTrainedConfig

MODEL_TYPE = "extrapos"
# derived from extrapos_model (to_dict writes them for other tools); a loaded config.json's copies are dropped
DERIVED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")


class ExtraposConfig(PreTrainedConfig):
    """``extrapos_model``: the ModelConfig as a dict (``dataclasses.asdict``); ``max_position_embeddings``:
    the longest input the model is meant to take, which tools read as its window (lm-eval cuts contexts
    there): for an extrapolating run more than it was trained at (integrations/hf/context_limit.py);
    ``train_length``: the length it was trained at (L_t, or L_e for an extended run); ``extrapos_version``:
    the library version that exported it (loading with another one warns, modeling.py)."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        extrapos_model: dict[str, Any] | None = None,
        max_position_embeddings: int | None = None,
        extrapos_version: str | None = None,
        train_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        for key in DERIVED:
            kwargs.pop(key, None)
        self.extrapos_model = dict(extrapos_model or {})
        self.max_position_embeddings = max_position_embeddings
        self.extrapos_version = extrapos_version
        m = self.extrapos_model
        # a folder exported before this field existed: the ModelConfig's own L_t
        self.train_length = train_length if train_length is not None else m.get("train_length")
        self.vocab_size = m.get("vocab_size")
        self.hidden_size = m.get("d_model")
        self.num_hidden_layers = m.get("n_layers")
        self.num_attention_heads = m.get("n_heads")
        self.num_key_value_heads = m.get("n_kv_heads") or m.get("n_heads")
        kwargs.setdefault("tie_word_embeddings", bool(m.get("tie_embeddings", True)))
        super().__init__(**kwargs)

    def model_config(self) -> Any:
        """The library's ModelConfig (checked key by key as a run's config.toml is)."""
        return model_config_of(self)


def model_config_of(config: Any) -> Any:
    """The ModelConfig of an ExtraposConfig, built by this module's own imports.

    The model classes call this rather than ``config.model_config()``: transformers loads an exported
    folder's configuration file and its modeling file as two module trees (each file with the files it
    imports), and the ModelConfig, its encodings' options and the model must all come from the modeling
    file's tree, whose copy of this module this is."""
    from extrapos.model import ModelConfig
    from extrapos.schema import build

    values = getattr(config, "extrapos_model", None)
    if not values:
        raise ValueError("this ExtraposConfig has no extrapos_model; it was not written by extrapos export.")
    # run/config.py's build_section, whose module (data, TOML) an exported folder does not carry
    return build(
        ModelConfig,
        dict(values),
        where="config key 'model.{key}'",
        unknown="unknown config key 'model.{key}'; the keys of [model] are: {keys}.",
    )
