"""GPT-2 (Radford et al. 2019): flavour gpt2, encoding ``learned`` (n_positions rows); Conv1D weights are
stored (in, out) and are transposed; tied head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from extrapos.errors import UserError
from extrapos.integrations.hf.adapter import Adapter
from extrapos.integrations.hf.config_checks import activation, first
from extrapos.integrations.hf.registry import register
from extrapos.integrations.hf.weight_map import TRANSPOSED, Weight, WeightMap, always, pair

if TYPE_CHECKING:
    from extrapos.model import ModelConfig
    from extrapos.positions.absolute import LearnedAbsolute

HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def learned_options(cfg: Any) -> LearnedAbsolute.Options:
    """The learned table's options of a run this adapter claimed (its plan, typed)."""
    from extrapos.positions.absolute import LearnedAbsolute

    return cfg.positions_plan().options_as(LearnedAbsolute.Options)


def _conv1d(hf: str, ours: str) -> list[Weight]:
    """A Conv1D: its weight transposed, its bias as is (GPT-2 always has one)."""
    return [
        Weight(f"{hf}.weight", f"{ours}.weight", TRANSPOSED),
        Weight(f"{hf}.bias", f"{ours}.bias", bias_when=always),
    ]


class GPT2(Adapter):
    model_type = "gpt2"
    label = "GPT-2"
    required = [("n_embd",), ("n_layer",), ("n_head",), ("n_positions",), ("vocab_size",)]
    tied_by_default = True
    exports = "learned"
    weights = WeightMap(
        "transformer.",
        [
            Weight("wte.weight", "tok_emb.weight"),
            Weight("wpe.weight", "pos.table"),
            *pair("h.{i}.ln_1", "blocks.{i}.norm1"),
            *_conv1d("h.{i}.attn.c_attn", "blocks.{i}.attn.qkv"),
            *_conv1d("h.{i}.attn.c_proj", "blocks.{i}.attn.proj"),
            *pair("h.{i}.ln_2", "blocks.{i}.norm2"),
            *_conv1d("h.{i}.mlp.c_fc", "blocks.{i}.mlp.up"),
            *_conv1d("h.{i}.mlp.c_proj", "blocks.{i}.mlp.down"),
            *pair("ln_f", "norm"),
            Weight("lm_head.weight", "lm_head.weight", head=True),
        ],
        ignored=[r"h\.(\d+)\.attn\.(bias|masked_bias)"],  # causal-mask buffers of old checkpoints
    )

    def options_from_hf(
        self, hf: dict, context_length: int | None, notes: list[str]
    ) -> tuple[dict[str, Any], int, str]:
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
            raise UserError(
                "GPT-2 checkpoints with scale_attn_by_inverse_layer_idx or without scale_attn_weights "
                "are not supported."
            )
        d, n_pos = int(hf["n_embd"]), int(hf["n_positions"])
        model = dict(
            flavour="gpt2",
            n_layers=int(hf["n_layer"]),
            d_model=d,
            n_heads=int(hf["n_head"]),
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=int(hf.get("n_inner") or 4 * d),
            bias=True,
            norm_eps=float(first(hf, "layer_norm_epsilon", default=1e-5)),
            activation=activation(hf, "activation_function", "gelu_new"),
            positions={"name": "learned", "max_length": n_pos},
        )
        return model, n_pos, "n_positions"

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.positions_plan().name == "learned"

    def check_export(self, cfg: ModelConfig) -> None:
        if learned_options(cfg).interpolate_to:
            raise UserError(
                "GPT-2 reads its position table without interpolation; extend the table first "
                "(extrapos extend, or LearnedAbsolute.extend_table) and export that run."
            )
        super().check_export(cfg)

    def export_blocker(self, cfg: ModelConfig) -> str | None:
        if cfg.flavour != "gpt2":
            return "gpt2 blocks use LayerNorm and a plain MLP, the run has the llama flavour"
        if cfg.kv_heads != cfg.n_heads:
            return "gpt2 has no grouped-query attention"
        if cfg.parallel_residual:
            return "gpt2 has sequential residual blocks"
        if cfg.embed_norm:
            return "gpt2 has no embedding LayerNorm"
        return None

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        # the position table's rows are the context (an extended run's table was resized to L_e)
        rows = learned_options(cfg).max_length or cfg.train_length
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            **common,
            "n_positions": rows,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_inner": cfg.hidden,
            "activation_function": HF_ACTIVATION[cfg.act],
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout,
            "scale_attn_weights": True,
        }


register(GPT2())
