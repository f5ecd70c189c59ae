"""The next-token evaluation of a decoder (`extrapos eval`): the request checked, its result slot, the
memory and time estimates and the protocol (documents or stream); ``evaluate.driver`` runs them and
writes the result."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

from extrapos.evaluate.documents import score_documents
from extrapos.evaluate.driver import drive
from extrapos.evaluate.estimates import check_eval_memory, check_eval_time
from extrapos.evaluate.evaluator import Evaluator, Prepared, Scoring, Unsupported
from extrapos.evaluate.format import format_result
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
    (``check_eval_time``). The evaluation is ``NextTokenEvaluator`` through the driver."""
    how = Scoring(name, overwrite, device, progress, force, batch_tokens)
    return drive(NextTokenEvaluator(), run_dir, req or EvalRequest(), shard, how)


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


class NextTokenEvaluator(Evaluator[EvalRequest]):
    """`extrapos eval` of a decoder: the next-token loss at every length (the documents or the stream
    protocol), its windows dealt out to the processes of ``shard``."""

    name: ClassVar[str] = "eval"
    request_type: ClassVar[type] = EvalRequest
    refused_as: ClassVar[str] = "evaluation"
    name_prefix: ClassVar[str] = ""

    def loss_request(self, run: Run, req: EvalRequest, mask_seed: int | None) -> EvalRequest:
        """``req`` itself; a mask seed (an encoder's) refused."""
        if mask_seed is not None:
            raise Unsupported(
                "mask_seed",
                f"--mask-seed applies to encoder runs (objective mlm) only and {run.path} is a decoder; "
                "drop it.",
            )
        return req

    def format(self, result: dict[str, Any]) -> str:
        return format_result(result)

    def prepare(self, run: Run | str | Path, request: EvalRequest, how: Scoring) -> Prepared[EvalRequest]:
        req = resolve_request(request)
        check_request(req)
        handle = Run.open(run)
        check_lengths(handle, req)
        return Prepared(handle, req, check_result_name(how.name or default_name(req)))

    def open_slot(self, prepared: Prepared[EvalRequest], how: Scoring) -> ResultSlot:
        return result_slot(prepared.run, prepared.request, prepared.name, how.overwrite, how.progress)

    def estimate(self, prepared: Prepared[EvalRequest], how: Scoring) -> float | None:
        check_eval_memory(prepared.run, prepared.request, how.device, how.batch_tokens)
        return check_eval_time(prepared.run, prepared.request, how.device, how.force, how.ask)

    def options(self, request: EvalRequest) -> dict[str, Any]:
        return request.position_options

    def score(
        self, prepared: Prepared[EvalRequest], slot: ResultSlot, shard: Shard, how: Scoring
    ) -> dict[str, Any]:
        handle, req = prepared.run, prepared.request
        t0 = time.perf_counter()
        protocol = score_stream if req.protocol == "stream" else score_documents
        scored = protocol(handle, req, slot.ckpt, how.device, how.batch_tokens, how.progress, shard)
        run = scored.run
        return {
            "name": prepared.name,
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
