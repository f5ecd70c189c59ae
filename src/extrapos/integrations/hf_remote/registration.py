"""The two registrations that make transformers' Auto classes load an exported folder without
``trust_remote_code``; ``extrapos/auto_registration.py`` runs each as soon as the transformers module it
needs has loaded (``import extrapos`` installs it)."""

from __future__ import annotations


def register_config() -> None:
    """Run once ``transformers.models.auto.configuration_auto`` has loaded; imports nothing of
    transformers beyond what that module already did (configuration.py needs only PreTrainedConfig)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from extrapos.integrations.hf_remote.configuration import MODEL_TYPE, ExtraposConfig

    AutoConfig.register(MODEL_TYPE, ExtraposConfig, exist_ok=True)


def register_models() -> None:
    """Run once ``transformers.models.auto.modeling_auto`` has loaded."""
    from transformers.models.auto import modeling_auto as auto

    from extrapos.integrations.hf_remote.configuration import ExtraposConfig
    from extrapos.integrations.hf_remote.modeling import (
        ExtraposForCausalLM,
        ExtraposForMaskedLM,
        ExtraposModel,
    )

    auto.AutoModel.register(ExtraposConfig, ExtraposModel, exist_ok=True)
    auto.AutoModelForCausalLM.register(ExtraposConfig, ExtraposForCausalLM, exist_ok=True)
    auto.AutoModelForMaskedLM.register(ExtraposConfig, ExtraposForMaskedLM, exist_ok=True)
