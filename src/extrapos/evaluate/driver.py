"""The one driver every evaluation goes through: an ``Evaluator`` (``evaluate/evaluator.py``) only checks its
request and scores; the driver does the rest, in the same order for all seven of them.

``drive(evaluator, run, request, shard, how)``:

1. ``evaluator.prepare``: the request checked (every refusal an evaluator makes of its request, its run's
   kind or its flags, before anything is read or written), the run opened where the evaluator first
   needs it, the result's name fixed;
2. ``evaluator.open_slot``: the result slot (``evaluate/slot.py``): a saved equal result is returned as it
   is, another request under the name refused unless ``how.overwrite``, the name's lock held;
3. ``evaluator.estimate``: the memory and time the work needs, refused before any weights are loaded (a
   command's work estimated past an hour is confirmed first, and then shows its progress: ``run.timing``);
4. ``evaluator.score``: the work itself, its jobs dealt out to the processes of ``shard`` (default the
   torchrun group this process joined: ``run.runtime.Shard``, the one implementation of the sharding);
5. the write: atomic, on rank 0, refused when the result holds a NaN (``ResultSlot.write``);
6. ``evaluator.finish``: the files derived from its result (attention's plot), after a write and for a
   reused result (the protocol's default does nothing).

A refusal after the slot was opened lets the name's lock go before it is raised.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from extrapos.evaluate.evaluator import Evaluator, Prepared, Scoring
from extrapos.evaluate.slot import ResultSlot
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard, process_group
from extrapos.run.timing import shows_progress


def drive(
    evaluator: Evaluator,
    run: Run | str | Path,
    request: Any,
    shard: Shard | None = None,
    how: Scoring | None = None,
) -> dict[str, Any]:
    """Score ``run`` with ``evaluator`` on ``request`` (see the module's docstring); returns the result,
    written to (or read back from) ``RUN/<folder>/<name>.json``."""
    how = how or Scoring()
    prepared = evaluator.prepare(run, request, how)
    slot = evaluator.open_slot(prepared, how)
    if slot.previous is not None:
        evaluator.finish(slot, slot.previous, False, how)  # files derived from it (attention's plot)
        return slot.previous  # the same evaluation of the same weights was done: reuse it
    try:
        seconds = evaluator.estimate(prepared, how)
        if shows_progress(how.progress, seconds, how.ask) and process_group()[0] == 0:
            how = replace(how, progress=True)
        result = evaluator.score(prepared, slot, shard or group_shard(how.device), how)
    except BaseException:
        slot.release()
        raise
    write(evaluator, prepared, slot, result)
    evaluator.finish(slot, result, True, how)
    return result


def write(evaluator: Evaluator, prepared: Prepared, slot: ResultSlot, result: dict[str, Any]) -> None:
    """The result written through its slot, refused in one sentence naming the request's encoding options
    when it holds a NaN or an infinity."""
    slot.write(result, evaluator.options(prepared.request), evaluator.refused_as)


def group_shard(device: str) -> Shard:
    """The torchrun group this process joined (a group of one outside torchrun), reducing on ``device``
    (NCCL reduces CUDA tensors; "auto" read as the evaluation loads its model)."""
    from extrapos.run.runtime import process_group, resolve_device

    if process_group()[1] == 1:
        return Shard()
    return Shard.of_group(resolve_device(device, "device"))
