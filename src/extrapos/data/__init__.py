"""Corpora, tokenizers, token shards on disk and window samplers.

The pipeline: ``iter_documents`` (corpus spec -> documents) -> ``build_tokenizer`` / ``load_tokenizer``
-> ``prepare_data`` (tokenize once into memory-mapped train/val/test shards) -> ``open_split``
-> a sampler from ``extrapos.data.sampling`` -> ``Batch``.

Names are imported lazily so ``import extrapos.data`` stays cheap (no torch, no tokenizers) for
the CLI and for code that only needs one piece.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Batch": "extrapos.data.batch",
    "Corpus": "extrapos.data.corpora",
    "open_corpus": "extrapos.data.corpora",
    "iter_documents": "extrapos.data.corpora",
    "Tokenizer": "extrapos.data.tokenizer",
    "build_tokenizer": "extrapos.data.tokenizer",
    "load_tokenizer": "extrapos.data.tokenizer",
    "TokenSplit": "extrapos.data.shards",
    "open_split": "extrapos.data.shards",
    "prepare_data": "extrapos.data.prepare",
    "cache_root": "extrapos.data.cache",
    "check_heldout": "extrapos.data.splitting",
    "Sampler": "extrapos.data.sampling",
    "ContiguousSampler": "extrapos.data.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # the value of a lazily imported name: its type depends on the name
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'extrapos.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
