"""The one batch format every sampler produces and every consumer reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Batch:
    """tokens, targets, positions: int64 (B, T); loss_mask: bool (B, T).

    ``targets[b, t]`` is the token that follows ``tokens[b, t]`` in the document (not necessarily
    ``tokens[b, t+1]`` when a sampler cuts segments), ``positions`` the original position of each
    token, and ``loss_mask`` says which targets count in the loss (prefix sampling masks the prefix).
    """

    tokens: Tensor
    targets: Tensor
    positions: Tensor
    loss_mask: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            *(
                t.to(device, non_blocking=non_blocking)
                for t in (self.tokens, self.targets, self.positions, self.loss_mask)
            )
        )

    @property
    def num_tokens(self) -> int:
        """Number of target tokens that count in the loss."""
        return int(self.loss_mask.sum())
