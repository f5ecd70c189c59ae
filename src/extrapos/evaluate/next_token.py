"""The next-token evaluation of a decoder (`extrapos eval`): the request checked, its result slot, the
memory and time estimates, the protocol (documents or stream) and the result written."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

from extrapos.evaluate.documents import score_documents
from extrapos.evaluate.estimates import check_eval_memory, check_eval_time
from extrapos.evaluate.evaluator import Scoring
from extrapos.evaluate.request import (
    EvalRequest,
    check_lengths,
    check_request,
    default_name,
    resolve_request,
    result_key,
)
from extrapos.evaluate.slot import ResultSlot, check_result_name, jsonable, open_slot, results_dir
from extrapos.evaluate.stream import score_stream
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard


def evaluate(
    run_dir: Run | str | Path,
    req: EvalRequest | None = None,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = True,
    force: bool = False,
    shard: Shard | None = None,
) -> dict[str, Any]:
    """Evaluate a run (a directory, or a ``Run`` already open) at every length of ``req``; writes and
    returns ``RUN/eval/<name>.json``. Scoring estimated past a day is refused unless ``force``
    (``check_eval_time``)."""
    req = resolve_request(req or EvalRequest())
    check_request(req)
    handle = Run.of(run_dir)
    check_lengths(handle, req)
    name = check_result_name(name or default_name(req))
    slot = result_slot(handle, req, name, overwrite, progress)
    if slot.previous is not None:
        return slot.previous  # the same evaluation of the same weights was done: reuse it

    check_eval_memory(handle, req, device, batch_tokens)
    check_eval_time(handle, req, device, force)
    t0 = time.perf_counter()
    if req.protocol == "stream":
        scored = score_stream(handle, req, slot.ckpt, device, batch_tokens, progress, shard)
    else:
        scored = score_documents(handle, req, slot.ckpt, device, batch_tokens, progress, shard)
    run = scored.run
    result = {
        "name": name,
        "run": str(handle.path),
        "request": req.written(),
        "request_key": slot.request_key,
        "result_key": slot.key,
        "weights_sha256": slot.digest,
        "encoding": run.cfg.model.positions_plan().name,
        "encoding_options": jsonable(asdict(run.model.pos.options)),
        "applied": jsonable(req.position_options),
        "train_length": scored.L,
        "checkpoint_step": run.step,
        "tokenizer_hash": run.tokenizer.hash,  # reports never put two tokenizers' losses in one table
        "data_dir": scored.data_dir,
        "split": req.split if not req.corpus else "test",
        "protocol": req.protocol,
        "boundary": req.boundary,
        "selection": req.selection,
        "precision": req.precision,  # the forward's (bf16: autocast); the losses are fp32 either way
        **scored.facts,
        "results": scored.rows,
        "per_position": scored.per_position,
        "wall_time": time.perf_counter() - t0,
    }
    slot.write(result, req.position_options, "evaluation")  # rank 0 writes; every process waits for it
    return result


def result_slot(
    run: Run, req: EvalRequest, name: str, overwrite: bool, progress: bool, suffix: str = ""
) -> ResultSlot:
    """The slot (``evaluate.slot``) of ``RUN/eval/<name>.json`` for ``req``, keyed by the request and the
    checkpoint it scores (``suffix`` tells apart evaluations of the same request, e.g. the masked-LM one and
    its mask seed). The same request of an older checkpoint is evaluated again, and so is the same request
    as an older extrapos scored it, with spans from the first documents instead of spread over them."""
    ckpt, digest = run.checkpoint(req.step)
    key, request_key = result_key(req, ckpt.step, digest) + suffix, req.key() + suffix
    out_path = results_dir(run.path) / f"{name}.json"
    older: list[tuple[dict[str, Any], str | None]] = []
    if req.protocol == "documents" and req.selection != "first":
        first = replace(req, selection="first").key() + suffix
        note = (
            f"extrapos eval: {out_path} scored spans from the first held-out documents (an older "
            "extrapos); evaluating again with the targets spread over the documents."
        )
        older.append(({"request_key": first}, note if progress else None))

    def stale(previous: dict[str, Any]) -> str:
        return (
            f"extrapos eval: {out_path} scored checkpoint step {previous.get('checkpoint_step')}; the run is "
            f"now at step {ckpt.step}, evaluating again."
        )

    return open_slot(
        run.path,
        name,
        ckpt,
        digest,
        request={"request_key": request_key},
        result={"result_key": key},
        overwrite=overwrite,
        refusal="holds a different evaluation; pass --name to keep both or --overwrite to replace it.",
        older=older,
        stale=stale if progress else None,
        key=key,
        request_key=request_key,
    )


class NextTokenEvaluator:
    """`extrapos eval` of a decoder (``evaluate``): the next-token loss at every length, its windows dealt
    out to the processes of ``shard``."""

    name: ClassVar[str] = "eval"
    request_type: ClassVar[type] = EvalRequest

    def score(self, run: Run, request: EvalRequest, shard: Shard, how: Scoring) -> dict[str, Any]:
        return evaluate(
            run,
            request,
            name=how.name,
            overwrite=how.overwrite,
            device=how.device,
            progress=how.progress,
            force=how.force,
            shard=shard,
        )
