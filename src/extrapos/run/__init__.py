"""The run layer: what a run of any command stands on, above the model and below every command.

``config`` (a run's TOML configuration, its defaults and checks), ``runtime`` (device, processes,
precision, data and the step plan), ``checkpoint`` (safetensors + JSON, written atomically),
``directory`` (a trained run directory, loaded back), ``parallelize`` (DDP / FSDP2 under torchrun),
``metrics`` (``metrics.jsonl``), ``lock`` (one process per run directory), ``perf`` (the matmul peak
MFU is measured against) and ``memory`` (estimates made before work starts). These modules import
the foundation, data, positions, attention and model layers, never a command; the package re-exports
nothing, so an import names its module (``from extrapos.run.config import RunConfig``).
"""
