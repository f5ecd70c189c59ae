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

import torch
from torch import nn

from extrapos import checkpoint as ckpt_io
from extrapos.config import RunConfig
from extrapos.errors import UserError

__all__ = [
    "check_parallel",
    "gather_state",
    "gradient_sync",
    "is_sharded",
    "load_state",
    "parallelize",
    "tied_names",
]


def check_parallel(cfg: RunConfig, world: int) -> None:
    """A setting that cannot work in this launch is one sentence, before anything is written."""
    if cfg.train.parallel == "fsdp" and world < 2:
        raise UserError(
            'train.parallel = "fsdp" shards the model over several processes, but this is one '
            "process; launch with torchrun --nproc_per_node=N (N >= 2) or set train.parallel=ddp."
        )


def is_sharded(cfg: RunConfig, world: int) -> bool:
    return cfg.train.parallel == "fsdp" and world > 1


def parallelize(model: nn.Module, cfg: RunConfig, device: torch.device, world: int) -> nn.Module:
    """Apply activation checkpointing, then FSDP2 or DDP across processes, then torch.compile if asked.

    Returns the module the training steps run through. FSDP2 shards ``model`` in place (its
    parameters become DTensors), so an optimizer must be built from ``model`` after this call.
    """
    check_parallel(cfg, world)
    if cfg.train.activation_checkpointing:
        _checkpoint_blocks(model)
    if is_sharded(cfg, world):
        _fully_shard(model, cfg, device, world)
    elif world > 1:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=device_ids)
    return torch.compile(model) if cfg.train.compile else model


def _checkpoint_blocks(model: nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    # the block's forward is wrapped in place rather than the block in a wrapper module, so parameter
    # names (and so checkpoints) are the same with and without activation checkpointing
    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def _fully_shard(model: nn.Module, cfg: RunConfig, device: torch.device, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    if cfg.train.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def gradient_sync(
    train_model: nn.Module, model: nn.Module, cfg: RunConfig, world: int, enabled: bool
) -> AbstractContextManager:
    """Whether this micro-batch's backward reduces gradients across processes: only the last of a
    step does, the others accumulate locally (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``)."""
    if world == 1:
        return nullcontext()
    if is_sharded(cfg, world):
        model.set_requires_gradient_sync(enabled)
        return nullcontext()
    return nullcontext() if enabled else train_model.no_sync()


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
    name_of = {}
    for name, p in model.named_parameters():
        name_of.setdefault(id(p), name)
    return [[name_of[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def gather_state(
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
    weights = get_model_state_dict(model, options=options)
    optim = get_optimizer_state_dict(model, optimizer, options=options)
    if dist.get_rank() != 0:
        return None
    index = {name: i for i, name in enumerate(n for group in _param_names(model, optimizer) for n in group)}
    tensors = {}
    for name, state in optim["state"].items():
        for key, value in state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{index[name]}.{key}"] = t.detach().cpu().contiguous()
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
        for g in optim["param_groups"]
    ]
    kept = {k: v.contiguous() for k, v in weights.items() if k not in ties}
    return ckpt_io.TensorState(kept, dict(ties), tensors, groups)


def load_state(
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

    weights: dict[str, torch.Tensor] = {}
    optim: dict = {}
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
