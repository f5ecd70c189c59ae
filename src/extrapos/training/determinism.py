"""``train.deterministic``: torch's deterministic kernels for the length of one run.

On a GPU, several kernels of a training step accumulate in an order that changes from call to call
(the embedding's backward, attention's backward), so two runs of one config part in the last bits
after a step and visibly after a few dozen. With ``train.deterministic`` the run asks torch for its
deterministic algorithms, strictly: on an H200, ``warn_only`` left two runs of 16 bf16 steps 1.4e-3
apart in loss with cuDNN's attention and 4.5e-2 with flash attention, whose backward takes its
deterministic form only when determinism is strict (torch's own warning says so). An operation with
no deterministic form then stops the run with one sentence naming it (earlier checkpoints stay and
resume). cuDNN's attention, which has none, is switched off, and cuBLAS gets its fixed workspace
(``CUBLAS_WORKSPACE_CONFIG``, torch's reproducibility notes). The settings are process-wide in torch,
so they are restored when the run returns: a caller that trains twice in one process (a sweep, a
check) gets each run's own setting.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from extrapos.errors import UserError

#: cuBLAS's workspace for reproducible results (torch's "Reproducibility" notes; either value works)
CUBLAS_WORKSPACE = ":4096:8"


@contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """Deterministic kernels inside the block when ``enabled``; torch's earlier settings after it."""
    if not enabled:
        yield
        return
    was = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    except RuntimeError as e:  # torch's alert: "<op> does not have a deterministic implementation ..."
        if "deterministic" not in str(e):
            raise
        first = str(e).strip().splitlines()[0].split(", but you set")[0]
        raise UserError(
            f"train.deterministic: {first}; set train.deterministic = false for this run "
            "(its checkpoints so far resume either way)."
        ) from e
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn_only)
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
