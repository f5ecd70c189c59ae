"""The synthetic-task column defined in one place (``tasks/task.py``): accuracy on the answer tokens of a run
trained on a ``synthetic:`` corpus, at k x L_t (Kazemnejad et al. 2023, §4). Its scoring is
``tasks/synthetic.py``'s ``SyntheticEvaluator``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from extrapos.errors import UserError
from extrapos.tasks.task import Command, Task, columns_of, option

if TYPE_CHECKING:
    from collections.abc import Sequence

    from extrapos.model import ModelConfig


@dataclass
class SyntheticColumns:
    """A synthetic task's options: a command's flags and a sweep's ``synthetic = {...}``."""

    examples: int = option(64, help="examples per length")
    task: str | None = option(None, help="a synthetic: spec (default: the run's own task)")
    seed: int | None = option(None, help="the evaluation examples' seed (default: the task's)")


class SyntheticTask(Task):
    name: ClassVar[str] = "synthetic"
    evaluator: ClassVar[str] = "extrapos.tasks.synthetic:SyntheticEvaluator"
    columns: ClassVar[type] = SyntheticColumns
    command: ClassVar[str | None] = "synthetic-eval"
    help: ClassVar[str] = "answer accuracy of a run trained on a synthetic: task, at 1x..16x"
    description: ClassVar[str] = (
        "Score exact-match and per-token accuracy on the answer tokens of fresh examples of k x L_t tokens "
        "(the task the run was trained on, or --task)."
    )
    run_help: ClassVar[str] = "a run directory trained on a synthetic: corpus"
    shows_saved: ClassVar[bool] = False

    def command_request(self, args: argparse.Namespace, cmd: Command, lengths: list[int]) -> Any:
        options = cmd.position_options(lengths)
        return self.module().SyntheticOptions(
            **columns_of(args, self.columns), lengths=lengths, position_options=options, step=args.step
        )

    def format(self, result: dict[str, Any]) -> str:
        return str(self.module().format_synthetic(result))

    def check_columns(self, spec: Any) -> None:
        from extrapos.data.synthetic import SyntheticTask as Spec
        from extrapos.tasks.common import check_seed

        if spec.examples < 1:
            raise UserError(f"examples must be at least 1, got {spec.examples}")
        check_seed(spec.seed, "seed")
        if spec.task is not None:
            try:
                Spec.parse(spec.task)
            except UserError as e:
                raise UserError(f"task: {e}") from None

    def check_row(self, spec: Any, model: ModelConfig, lengths: list[int]) -> None:
        self.module().check_synthetic_memory(
            model,
            lengths,
            spec.examples,
            None,
            "cpu",
            advice="lower the sweep's lengths or synthetic.examples",
        )

    # ---- the report ----------------------------------------------------------------------------------

    def metrics(self, rows: Sequence[Any]) -> list[tuple[str, str]]:
        return [("token_accuracy", "token accuracy"), ("exact_match", "exact match")]

    def describe(self, rows: Sequence[Any]) -> str:
        first = next(row.tasks[self.name] for row in rows if self.name in row.tasks)
        req = first.get("request", {})
        return (
            f"Synthetic task `{first['task']}`, {req.get('examples', '?')} fresh examples of exactly ev x "
            "L_t "
            "tokens per length (never the training examples), scored teacher-forced on the answer tokens: "
            "per-token accuracy (argmax = answer) and exact match (every answer token of an example right)."
        )
