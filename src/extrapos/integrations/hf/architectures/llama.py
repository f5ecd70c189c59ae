"""The Llama family: Llama (Touvron et al. 2023), Mistral (Jiang et al. 2023), Qwen2 (Yang et al. 2024)
and SmolLM3. Flavour llama, RoPE with the config's ``rope_theta`` and ``rope_scaling`` (linear,
dynamic, yarn, llama3, longrope), grouped-query attention, QKV bias (Qwen2), tied or untied.
SmolLM3's ``no_rope_layers`` (0: no RoPE) become a layer schedule (``model.positions.layers``: the
RoPE layers, NoPE on the others). A sliding window (Mistral's ``sliding_window``; Qwen2's and SmolLM3's
with ``use_sliding_window``, on the layers their ``layer_types`` name) becomes ``model.sliding_window``
on the same layers, as Hugging Face applies it. Export writes Llama; Mistral for a run without biases
whose window covers every layer; Qwen2 when only Q/K/V have biases (with its window on any layers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from extrapos.errors import UserError
from extrapos.integrations.hf.adapter import Adapter, attention_bias
from extrapos.integrations.hf.architectures.gpt_neox import SIZES
from extrapos.integrations.hf.config_checks import activation, first, layer_types
from extrapos.integrations.hf.registry import register
from extrapos.integrations.hf.rope import rope_export, rope_export_blocker, rope_options_from_hf
from extrapos.integrations.hf.weight_map import QKVRows, Weight, WeightMap, pair

if TYPE_CHECKING:
    from extrapos.integrations.hf.weight_map import Condition
    from extrapos.model import ModelConfig


def _mlp_bias(cfg: ModelConfig) -> bool:
    return bool(cfg.use_bias)


def _never(cfg: ModelConfig) -> bool:
    return False


def llama_weights(output_bias: Condition) -> WeightMap:
    """The Llama layout; ``output_bias``: when o_proj has a bias (Llama's attention_bias; never in
    Qwen2, whose Q/K/V biases stand alone)."""
    attn, mlp = "layers.{i}.self_attn", "layers.{i}.mlp"
    return WeightMap(
        "model.",
        [
            Weight("embed_tokens.weight", "tok_emb.weight"),
            *pair(f"{attn}.q_proj", "blocks.{i}.attn.qkv", QKVRows("q"), bias_when=attention_bias),
            *pair(f"{attn}.k_proj", "blocks.{i}.attn.qkv", QKVRows("k"), bias_when=attention_bias),
            *pair(f"{attn}.v_proj", "blocks.{i}.attn.qkv", QKVRows("v"), bias_when=attention_bias),
            *pair(f"{attn}.o_proj", "blocks.{i}.attn.proj", bias_when=output_bias),
            *pair(f"{mlp}.gate_proj", "blocks.{i}.mlp.gate", bias_when=_mlp_bias),
            *pair(f"{mlp}.up_proj", "blocks.{i}.mlp.up", bias_when=_mlp_bias),
            *pair(f"{mlp}.down_proj", "blocks.{i}.mlp.down", bias_when=_mlp_bias),
            Weight("layers.{i}.input_layernorm.weight", "blocks.{i}.norm1.weight"),
            Weight("layers.{i}.post_attention_layernorm.weight", "blocks.{i}.norm2.weight"),
            Weight("norm.weight", "norm.weight"),
            Weight("lm_head.weight", "lm_head.weight", head=True),
        ],
        ignored=[r"layers\.(\d+)\.self_attn\.rotary_emb\.inv_freq"],
    )


class Llama(Adapter):
    model_type = "llama"
    label = "Llama"
    required = SIZES
    exports: ClassVar[str | None] = "rope"
    weights = llama_weights(attention_bias)
    holds_window: ClassVar[bool] = False  # whether the exported config.json can hold a sliding window

    def biases(self, hf: dict) -> tuple[bool, bool | None]:
        """(model bias, qkv_bias) from config.json."""
        attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
        if attn_bias != mlp_bias:
            raise UserError("checkpoints with attention_bias different from mlp_bias are not supported.")
        return attn_bias, None

    def window_layers(self, hf: dict, n_layers: int) -> list[int]:
        """The layers Hugging Face runs with config.json's ``sliding_window``: none for Llama, whose model
        has no window (a ``sliding_window`` in its config.json is not read)."""
        return []

    def window_options(self, hf: dict, n_layers: int, notes: list[str]) -> dict[str, Any]:
        """``sliding_window`` (and ``sliding_window_layers`` when not every layer has it) for the model."""
        layers = self.window_layers(hf, n_layers)
        if not layers:
            return {}
        window = int(hf["sliding_window"])
        every = len(layers) == n_layers
        where = "every layer" if every else f"layers {', '.join(map(str, layers))}"
        notes.append(f"a sliding window of {window} tokens on {where} (each token sees its last {window})")
        return {"sliding_window": window, "sliding_window_layers": None if every else layers}

    def rope_layers(self, hf: dict, positions: dict[str, Any], n_layers: int) -> dict[str, Any]:
        """The positions option of the whole stack (SmolLM3 overrides it)."""
        return positions

    def options_from_hf(
        self, hf: dict, context_length: int | None, notes: list[str]
    ) -> tuple[dict[str, Any], int, str]:
        d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        head_dim = int(hf.get("head_dim") or d // heads)
        if head_dim * heads != d:
            raise UserError(
                f"head_dim={head_dim} differs from hidden_size / num_attention_heads = {d // heads}; "
                "extrapos models need head_dim = d_model / n_heads."
            )
        bias, qkv_bias = self.biases(hf)
        ctx = int(hf["max_position_embeddings"])
        model: dict[str, Any] = dict(
            flavour="llama",
            n_layers=int(hf["num_hidden_layers"]),
            d_model=d,
            n_heads=heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or heads),
            vocab_size=int(hf["vocab_size"]),
            mlp_hidden=int(hf["intermediate_size"]),
            bias=bias,
            qkv_bias=qkv_bias,
            norm_eps=float(first(hf, "rms_norm_eps", default=1e-6)),
            activation=activation(hf, "hidden_act", "silu"),
            positions=rope_options_from_hf(hf, head_dim),
        )
        if model["activation"] != "silu":
            raise UserError(
                f"{self.model_type} checkpoints with hidden_act {hf.get('hidden_act')!r} are not supported "
                "(SwiGLU only)."
            )
        model["positions"] = self.rope_layers(hf, model["positions"], model["n_layers"])
        model.update(self.window_options(hf, model["n_layers"], notes))
        return model, ctx, "max_position_embeddings"

    def claims(self, cfg: ModelConfig) -> bool:
        # Q/K/V biases alone are Qwen2's block; Llama's attention_bias also covers the output projection;
        # a run without biases and with a window on every layer is Mistral's
        return (
            cfg.positions_plan().name == "rope"
            and cfg.flavour == "llama"
            and not (cfg.use_qkv_bias and not cfg.use_bias)
            and not (_window_everywhere(cfg) and not cfg.use_qkv_bias)
        )

    def export_blocker(self, cfg: ModelConfig) -> str | None:
        if cfg.sliding_window is not None and not self.holds_window:
            return (
                "Hugging Face's Llama has no sliding window (Mistral holds one on every layer without "
                "biases, Qwen2 one on any layers with Q/K/V biases only)"
            )
        if cfg.act != "silu":
            return "Llama's MLP is SwiGLU, the run uses another activation"
        if cfg.parallel_residual:
            return f"{self.model_type} has sequential residual blocks"
        if cfg.embed_norm:
            return f"{self.model_type} has no embedding LayerNorm"
        return rope_export_blocker(cfg, whole_heads=True)

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        theta, scaling, max_pos = rope_export(cfg, context)
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **common,
            **self.layer_sizes(cfg),
            "max_position_embeddings": max_pos,
            "attention_bias": cfg.use_bias or cfg.use_qkv_bias,
            "mlp_bias": cfg.use_bias,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "attention_dropout": cfg.dropout,
        }

    @staticmethod
    def layer_sizes(cfg: ModelConfig) -> dict[str, Any]:
        return {
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim,
            "intermediate_size": cfg.hidden,
            "hidden_act": "silu",
            "rms_norm_eps": cfg.norm_eps,
        }


class Mistral(Llama):
    """Llama's block without biases, with a sliding window on every layer (``sliding_window``; none when
    it is null)."""

    model_type = "mistral"
    label = "Mistral"
    exports = "rope"
    holds_window = True

    def window_layers(self, hf: dict, n_layers: int) -> list[int]:
        # Mistral has no use_sliding_window switch: a sliding_window set is in use, on every layer
        return list(range(n_layers)) if hf.get("sliding_window") is not None else []

    def claims(self, cfg: ModelConfig) -> bool:
        rope_llama = cfg.positions_plan().name == "rope" and cfg.flavour == "llama"
        return rope_llama and _window_everywhere(cfg) and not cfg.use_bias and not cfg.use_qkv_bias

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        theta, scaling, max_pos = rope_export(cfg, context)
        return {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            **common,
            **self.layer_sizes(cfg),
            "max_position_embeddings": max_pos,
            "sliding_window": cfg.sliding_window,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "attention_dropout": cfg.dropout,
        }


def _window_everywhere(cfg: ModelConfig) -> bool:
    """A sliding window on every layer of the run."""
    layers = cfg.sliding_window_layers
    return cfg.sliding_window is not None and (layers is None or set(layers) == set(range(cfg.n_layers)))


def _typed_window_layers(hf: dict, n_layers: int, default: list[int]) -> list[int]:
    """The sliding layers of a config with ``use_sliding_window``: those its ``layer_types`` name
    ``sliding_attention``, or ``default`` when it has none (Hugging Face derives them the same way)."""
    if not hf.get("use_sliding_window") or hf.get("sliding_window") is None:
        return []
    types = layer_types(hf, n_layers)
    if types is None:
        return default
    return [i for i, kind in enumerate(types) if kind == "sliding_attention"]


class Qwen2(Llama):
    """Llama's block with Q/K/V biases and no other bias."""

    model_type = "qwen2"
    label = "Qwen2"
    weights = llama_weights(_never)
    holds_window = True

    def biases(self, hf: dict) -> tuple[bool, bool | None]:
        return False, True

    def window_layers(self, hf: dict, n_layers: int) -> list[int]:
        # Hugging Face's default: the layers from max_window_layers on (28 when config.json has none)
        first_sliding = int(first(hf, "max_window_layers", default=28))
        return _typed_window_layers(hf, n_layers, list(range(first_sliding, n_layers)))

    def claims(self, cfg: ModelConfig) -> bool:
        rope_llama = cfg.positions_plan().name == "rope" and cfg.flavour == "llama"
        return rope_llama and bool(cfg.use_qkv_bias and not cfg.use_bias)

    @staticmethod
    def window_config(cfg: ModelConfig) -> dict[str, Any]:
        """Qwen2's window keys: the layer of each type, and max_window_layers where the sliding layers are
        the last ones (which is how versions of transformers that predate layer_types read it)."""
        if cfg.sliding_window is None:
            return {"use_sliding_window": False, "sliding_window": None}
        sliding = set(range(cfg.n_layers) if cfg.sliding_window_layers is None else cfg.sliding_window_layers)
        out: dict[str, Any] = {"use_sliding_window": True, "sliding_window": cfg.sliding_window}
        if sliding == set(range(min(sliding), cfg.n_layers)):
            out["max_window_layers"] = min(sliding)
        out["layer_types"] = [
            "sliding_attention" if i in sliding else "full_attention" for i in range(cfg.n_layers)
        ]
        return out

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        theta, scaling, max_pos = rope_export(cfg, context)
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            **common,
            **self.window_config(cfg),
            **self.layer_sizes(cfg),
            "max_position_embeddings": max_pos,
            "rope_theta": theta,
            "rope_scaling": scaling,
            "attention_dropout": cfg.dropout,
        }


class SmolLM3(Llama):
    """Llama's block where ``no_rope_layers`` turns RoPE off on some layers (NoPE)."""

    model_type = "smollm3"
    label = "SmolLM3"
    exports = None

    def claims(self, cfg: ModelConfig) -> bool:
        return False

    def window_layers(self, hf: dict, n_layers: int) -> list[int]:
        # Hugging Face's default: the NoPE layers (no_rope_layers 0)
        flags = hf.get("no_rope_layers") or [1] * n_layers
        return _typed_window_layers(hf, n_layers, [i for i, flag in enumerate(flags) if not flag])

    def rope_layers(self, hf: dict, positions: dict[str, Any], n_layers: int) -> dict[str, Any]:
        flags = hf.get("no_rope_layers")
        if flags is None or all(flags):  # 1: the layer rotates, 0: a NoPE layer
            return positions
        if len(flags) != n_layers:
            raise UserError(
                f"no_rope_layers has {len(flags)} entries for {n_layers} layers; config.json is inconsistent."
            )
        rope_layers = [i for i, flag in enumerate(flags) if flag]
        return {**positions, "layers": rope_layers} if rope_layers else {"name": "nope"}


for adapter in (Llama(), Mistral(), Qwen2(), SmolLM3()):
    register(adapter)
