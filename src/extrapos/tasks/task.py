"""A task defined in one place: its typed options, and from them its command, its sweep column, its checks and
its report section.

An evaluation task beyond the loss (passkey, RULER, a synthetic task, lm-eval, attention statistics, or a
researcher's own) is one ``Task`` subclass. The CLI (``cli/tasks.py``), a sweep (``compare/``) and the report
(``report/task_tables.py``) loop over the registry here and never name a task:

* ``columns``: the task's own options, a dataclass whose fields carry their help (``option``). A sweep's
  ``<key> = {...}`` table is built into it (one validator: ``schema.build``), the command's flags are made
  from its fields (``--key-digits`` from ``key_digits``), and the evaluator's request is the columns plus
  where they are scored (``WHERE``: the lengths, the encoding options, the base length, the checkpoint);
* ``evaluator``: its ``Evaluator`` (``evaluate/evaluator.py``) named ``"module:Class"`` and imported when
  asked, so this file stays free of torch (``extrapos --help`` never imports it);
* the command (``command``, ``run_command``), the sweep's checks before any row trains (``check_columns``,
  ``check_row``, ``check_row_tokens``, ``refuse_row_options``) and the report (the ``LengthReport`` hooks it
  inherits: the accuracy-per-length tables, intervals and plot every accuracy task shares, overridden where a
  task reports otherwise).

The registry holds the built-in tasks by name and the ``extrapos.tasks`` entry points of installed packages
(``plugins.py``): a package declares ``[project.entry-points."extrapos.tasks"] toy = "mypkg.toy:ToyTask"``
and its task is a command, a sweep column and a report section (docs/architecture.md, "add a task").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import types
import typing
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from extrapos.report.task_tables import LengthReport

if TYPE_CHECKING:
    from pathlib import Path

    from extrapos.model import ModelConfig
    from extrapos.run.config import RunConfig

#: the fields a request adds to a task's columns: where a command or a sweep row scores it
WHERE = ("lengths", "position_options", "base_length", "step")

#: name -> "module:Class" of the built-in tasks, in the order the report shows them
BUILTIN: dict[str, str] = {
    "synthetic": "extrapos.tasks.synthetic_task:SyntheticTask",
    "passkey": "extrapos.tasks.passkey_task:PasskeyTask",
    "ruler": "extrapos.tasks.ruler_task:RulerTask",
    "lm-eval": "extrapos.integrations.lm_eval_task:LmEvalTask",
    "attention": "extrapos.tasks.attention_task:AttentionTask",
}


def option(default: Any = dataclasses.MISSING, *, help: str = "", factory: Any = None, flag: str = "") -> Any:
    """A field of a task's columns with its help (the command's ``--help`` and the docs read it); ``flag``
    another spelling of its command-line flag."""
    metadata = {"help": help, "flag": flag}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class Command(Protocol):
    """What the command line gives a task's command (``cli/tasks.py`` makes it): the run opened once, the
    flags every scoring command shares read and checked in one way."""

    def lengths(self) -> list[int]:
        """``--lengths`` as integers (multiples of L_t)."""
        ...

    def position_options(self, lengths: list[int]) -> dict[str, Any]:
        """The inference-time encoding options of the flags, checked against the run."""
        ...

    def check_name(self) -> None:
        """``--name`` checked before any work."""
        ...

    def score(self, request: Any, device: Any, progress: bool, force: bool = False) -> dict[str, Any]:
        """The task's evaluator scores the command's run on ``request`` (its work dealt out to the processes
        of the torchrun group this one joined)."""
        ...

    def saved(self, result: dict[str, Any]) -> Path:
        """Where the result was written."""
        ...


class Task(LengthReport):
    """One evaluation task (see the module's docstring). A subclass sets ``name``, ``evaluator`` and
    ``columns`` and overrides what it does its own way."""

    name: ClassVar[str]
    evaluator: ClassVar[str]  # "module:Class" of its Evaluator
    columns: ClassVar[type]  # the task's options (a dataclass of ``option`` fields)
    # `extrapos <command>`: its one-line help and its description; None: no command in cli/tasks.py
    command: ClassVar[str | None] = None
    help: ClassVar[str] = ""
    description: ClassVar[str] = ""
    run_help: ClassVar[str] = "a run directory"
    # the flags every scoring command shares (--lengths, the encoding options, --step, --name, --overwrite,
    # --device, --no-progress); False: ``add_arguments`` makes them all (lm-eval spells them as lm-eval)
    common_flags: ClassVar[bool] = True
    default_lengths: ClassVar[str] = "1,2,4,8,16"  # the command's --lengths default
    plot_help: ClassVar[str] = ""  # the command writes a plot (--plot PATH: this help); "": no plot
    force_flag: ClassVar[bool] = False  # the command asks past an hour (--force)
    shows_saved: ClassVar[bool] = True  # the command prints where its result was saved
    # an extension row is scored at each of its factors' runs (False: once, on the largest factor's run)
    per_length: ClassVar[bool] = True

    @property
    def key(self) -> str:
        """The sweep's table of this task's options (``lm_eval = {...}`` for ``lm-eval``)."""
        return self.name.replace("-", "_")

    def make_evaluator(self) -> Any:
        """The task's ``Evaluator``, imported now."""
        return getattr(self.module(), self.evaluator.split(":")[1])()

    def module(self) -> Any:
        """The module of the task's evaluator, imported now: by name, as the evaluator is, since it imports
        the task's ``columns`` from the file defining the task (its request adds ``WHERE`` to them)."""
        return importlib.import_module(self.evaluator.split(":")[0])

    # ---- the command ---------------------------------------------------------------------------------

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The command's own flags: one per field of ``columns`` (``command_flags``), then
        ``extra_arguments``."""
        command_flags(parser, self.columns)
        self.extra_arguments(parser)

    def extra_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Flags of the command that are not options of a sweep column (none by default)."""

    def command_request(self, args: argparse.Namespace, cmd: Command, lengths: list[int]) -> Any:
        """The request of the command: its columns from the flags, where it is scored from ``cmd``."""
        raise NotImplementedError(f"the task {self.name!r} has no command")

    def run_command(self, args: argparse.Namespace, cmd: Command) -> list[str]:
        """`extrapos <command>`: the request scored; returns the lines the command prints (the result, the
        plot it wrote, where the result was saved)."""
        from extrapos.run.runtime import resolve_device

        lengths = cmd.lengths()
        request = self.command_request(args, cmd, lengths)
        cmd.check_name()
        device = resolve_device(args.device, "--device")
        result = cmd.score(request, device, not args.no_progress, getattr(args, "force", False))
        lines = [self.format(result)]
        if getattr(args, "plot", None):
            lines.append(f"-> {self.plot_result(result, args.plot)}")
        return lines + ([f"-> {cmd.saved(result)}"] if self.shows_saved else [])

    def format(self, result: dict[str, Any]) -> str:
        """The result as the command prints it."""
        return json.dumps(result.get("results"), indent=1)

    def plot_result(self, result: dict[str, Any], path: str) -> Path:
        """The command's --plot."""
        raise NotImplementedError(f"the task {self.name!r} draws no plot")

    # ---- a sweep's column ----------------------------------------------------------------------------

    def check_columns(self, spec: Any) -> None:
        """Every value of the sweep's options checked before its first row trains; a refusal is a UserError
        whose sentence starts with the option's name (the sweep prefixes its file and table)."""

    def check_row(self, spec: Any, model: ModelConfig, lengths: list[int]) -> None:
        """What one row's scoring needs, checked from the config it will train with before any row trains
        (a memory estimate); a UserError."""

    def check_row_tokens(self, spec: Any, cfg: RunConfig, run_dir: Path | None, lengths: list[int]) -> None:
        """What one row's prompts need of its tokenizer, checked before any row trains from the config it
        will train with (``cfg.data``: its tokenizer spec or prepared data, which a sweep may prepare only
        later; ``run_dir``: the run a ``run = ...`` row scores, with its own tokenizer, else None); a
        UserError. A check that cannot know the tokenizer yet uses a bound that never refuses what fits."""

    def refuse_row_options(self, spec: Any, options: dict[str, Any]) -> str | None:
        """The sentence refusing a row's ``eval`` options this column cannot apply (None: it applies them)."""
        return None

    def requires(self, spec: Any) -> str | None:
        """A sentence when the sweep's options leave out what the column needs (None: complete)."""
        return None


def _inner(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(hint) is typing.Union or isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return hint


def _list_parser(item: type, flag: str) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        parts = [x.strip() for x in text.split(",") if x.strip()]
        try:
            return [item(x) for x in parts]
        except ValueError:  # argparse's own error: "argument --depths: ...", exit status 2
            example = "0,0.5,1" if item is float else "1,2,4"
            raise argparse.ArgumentTypeError(
                f"expects numbers separated by commas (e.g. {example}), got {text!r}"
            ) from None

    return parse


def _json(flag: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be JSON, got {text!r}") from None

    return parse


def command_flags(parser: argparse.ArgumentParser, columns: type, skip: Sequence[str] = ()) -> None:
    """One flag per field of ``columns`` (``key_digits`` -> ``--key-digits``), typed by its annotation: a
    number or a string as such, a list comma-separated, a dict as JSON, a bool a switch; the default is the
    field's, the help its ``option`` help."""
    hints = typing.get_type_hints(columns)
    for f in dataclasses.fields(columns):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        names = [flag] + ([f.metadata["flag"]] if f.metadata.get("flag") else [])
        factory: Callable[[], Any] = f.default_factory  # type: ignore[assignment]
        default = f.default if f.default is not dataclasses.MISSING else factory()
        hint = _inner(hints[f.name])
        extra: dict[str, Any] = {}
        if hint is bool:
            extra = {"action": "store_true"}
        elif typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint) or (str,)
            extra = {"type": _list_parser(item, flag) if item in (int, float) else _list_parser(str, flag)}
        elif typing.get_origin(hint) is dict or hint is dict:
            extra = {"type": _json(flag)}
        elif hint in (int, float, str):
            extra = {"type": hint}
        parser.add_argument(*names, default=default, help=f.metadata.get("help") or None, **extra)


def columns_of(args: argparse.Namespace, columns: type) -> dict[str, Any]:
    """The fields of ``columns`` as the command line gave them."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(columns)}


@cache
def registry() -> dict[str, Task]:
    """name -> task: the built-in ones, then those of installed packages (``extrapos.tasks`` entry points),
    read once; a plug-in that fails to load or takes a taken name is named in one warning and skipped."""
    from extrapos import plugins

    found: dict[str, Task] = {}
    for name, target in BUILTIN.items():
        module, attr = target.split(":")
        found[name] = getattr(importlib.import_module(module), attr)()
    for ep in plugins.entry_points(plugins.TASKS):
        try:
            loaded = ep.load()
            task = loaded() if isinstance(loaded, type) else loaded
            if not isinstance(task, Task):
                raise TypeError(f"{ep.value} is not an extrapos.tasks.task.Task")
            if task.name in found:
                raise ValueError(f"the task name {task.name!r} is taken")
        except Exception as e:  # any plug-in failure is reported and skipped, never raised
            plugins.warn_broken("task", ep, e)
            continue
        found[task.name] = task
    return found


def names() -> list[str]:
    """Every registered task's name, the built-in ones first."""
    return list(registry())


def task(name: str) -> Task:
    """The task registered as ``name`` (a KeyError naming the registered ones: a caller's defect; user input
    is checked against ``names()`` first)."""
    found = registry()
    if name not in found:
        raise KeyError(f"no task {name!r}; registered: {', '.join(found)}")
    return found[name]
