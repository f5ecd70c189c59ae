"""Memory estimates made before work starts: what a no-grad forward holds, and what a device has free.

Commands that can be asked for arbitrarily long inputs (evaluation, passkey, synthetic tasks,
generation) estimate their largest forward from the run's config before loading the model, and
refuse in one sentence what cannot fit instead of being killed by the kernel mid-way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.model import ModelConfig


def available_bytes(device: str | torch.device) -> int:
    """Memory a task may use on ``device``: free GPU memory, or the host's available memory (within the
    cgroup's limit when one is set)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail or 1 << 62, int(limit) - used)
    except (OSError, ValueError):
        pass
    if avail is None:
        import os

        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 1 << 62  # unknown: only the estimate's own sanity applies
    return int(avail)


def forward_bytes(model_cfg: ModelConfig, tokens: int, rows: int = 1, cache: bool = False) -> int:
    """Bytes one no-grad forward of ``rows`` x ``tokens`` holds at once, in fp32 (an estimate from above,
    in Python integers so a huge request never overflows): the hidden states of one block (residual,
    normed input, q, k, v, attention output, the MLP's hidden layer, twice for a gated MLP), the
    attention path's keys and values of every layer when a KV cache is kept (tokens x layers x heads x
    head_dim x 2 x 4 bytes), and the token and position ids (int64)."""
    d = model_cfg.d_model
    hidden = model_cfg.mlp_hidden or 4 * d
    per_token = 4 * (6 * d + 2 * hidden) + 16
    if cache:
        per_token += model_cfg.n_layers * model_cfg.kv_heads * model_cfg.head_dim * 2 * 4
    return rows * tokens * per_token


def _size(n: int) -> str:
    for unit, scale in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.1f} KB"


def check_memory(need: int, device: str | torch.device, what: str, advice: str) -> None:
    """Refuse, in one sentence naming the limit, work whose estimate ``need`` exceeds the memory free on
    ``device``."""
    have = available_bytes(device)
    if need > have:
        raise UserError(
            f"{what} needs about {_size(need)} of memory and {torch.device(device).type} has "
            f"{_size(have)} available; {advice}."
        )
