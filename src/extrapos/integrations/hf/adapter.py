"""What one Hugging Face architecture knows: its config.json in and out, its one weight map, and what
blocks an export. Each architecture family is one module of ``architectures/`` (registry.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from extrapos.errors import UserError
from extrapos.integrations.hf.weight_map import WeightMap

if TYPE_CHECKING:
    from extrapos.model import ModelConfig


def attention_bias(cfg: ModelConfig) -> bool:
    """The block has attention biases (all of them, or Q/K/V only)."""
    return bool(cfg.use_bias or cfg.use_qkv_bias)


class Adapter:
    """One ``model_type``. Subclasses set the class attributes and override what they support."""

    model_type: ClassVar[str]  # config.json's model_type, read on import and written on export
    label: ClassVar[str]  # the name people know it by, in messages ("GPT-2")
    required: ClassVar[Sequence[tuple[str, ...]]]  # config.json keys it needs (alternatives in one tuple)
    weights: ClassVar[WeightMap]
    tied_by_default: ClassVar[bool] = False  # tie_word_embeddings when config.json leaves it out
    exports: ClassVar[str | None] = None  # the extrapos encoding it exports; None: import only

    # ---- config in ----

    def options_from_hf(
        self, hf: dict, context_length: int | None, notes: list[str]
    ) -> tuple[dict[str, Any], int, str]:
        """ModelConfig fields (without tie_embeddings, dropout, train_length), the checkpoint's context
        limit and the config.json key it came from; ``notes`` collects what the import should report.
        The fields were checked by key already (config_checks.check_hf_config)."""
        raise NotImplementedError

    # ---- export ----

    def claims(self, cfg: ModelConfig) -> bool:
        """Whether a run of this ModelConfig exports to this architecture (its encoding is ``exports``)."""
        return False

    def export_blocker(self, cfg: ModelConfig) -> str | None:
        """Why this architecture cannot hold the run (a clause), or None."""
        return None

    def check_export(self, cfg: ModelConfig) -> None:
        why = self.export_blocker(cfg)
        if why:
            raise UserError(f"this run cannot be exported as {self.model_type}: {why}.")

    def config_for(self, cfg: ModelConfig, common: dict[str, Any], context: int) -> dict[str, Any]:
        """The exported config.json; ``common``: the keys every architecture writes (vocabulary, tie,
        dtype, bos / eos), ``context``: the run's context length (L_t, or L_e for an extended run)."""
        raise NotImplementedError
