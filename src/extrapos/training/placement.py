"""Where and in what a training run computes, resolved once and passed down (``train`` -> ``Trainer``).

``train.device`` ("auto", "cpu", "cuda") becomes a device once, ``train.precision = "auto"`` the precision
it picks on that device once (config.toml then records what the run computed in), the torchrun group is
joined once and the parallel plan (``run/parallelize.py``) checked once; everything after reads this
object, so the precision the FSDP policy, autocast and MFU use is the one config.toml records.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from extrapos.run.config import RunConfig
from extrapos.run.parallelize import Parallel
from extrapos.run.precision import with_resolved_precision
from extrapos.run.runtime import init_distributed


@dataclass(frozen=True)
class Placement:
    cfg: RunConfig  # train.precision resolved on ``device``: "fp32" or "bf16", never "auto"
    device: torch.device  # under torchrun, this process's GPU (cuda:LOCAL_RANK)
    rank: int
    world: int
    parallel: Parallel

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def precision(self) -> str:
        return self.cfg.train.precision

    @classmethod
    def join(cls, cfg: RunConfig, device: torch.device) -> Placement:
        """``cfg`` (its precision resolved) on ``device`` (resolved from its train.device): this process
        joins torchrun's group, if any, and the parallel plan is checked (one sentence when it cannot
        work), before anything is written."""
        rank, world, device = init_distributed(device)
        return cls(cfg, device, rank, world, Parallel.of(cfg, device, world))

    @classmethod
    def given(
        cls,
        cfg: RunConfig,
        device: torch.device,
        rank: int = 0,
        world: int = 1,
        parallel: Parallel | None = None,
    ) -> Placement:
        """A ``Trainer`` built directly (a sweep's budget probe, a test) on a device, rank and world it
        chose: the precision resolved here, and the plan unless given."""
        cfg = with_resolved_precision(cfg, device)[0]
        return cls(cfg, device, rank, world, parallel or Parallel.of(cfg, device, world))
