"""model_type -> Adapter, like the encodings registry (positions/registry.py).

Adding an architecture is one new module in ``architectures/`` with an ``Adapter`` subclass and a
``register(...)`` call: every module of that package is imported (pkgutil) the first time the
registry is read.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from extrapos.errors import UserError
from extrapos.integrations.hf.adapter import Adapter

if TYPE_CHECKING:
    from extrapos.model import ModelConfig

_REGISTRY: dict[str, Adapter] = {}
_loaded = False


def register(adapter: Adapter) -> Adapter:
    if adapter.model_type in _REGISTRY:
        raise ValueError(f"Hugging Face model_type {adapter.model_type!r} is registered twice")
    _REGISTRY[adapter.model_type] = adapter
    return adapter


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import extrapos.integrations.hf.architectures as package

        for m in pkgutil.iter_modules(package.__path__):
            if not m.name.startswith("_"):
                importlib.import_module(f"{package.__name__}.{m.name}")


def adapters() -> list[Adapter]:
    _load()
    return list(_REGISTRY.values())


def model_types() -> list[str]:
    return [a.model_type for a in adapters()]


def adapter_for(model_type: object) -> Adapter:
    """The adapter importing config.json's ``model_type`` (UserError naming the supported ones)."""
    _load()
    if not isinstance(model_type, str) or model_type not in _REGISTRY:
        raise UserError(
            f"model_type {model_type!r} is not supported; extrapos imports {', '.join(_REGISTRY)}."
        )
    return _REGISTRY[model_type]


def exporting_adapter(cfg: ModelConfig) -> Adapter | None:
    """The architecture a run of this ModelConfig exports to, or None."""
    return next((a for a in adapters() if a.claims(cfg)), None)
