"""A toy evaluation task in one file: how well a run copies a random sequence it has just read.

Each example is a sequence of random tokens followed by itself (n = k x L_t tokens in all); a model that can
look back far enough predicts every token of the second half (the in-context copying that induction heads
do, Olsson et al. 2022). The score is the accuracy on the second half at each length.

Everything extrapos needs is here: the options (``RepeatColumns``, whose fields become the command's flags
and the sweep's ``toy_repeat = {...}`` table), the evaluator (its request, result slot and scoring) and the
task (its command, checks and report section). The package's pyproject.toml declares it:

    [project.entry-points."extrapos.tasks"]
    toy-repeat = "extrapos_toy.task:RepeatTask"

so that `extrapos toy-repeat RUN`, `tasks = ["toy-repeat"]` in a sweep and the report's section all work.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from extrapos.errors import UserError
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import ColumnAt, Evaluator, Prepared, Scoring, column_name
from extrapos.evaluate.slot import ResultSlot, check_result_name, task_slot
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard
from extrapos.tasks.common import examples_digest, load_task_run, task_result
from extrapos.tasks.task import Command, Task, columns_of, option


@dataclass
class RepeatColumns:
    """The task's own options: the command's flags and a sweep's ``toy_repeat = {...}``."""

    examples: int = option(8, help="random sequences per length")
    seed: int = option(0, help="the sequences' seed")


@dataclass
class RepeatRequest(RepeatColumns):
    """What a result is keyed by: the options, where they are scored (extrapos.tasks.task.WHERE)."""

    lengths: list[int] = field(default_factory=lambda: [1, 2])
    position_options: dict[str, Any] = field(default_factory=dict)
    base_length: int | None = None
    step: int | None = None


class RepeatEvaluator(Evaluator):
    name: ClassVar[str] = "toy-repeat"
    request_type: ClassVar[type] = RepeatRequest
    refused_as: ClassVar[str] = "result"

    def prepare(self, run: Run | str | Path, request: RepeatRequest, how: Scoring) -> Prepared:
        if request.examples < 1 or not request.lengths or min(request.lengths) < 1:
            raise UserError("toy-repeat needs at least one example and lengths of 1 or more.")
        lengths = "_".join(map(str, request.lengths))
        return Prepared(Run.open(run), request, check_result_name(how.name or f"toy-repeat-ev{lengths}"))

    def open_slot(self, prepared: Prepared, how: Scoring) -> ResultSlot:
        req = prepared.request
        return task_slot(prepared.run, prepared.name, asdict(req), req.step, how.overwrite)

    def estimate(self, prepared: Prepared, how: Scoring) -> float | None:
        return None  # a few short forwards

    def options(self, request: Any) -> dict[str, Any] | None:
        return request.position_options

    def score(self, prepared: Prepared, slot: ResultSlot, shard: Shard, how: Scoring) -> dict[str, Any]:
        import numpy as np
        import torch

        req = prepared.request
        run, L, applied = load_task_run(
            prepared.run, slot, how.device, req.base_length, req.position_options, max(req.lengths)
        )
        device = next(run.model.parameters()).device
        rng = np.random.default_rng(req.seed)
        cells = []
        for k in req.lengths:
            half = k * L // 2
            first = rng.integers(0, run.cfg.model.vocab_size, size=(req.examples, half))
            ids = np.concatenate([first, first], axis=1)
            x = torch.from_numpy(ids).to(device)
            positions = torch.arange(2 * half, device=device).expand(req.examples, -1)
            with torch.no_grad():
                logits = run.model.logits(run.model.hidden_states(x, positions))
            right = (logits[:, half - 1 : -1].argmax(-1) == x[:, half:]).sum(1).tolist()
            cells.append(
                {
                    "ev": k,
                    "length": 2 * half,
                    "token_accuracy": sum(right) / (half * req.examples),
                    # per example (numerators, denominators): what the report's intervals resample
                    "per_example": {"token_accuracy": [right, [half] * req.examples]},
                    "examples_digest": examples_digest(ids),
                }
            )
        run_dir = prepared.run.path
        return {
            **task_result(prepared.name, "toy-repeat", run_dir, asdict(req), run, applied, L, slot),
            "results": cells,
        }

    def column(self, run: Run, spec: RepeatColumns, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """A sweep's column: the request at the row's lengths, under a name the request fixes."""
        name = column_name("toy-repeat", at.lengths, at.position_options, at.base_length, spec)
        request = RepeatRequest(**at.where(), **asdict(spec))
        return drive(self, run, request, None, Scoring(name, device=how.device, progress=how.progress))


class RepeatTask(Task):
    name: ClassVar[str] = "toy-repeat"
    evaluator: ClassVar[str] = "extrapos_toy.task:RepeatEvaluator"
    columns: ClassVar[type] = RepeatColumns
    command: ClassVar[str | None] = "toy-repeat"
    help: ClassVar[str] = "toy plug-in task: accuracy copying a random sequence at 1x..2x"
    default_lengths: ClassVar[str] = "1,2"

    def command_request(self, args: argparse.Namespace, cmd: Command, lengths: list[int]) -> Any:
        options = cmd.position_options(lengths)
        return RepeatRequest(
            **columns_of(args, RepeatColumns), lengths=lengths, position_options=options, step=args.step
        )

    def format(self, result: dict[str, Any]) -> str:
        return "\n".join(
            ["| ev | length | copy accuracy |", "|---:|---:|---:|"]
            + [f"| {c['ev']} | {c['length']} | {c['token_accuracy']:.3f} |" for c in result["results"]]
        )

    def check_columns(self, spec: Any) -> None:
        if spec.examples < 1:
            raise UserError(f"examples must be at least 1, got {spec.examples}")

    def metrics(self, rows: Any) -> list[tuple[str, str]]:
        return [("token_accuracy", "copy accuracy")]

    def describe(self, rows: Any) -> str:
        return "Toy repeat (a plug-in task): accuracy predicting the second copy of a random sequence."
