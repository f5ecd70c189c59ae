"""``ExtraposCache``: the library's KV cache (model.KVCache) as the ``Cache`` that ``generate`` passes
from one forward call to the next.

transformers' own caches hold one key and one value tensor per layer; extrapos' cache also holds the
bias encodings' key features and each layer's encoding state (T5's distance table, FoX's running gate
sums, document numbers), so the model keeps its own and this class gives it the ``Cache`` interface:
the number of tokens seen (``get_seq_length``), and plain refusals for what it cannot do (beam search's
reordering, cropping), instead of silently wrong tokens. A layer with a sliding window keeps only the keys
its window can still reach, as the library's own decoding does (``Decoder.new_cache``), so a windowed
model's memory stays O(W) per layer however long ``generate`` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers.cache_utils import Cache

from extrapos.model import KVCache


class ExtraposCache(Cache):
    """One extrapos ``KVCache`` for every layer of the model (``.cache``), made by ``fresh`` (the model's
    ``Decoder.new_cache``: each layer with its sliding window) now and on ``reset``."""

    def __init__(self, fresh: Callable[[], KVCache]) -> None:
        super().__init__(layers=[])
        self.fresh = fresh
        self.cache = fresh()
        self.n_layers = len(self.cache.layers)

    def __repr__(self) -> str:
        return f"ExtraposCache(layers={self.n_layers}, tokens={self.cache.length})"

    def __len__(self) -> int:
        return self.n_layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cache.length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # grows without a bound, as DynamicCache

    def update(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ExtraposCache is filled by the extrapos model itself, not by update().")

    def _refuse(self, what: str) -> None:
        raise NotImplementedError(
            f"{what} is not supported by extrapos models; generate with greedy decoding or sampling "
            "(num_beams=1)."
        )

    def reorder_cache(self, beam_idx: Any) -> None:
        self._refuse("beam search (reordering the KV cache)")

    def crop(self, tokens_to_remove: int) -> None:
        self._refuse("cropping the KV cache (assisted decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("repeating a filled KV cache")

    def batch_select_indices(self, indices: Any) -> None:
        self._refuse("selecting rows of a filled KV cache")

    def reset(self) -> None:
        self.cache = self.fresh()

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.cache.length > 0

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_sliding(self) -> list[bool]:
        # False even on a windowed layer: the model builds its own window masks, and transformers' mask
        # builders, which read this, would ask a sliding layer for sizes this cache does not keep
        return [False] * self.n_layers

    @property
    def is_linear(self) -> list[bool]:
        return [False] * self.n_layers

    @property
    def is_dummy(self) -> list[bool]:
        return [False] * self.n_layers
