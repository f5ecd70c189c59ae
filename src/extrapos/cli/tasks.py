"""`extrapos <task command>`: one command per registered task that has one (``tasks/task.py``: passkey, ruler,
synthetic-eval, lm-eval and those of installed plug-ins). This file names no task: each task's flags come from
its options, and its command is its own ``run_command``, given the flags every scoring command shares."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extrapos.cli.eval import add_position_flags

if TYPE_CHECKING:
    from extrapos.run.handle import Run
    from extrapos.tasks.task import Task


def _add_result_flags(p: argparse.ArgumentParser) -> None:
    """Which checkpoint is scored, where the result goes, and on which device."""
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--name", default=None, help="result name in RUN/eval/")
    p.add_argument("--overwrite", action="store_true", help="replace an existing different result")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")


def register(sub: Any) -> None:
    from extrapos.tasks.task import registry

    for task in registry().values():
        if task.command is None:
            continue
        p = sub.add_parser(task.command, help=task.help, description=task.description)
        p.add_argument("run", help=task.run_help)
        if task.common_flags:
            p.add_argument("--lengths", default=task.default_lengths, help="multiples of the training length")
        task.add_arguments(p)
        if task.common_flags:
            add_position_flags(p)
            _add_result_flags(p)
            if task.plot_help:
                p.add_argument("--plot", default=None, help=task.plot_help)
            if task.force_flag:
                p.add_argument(
                    "--force",
                    action="store_true",
                    help="score without asking when it is estimated past an hour, and past a day",
                )
            p.add_argument("--no-progress", action="store_true")
        p.set_defaults(func=run_task, task_command=task.name)


class TaskCommand:
    """What a task's command is given (``tasks.task.Command``): the run opened once for the command (each
    of its files read once) and the shared flags read and checked one way."""

    def __init__(self, args: argparse.Namespace, task: Task):
        self.args = args
        self.task = task
        self._run: Run | None = None

    @property
    def run(self) -> Run:
        from extrapos.cli.eval import open_run

        if self._run is None:
            self._run = open_run(self.args.run)
        return self._run

    def lengths(self) -> list[int]:
        from extrapos.cli.eval import parse_lengths

        return parse_lengths(self.args.lengths)

    def position_options(self, lengths: list[int]) -> dict[str, Any]:
        """The inference-time encoding changes the flags ask for, checked against the run."""
        from extrapos.cli.eval import check_position_options, position_options

        options = position_options(self.args, lengths)
        check_position_options(self.run, options)
        return options

    def name(self) -> str | None:
        """--name checked before any work: a file name in RUN/eval/, never a path."""
        from extrapos.evaluate import check_result_name

        return None if self.args.name is None else check_result_name(self.args.name)

    def check_name(self) -> None:
        self.name()

    def score(self, request: Any, device: Any, progress: bool, force: bool = False) -> dict[str, Any]:
        from extrapos.evaluate.driver import drive
        from extrapos.evaluate.evaluator import Scoring
        from extrapos.run.runtime import Shard

        how = Scoring(self.name(), self.args.overwrite, str(device), progress, force, ask=True)
        return drive(self.task.make_evaluator(), self.run, request, Shard.of_group(device), how)

    def saved(self, result: dict[str, Any]) -> Path:
        return Path(self.args.run) / "eval" / (result["name"] + ".json")


def run_task(args: argparse.Namespace) -> int:
    """The command of the task ``args.task_command``: the lines it returns printed."""
    from extrapos.tasks.task import task

    chosen = task(args.task_command)
    for line in chosen.run_command(args, TaskCommand(args, chosen)):
        print(line)
    return 0
