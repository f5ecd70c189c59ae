"""How a model is spread over torchrun's processes, and gathered back for a checkpoint.

``train.parallel`` chooses between two ways of data parallelism, both launched the standard way
(``torchrun --nproc_per_node=N -m extrapos train ...``):

- ``ddp``: every process holds the whole model; ``DistributedDataParallel`` all-reduces gradients.
- ``fsdp``: FSDP2 (PyTorch's ``torch.distributed.fsdp.fully_shard``, as torchtitan applies it):
  each block is sharded over the processes, then the root (embeddings, final norm, head and the
  positional encoding's own parameters); with ``train.precision = "bf16"`` a
  ``MixedPrecisionPolicy`` keeps fp32 master weights, computes with bf16 parameters and reduces
  gradients in fp32.

``train.activation_checkpointing`` recomputes every block's activations in the backward
(``torch.utils.checkpoint``, non-reentrant). The model itself (model.py) knows none of this.

Checkpoints keep one format for every world size: the sharded state is gathered into a full one
on rank 0 (``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True,
cpu_offload=True``) and written in the single-process layout of checkpoint.py, so ``eval``,
``generate`` and ``export`` read it unchanged and a run resumes on any number of processes. Loading
reads the files on rank 0 alone and broadcasts them into the shards.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from extrapos.errors import UserError
from extrapos.run import checkpoint as ckpt_io
from extrapos.run.config import RunConfig, TrainConfig

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    from extrapos.model import Decoder

__all__ = ["Parallel", "ParallelModel", "tied_names"]


@dataclass(frozen=True)
class Parallel:
    """How this launch spreads a model over torchrun's processes, decided once from the run's
    ``train`` settings and the world size (``Parallel.of`` checks them before anything is written).
    ``wrap`` applies it to a model; the trainer then asks the ``ParallelModel`` for the rest."""

    train: TrainConfig
    device: torch.device
    world: int

    @classmethod
    def of(cls, cfg: RunConfig, device: torch.device, world: int) -> Parallel:
        """The plan for ``cfg`` on ``world`` processes; a setting that cannot work is one sentence."""
        if cfg.train.parallel == "fsdp" and world < 2:
            raise UserError(
                'train.parallel = "fsdp" shards the model over several processes, but this is one '
                "process; launch with torchrun --nproc_per_node=N (N >= 2) or set train.parallel=ddp."
            )
        return cls(cfg.train, device, world)

    @property
    def sharded(self) -> bool:
        return self.train.parallel == "fsdp" and self.world > 1

    def wrap(self, model: Decoder) -> ParallelModel:
        """Apply activation checkpointing, then FSDP2 or DDP across processes, then torch.compile if
        asked.

        FSDP2 shards ``model`` in place (its parameters become DTensors), so an optimizer must be
        built from ``model`` after this call. Tied weights are read first: sharding hides them.
        """
        ties = tied_names(model)
        if self.train.activation_checkpointing:
            _checkpoint_blocks(model)
        stepped: nn.Module = model
        fsdp, ddp = None, None
        if self.sharded:
            fsdp = self._fully_shard(model)
        elif self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            stepped = ddp = DistributedDataParallel(model, device_ids=device_ids)
        if self.train.compile:
            # Dynamo's caches are per code object, not per model: the graphs of an earlier run in this
            # process (a sweep trains its rows one after another) are useless to this model but count
            # toward torch's recompile limit (8), past which the step silently runs eager; start clean
            torch.compiler.reset()
            stepped = cast(nn.Module, torch.compile(stepped))  # an OptimizedModule, an nn.Module
        return ParallelModel(self, model, stepped, ties, fsdp=fsdp, ddp=ddp)

    def _fully_shard(self, model: Decoder) -> FSDPModule:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        if self.train.precision == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            policy = MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        return fully_shard(model, mesh=mesh, mp_policy=policy)


def _checkpoint_blocks(model: Decoder) -> None:
    from torch.utils.checkpoint import checkpoint

    # the block's forward is wrapped in place rather than the block in a wrapper module, so parameter
    # names (and so checkpoints) are the same with and without activation checkpointing
    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


@dataclass
class ParallelModel:
    """A model spread by a ``Parallel``: the module the training steps run through, the gradient
    sync of each micro-batch, and its state gathered into (or loaded from) a single-process
    checkpoint."""

    parallel: Parallel
    model: nn.Module  # the model as built: FSDP2 sharded it in place, DDP and compile wrap it
    stepped: nn.Module  # what the forward and backward run through
    ties: dict[str, str] = field(default_factory=dict)  # tied_names, read before sharding
    fsdp: FSDPModule | None = None  # ``model`` itself, when sharded
    ddp: DistributedDataParallel | None = None  # the wrapper, when data parallel

    def gradient_sync(self, enabled: bool) -> AbstractContextManager[Any]:
        """Whether this micro-batch's backward reduces gradients across processes: only the last of a
        step does, the others accumulate locally (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``)."""
        if self.fsdp is not None:
            self.fsdp.set_requires_gradient_sync(enabled)
            return nullcontext()
        if self.ddp is not None and not enabled:
            return self.ddp.no_sync()
        return nullcontext()

    def gather_state(self, optimizer: torch.optim.Optimizer) -> ckpt_io.TensorState | None:
        """Sharded: the full model and optimizer state on rank 0 (None elsewhere), in the
        single-process layout; a collective every process must call. Not sharded: None (the model
        and optimizer are saved as they are)."""
        return _gather_state(self.model, optimizer, self.ties) if self.parallel.sharded else None

    def load_state(self, optimizer: torch.optim.Optimizer, ckpt: ckpt_io.Checkpoint) -> None:
        """Load a checkpoint of any world size into the model and its optimizer (a collective when
        sharded: rank 0 reads the files, the others receive their shards from it)."""
        if self.parallel.sharded:
            _load_state(self.model, optimizer, ckpt, self.ties)
        else:
            ckpt_io.load_weights(self.model, ckpt)
            ckpt_io.load_optimizer(optimizer, ckpt)


# ---- checkpoints -------------------------------------------------------------------------------


def tied_names(model: nn.Module) -> dict[str, str]:
    """Names of the state dict that share storage with another: dropped name -> kept name.

    The rule is safetensors' ``save_model`` (keep the alphabetically first name), so a gathered
    state written by ``save_checkpoint`` is the file a single process writes. Call it before
    sharding: after it, shared storage can no longer be seen.
    """
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict().items():
        if t.numel() == 0:  # every empty tensor has data pointer 0; none shares anything
            continue
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    ties = {}
    for names in groups.values():
        kept, *dropped = sorted(names)
        ties.update({name: kept for name in dropped})
    return ties


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The parameter names of each optimizer group, in the optimizer's order (= checkpoint indices)."""
    name_of: dict[int, str] = {}
    for name, p in model.named_parameters():
        name_of.setdefault(id(p), name)
    return [[name_of[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def _gather_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, ties: dict[str, str]
) -> ckpt_io.TensorState | None:
    """The full model and optimizer state on rank 0 (None elsewhere), in the single-process layout.

    A collective: every process must call it.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # a full state dict holds plain tensors (no DTensor shards) and the optimizer's usual two keys
    weights = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    optim = get_optimizer_state_dict(model, optimizer, options=options)
    if dist.get_rank() != 0:
        return None  # the full state exists on rank 0 alone
    state = cast(dict[str, dict[str, Any]], optim["state"])
    param_groups = cast(list[dict[str, Any]], optim["param_groups"])
    index = {name: i for i, name in enumerate(n for group in _param_names(model, optimizer) for n in group)}
    tensors: dict[str, torch.Tensor] = {}
    for name, param_state in state.items():
        for key, value in param_state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{index[name]}.{key}"] = t.detach().cpu().contiguous()
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
        for g in param_groups
    ]
    kept = {k: v.contiguous() for k, v in weights.items() if k not in ties}
    return ckpt_io.TensorState(kept, dict(ties), tensors, groups)


def _load_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: ckpt_io.Checkpoint, ties: dict[str, str]
) -> None:
    """Load a checkpoint of any world size into a sharded model and its optimizer.

    Rank 0 reads the files, the others receive their shards from it. A collective.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    names = _param_names(model, optimizer)
    if dist.get_rank() == 0:
        stored = ckpt_io.read_state(ckpt)
        weights = dict(stored.weights)
        for dropped, kept in ties.items():
            weights.setdefault(dropped, weights[kept])
        flat = [n for group in names for n in group]
        per_param: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in stored.optimizer.items():
            idx, _, state_name = key.partition(".")
            per_param.setdefault(flat[int(idx)], {})[state_name] = value
        groups = [{**g, "params": names[i]} for i, g in enumerate(stored.param_groups)]
        optim = {"state": per_param, "param_groups": groups}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, optim, options=options)
