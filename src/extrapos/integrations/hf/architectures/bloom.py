"""Bloom (Le Scao et al. 2022): flavour gpt2, ``alibi`` (Press et al. 2022 slopes, the same for
non-power-of-two head counts), ``embed_norm``, fused QKV per head; tied head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from extrapos.errors import UserError
from extrapos.integrations.hf.adapter import Adapter
from extrapos.integrations.hf.config_checks import first
from extrapos.integrations.hf.registry import register
from extrapos.integrations.hf.weight_map import PER_HEAD_QKV, Weight, WeightMap, pair

if TYPE_CHECKING:
    from extrapos.model import ModelConfig

BLOOM_CONTEXT = 2048  # Le Scao et al. 2022, §3.3: Bloom was trained on 2048-token sequences


class Bloom(Adapter):
    model_type = "bloom"
    label = "Bloom"
    required = [
        ("hidden_size", "n_embed"),
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("vocab_size",),
    ]
    tied_by_default = True
    exports = "alibi"
    weights = WeightMap(
        "transformer.",
        [
            Weight("word_embeddings.weight", "tok_emb.weight"),
            *pair("word_embeddings_layernorm", "emb_norm"),
            *pair("h.{i}.input_layernorm", "blocks.{i}.norm1"),
            *pair("h.{i}.self_attention.query_key_value", "blocks.{i}.attn.qkv", PER_HEAD_QKV),
            *pair("h.{i}.self_attention.dense", "blocks.{i}.attn.proj"),
            *pair("h.{i}.post_attention_layernorm", "blocks.{i}.norm2"),
            *pair("h.{i}.mlp.dense_h_to_4h", "blocks.{i}.mlp.up"),
            *pair("h.{i}.mlp.dense_4h_to_h", "blocks.{i}.mlp.down"),
            *pair("ln_f", "norm"),
            Weight("lm_head.weight", "lm_head.weight", head=True),
        ],
    )

    def options_from_hf(
        self, hf: dict, context_length: int | None, notes: list[str]
    ) -> tuple[dict[str, Any], int, str]:
        if hf.get("apply_residual_connection_post_layernorm"):
            raise UserError(
                "Bloom checkpoints with apply_residual_connection_post_layernorm are not supported."
            )
        d = int(first(hf, "hidden_size", "n_embed"))
        model = dict(
            flavour="gpt2",
            n_layers=int(first(hf, "n_layer", "num_hidden_layers")),
            d_model=d,
            n_heads=int(first(hf, "n_head", "num_attention_heads")),
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=4 * d,
            bias=True,
            norm_eps=float(first(hf, "layer_norm_epsilon", default=1e-5)),
            activation="gelu_tanh",
            embed_norm=True,
            positions={"name": "alibi"},
        )
        if "seq_length" not in hf:
            notes.append(f"config.json has no seq_length; Bloom's training length {BLOOM_CONTEXT} is assumed")
        return model, int(hf.get("seq_length") or BLOOM_CONTEXT), "seq_length"

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.positions_plan().name == "alibi"

    def export_blocker(self, cfg: ModelConfig) -> str | None:
        if cfg.flavour != "gpt2":
            return "bloom blocks use LayerNorm and a plain MLP, the run has the llama flavour"
        if cfg.kv_heads != cfg.n_heads:
            return "bloom has no grouped-query attention"
        if cfg.parallel_residual:
            return "bloom has sequential residual blocks"
        if not cfg.embed_norm:
            return (
                "Bloom normalises the embeddings with a LayerNorm the run does not have (train with "
                "model.embed_norm = true)"
            )
        if cfg.act != "gelu_tanh" or cfg.hidden != 4 * cfg.d_model:
            return "Bloom's MLP is 4 d wide with the tanh GELU"
        return None

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        return {
            "architectures": ["BloomForCausalLM"],
            "model_type": "bloom",
            **common,
            "hidden_size": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "layer_norm_epsilon": cfg.norm_eps,
            "apply_residual_connection_post_layernorm": False,
            "seq_length": context,  # ALiBi has no position limit: this records the training length
            "hidden_dropout": cfg.dropout,
            "attention_dropout": cfg.dropout,
        }


register(Bloom())
