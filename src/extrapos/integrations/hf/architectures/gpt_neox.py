"""GPT-NeoX (Black et al. 2022) and Pythia (Biderman et al. 2023): flavour gpt2, exact GELU,
``parallel_residual``, RoPE on ``rotary_pct`` of each head, fused QKV laid out per head ([q_h; k_h; v_h]
for every head h) split into our [Q; K; V]; untied head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from extrapos.errors import UserError
from extrapos.integrations.hf.adapter import Adapter, attention_bias
from extrapos.integrations.hf.architectures.gpt2 import HF_ACTIVATION
from extrapos.integrations.hf.config_checks import activation, check_value, first
from extrapos.integrations.hf.registry import register
from extrapos.integrations.hf.rope import (
    rope_export,
    rope_export_blocker,
    rope_options_from_hf,
    rotary_fraction,
)
from extrapos.integrations.hf.weight_map import PER_HEAD_QKV, Weight, WeightMap, pair

if TYPE_CHECKING:
    from extrapos.model import ModelConfig

# the keys of every architecture configured by hidden_size and max_position_embeddings
SIZES = [
    ("hidden_size",),
    ("num_hidden_layers",),
    ("num_attention_heads",),
    ("intermediate_size",),
    ("vocab_size",),
    ("max_position_embeddings",),
]


class GPTNeoX(Adapter):
    model_type = "gpt_neox"
    label = "GPT-NeoX"
    required = SIZES
    exports = "rope"
    weights = WeightMap(
        "gpt_neox.",
        [
            Weight("embed_in.weight", "tok_emb.weight"),
            Weight("embed_out.weight", "lm_head.weight", head=True, aliases=("lm_head.weight",)),
            *pair("layers.{i}.input_layernorm", "blocks.{i}.norm1"),
            *pair("layers.{i}.post_attention_layernorm", "blocks.{i}.norm2"),
            *pair(
                "layers.{i}.attention.query_key_value",
                "blocks.{i}.attn.qkv",
                PER_HEAD_QKV,
                bias_when=attention_bias,
            ),
            *pair("layers.{i}.attention.dense", "blocks.{i}.attn.proj", bias_when=attention_bias),
            *pair("layers.{i}.mlp.dense_h_to_4h", "blocks.{i}.mlp.up"),
            *pair("layers.{i}.mlp.dense_4h_to_h", "blocks.{i}.mlp.down"),
            *pair("final_layer_norm", "norm"),
        ],
        ignored=[r"layers\.(\d+)\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"],
    )

    def options_from_hf(
        self, hf: dict, context_length: int | None, notes: list[str]
    ) -> tuple[dict[str, Any], int, str]:
        d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        params = hf.get("rope_parameters") or {}
        raw = first(
            params,
            "partial_rotary_factor",
            default=first(hf, "partial_rotary_factor", "rotary_pct", default=0.25),
        )
        check_value("partial_rotary_factor", raw, "fraction")
        partial = float(raw)
        if int(d // heads * partial) % 2:
            raise UserError(
                f"rotary_pct={partial} rotates an odd number of dims per head ({int(d // heads * partial)});"
                " extrapos rotates pairs."
            )
        attn_bias = bool(first(hf, "attention_bias", default=True))
        model = dict(
            flavour="gpt2",
            n_layers=int(hf["num_hidden_layers"]),
            d_model=d,
            n_heads=heads,
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=int(hf["intermediate_size"]),
            bias=True,
            qkv_bias=attn_bias,
            norm_eps=float(first(hf, "layer_norm_eps", default=1e-5)),
            activation=activation(hf, "hidden_act", "gelu"),
            parallel_residual=bool(first(hf, "use_parallel_residual", default=True)),
            positions=rope_options_from_hf(hf, d // heads, partial),
        )
        if not attn_bias:
            raise UserError(
                "GPT-NeoX checkpoints without attention_bias are not supported (the MLP keeps biases)."
            )
        return model, int(hf["max_position_embeddings"]), "max_position_embeddings"

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.positions_plan().name == "rope" and cfg.flavour != "llama"

    def export_blocker(self, cfg: ModelConfig) -> str | None:
        if cfg.flavour != "gpt2":
            return "gpt_neox blocks use LayerNorm and a plain MLP, the run has the llama flavour"
        if cfg.kv_heads != cfg.n_heads:
            return "gpt_neox has no grouped-query attention"
        if cfg.embed_norm:
            return "gpt_neox has no embedding LayerNorm"
        if cfg.act not in ("gelu_tanh", "gelu", "relu", "silu"):
            return f"activation {cfg.act} is not available in GPT-NeoX"
        return rope_export_blocker(cfg, whole_heads=False)

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        theta, scaling, max_pos = rope_export(cfg, context)
        fraction = rotary_fraction(cfg)
        return {
            "architectures": ["GPTNeoXForCausalLM"],
            "model_type": "gpt_neox",
            **common,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.hidden,
            "hidden_act": HF_ACTIVATION[cfg.act],
            "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": cfg.parallel_residual,
            "max_position_embeddings": max_pos,
            "attention_bias": attention_bias(cfg),
            "rotary_pct": fraction,
            "partial_rotary_factor": fraction,
            "rotary_emb_base": theta,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "hidden_dropout": cfg.dropout,
            "attention_dropout": cfg.dropout,
        }


register(GPTNeoX())
