"""The one batch format every sampler produces and every consumer reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Batch:
    """tokens, targets, positions: int64 (B, T); loss_mask: bool (B, T); documents: int64 (B, T) or None.

    ``targets[b, t]`` is the token that follows ``tokens[b, t]`` in the document (not necessarily
    ``tokens[b, t+1]`` when a sampler cuts segments), ``positions`` the original position of each
    token, and ``loss_mask`` says which targets count in the loss (prefix sampling masks the prefix).
    ``documents`` numbers the documents of a packed row (0, 0, 0, 1, 1, 2, ...; non-decreasing):
    when it is set, a token attends only to tokens of its own document (document masking); None
    means every token of the row may attend to every earlier one.
    """

    tokens: Tensor
    targets: Tensor
    positions: Tensor
    loss_mask: Tensor
    documents: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        tokens, targets, positions, loss_mask = (
            t.to(device, non_blocking=non_blocking)
            for t in (self.tokens, self.targets, self.positions, self.loss_mask)
        )
        documents = None if self.documents is None else self.documents.to(device, non_blocking=non_blocking)
        return Batch(tokens, targets, positions, loss_mask, documents=documents)

    @property
    def num_tokens(self) -> int:
        """Number of target tokens that count in the loss."""
        return int(self.loss_mask.sum())
