"""The ``Evaluator`` protocol: every evaluation of a run (the loss at every length, its masked-LM form,
attention statistics, passkey, RULER, synthetic tasks, lm-eval) is one class registered here by name.

An evaluator has a ``name``, the typed request it takes (``request_type``: the fields its result is
keyed by) and the steps that are its own, which the one driver (``evaluate/driver.py``) calls in order:

* ``prepare(run, request, how)``: the request checked (every refusal of the request, of the run's kind
  and of a flag the evaluator cannot honour, in its own sentences) and the result's name;
* ``open_slot(prepared, how)``: its result slot, keyed as its results are (``evaluate/slot.py``);
* ``estimate(prepared, how)``: its memory and time, before any weights are loaded;
* ``score(prepared, slot, shard, how)``: the scoring alone, ``shard`` dealing its work out to the
  processes of a torchrun group (``runtime.Shard``, the one implementation); ``how`` says how the
  result is produced (its name, device, progress, ...), which no result is keyed by.

The driver reuses a saved result, writes a new one (atomically, on rank 0) and makes the shard; the
commands and ``compare`` call ``drive(evaluator(name), run, request, shard, how)``, and a sweep's task
column is ``column(run, spec, at, how)``: the request the column's options (``spec``) ask for at the
row's lengths and options (``at``), under a result name that the request fixes (``column_name``).

The registry names each class by its module and attribute (``REGISTERED``), imported only when asked:
the task evaluators live in ``tasks/`` and ``integrations/``, which import this package, so it cannot
import them back at its top. A new evaluator is its class and one line here.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from extrapos.errors import UserError
from extrapos.evaluate.slot import ResultSlot, slug
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard

#: name -> "module:class" of every evaluator
REGISTERED: dict[str, str] = {
    "eval": "extrapos.evaluate.next_token:NextTokenEvaluator",
    "mlm": "extrapos.evaluate.mlm:MaskedLMEvaluator",
    "attention": "extrapos.evaluate.attention_stats:AttentionEvaluator",
    "passkey": "extrapos.tasks.passkey:PasskeyEvaluator",
    "ruler": "extrapos.tasks.ruler:RulerEvaluator",
    "synthetic": "extrapos.tasks.synthetic:SyntheticEvaluator",
    "lm-eval": "extrapos.integrations.lm_eval:LmEvalEvaluator",
}


@dataclass(frozen=True)
class Scoring:
    """How a result is produced, beside what it measures: no result is keyed by these."""

    name: str | None = None  # the result's file name in RUN/eval/ (None: the evaluator's default)
    overwrite: bool = False
    device: str = "cpu"
    progress: bool = True
    force: bool = False  # score even when the work is estimated past an hour (``ask``) or a day
    batch_tokens: int = 16_384  # tokens per forward batch (the memory estimate counts one batch)
    # a command's own work: past an hour confirmed on a terminal (refused without one unless ``force``) and
    # shown with its progress (``run.timing``); a library call or a sweep does not ask
    ask: bool = False


#: an evaluator's request type (``Evaluator.request_type``)
R = TypeVar("R")


@dataclass
class Prepared(Generic[R]):
    """An evaluation ready to be scored (``Evaluator.prepare``): its run (config read), its checked
    request and its result name."""

    run: Run
    request: R
    name: str
    inputs: Any = None  # what the evaluator read while checking (e.g. RULER's QA sets), kept for scoring


@dataclass(frozen=True)
class ColumnAt:
    """Where a sweep row scores a task column: its lengths (multiples of ``base_length``, default the run's
    L_t) and its inference-time encoding options."""

    lengths: list[int] = field(default_factory=list)
    position_options: dict[str, Any] = field(default_factory=dict)
    base_length: int | None = None

    def where(self) -> dict[str, Any]:
        """The fields every task request shares, as its keywords."""
        return dict(
            lengths=list(self.lengths), position_options=self.position_options, base_length=self.base_length
        )


class Evaluator(Protocol[R]):
    """One evaluation of a run (see the module's docstring); ``evaluate.driver.drive`` calls its steps in
    order. ``R`` is its request type: a concrete evaluator subclasses ``Evaluator[ItsRequest]``."""

    name: ClassVar[str]
    request_type: ClassVar[type]
    refused_as: ClassVar[str]  # what a result holding a NaN is called when it is refused

    def prepare(self, run: Run | str | Path, request: R, how: Scoring) -> Prepared[R]:
        """The request checked (every refusal of the request, the run's kind or a flag), the run opened
        where it is first needed and the result's name."""
        ...

    def open_slot(self, prepared: Prepared[R], how: Scoring) -> ResultSlot:
        """The result's slot: a saved equal result is reused, another one refused unless overwritten."""
        ...

    def estimate(self, prepared: Prepared[R], how: Scoring) -> float | None:
        """The memory and time the work needs, refused before any weights are loaded; returns the time
        estimated in seconds (None: too small to estimate, or not estimated)."""
        ...

    def score(self, prepared: Prepared[R], slot: ResultSlot, shard: Shard, how: Scoring) -> dict[str, Any]:
        """The work: the result (not written), its jobs dealt out to ``shard``."""
        ...

    def options(self, request: R) -> dict[str, Any] | None:
        """The encoding options a refused result's sentence names."""
        ...

    def finish(self, slot: ResultSlot, result: dict[str, Any], written: bool, how: Scoring) -> None:
        """What follows the result (``written``: just written; else a saved one reused): the files derived
        from it (attention's plot) or a line on the console (lm-eval's reuse). Nothing by default: an
        evaluator that subclasses ``Evaluator`` inherits this."""
        return None


class ColumnEvaluator(Evaluator[R], Protocol[R]):
    """An evaluator a sweep scores as a task column (``compare/tasks.py``: attention, passkey, RULER,
    synthetic, lm-eval)."""

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """The column's request (``spec`` at ``at``) scored under the name it fixes (``column_name``)."""
        ...


class LossEvaluator(Evaluator[R], Protocol[R]):
    """The loss evaluation of a run (``loss_evaluator``): `extrapos eval` and a sweep's rows build their
    request as an ``evaluate.EvalRequest`` and each loss evaluator takes it as its own."""

    name_prefix: ClassVar[str]  # before a sweep's result names, so a run's two kinds of loss never meet

    def loss_request(self, run: Run, req: Any, mask_seed: int | None) -> Any:
        """``req`` (with `extrapos eval`'s --mask-seed) as this evaluator's request; what it cannot do
        refused (``Unsupported``)."""
        ...

    def format(self, result: dict[str, Any]) -> str:
        """The result as `extrapos eval` prints it."""
        ...


class Unsupported(UserError):
    """A request an evaluator cannot do, in `extrapos eval`'s words; ``what`` names the request's field
    (or ``torchrun``) so that another caller (a sweep) can say it in its own words."""

    def __init__(self, what: str, sentence: str):
        super().__init__(sentence)
        self.what = what


def evaluator(name: str) -> Evaluator[Any]:
    """The evaluator registered as ``name`` (a KeyError naming the registered ones otherwise: a caller's
    defect, never the user's input, which is checked against ``names()`` first)."""
    if name not in REGISTERED:
        raise KeyError(f"no evaluator {name!r}; registered: {', '.join(REGISTERED)}")
    module, attr = REGISTERED[name].split(":")
    cls = getattr(importlib.import_module(module), attr)
    return cls()


def column_evaluator(name: str) -> ColumnEvaluator[Any]:
    """The evaluator registered as ``name`` as a sweep's task column scores it."""
    return cast(ColumnEvaluator[Any], evaluator(name))


def names() -> list[str]:
    return list(REGISTERED)


def loss_evaluator(run: Run) -> LossEvaluator[Any]:
    """The loss evaluation a run takes: the masked-LM loss for an encoder (objective mlm), the next-token
    loss otherwise (also for a directory that holds no run: its evaluation then says so)."""
    return cast(LossEvaluator[Any], evaluator("mlm" if run.exists and run.is_encoder else "eval"))


def column_name(
    prefix: str, lengths: list[int], options: dict[str, Any], base_length: int | None, spec: Any
) -> str:
    """A sweep column's result name per request, so rows scoring one run at different lengths or options
    never collide, and a sweep whose task options changed scores again instead of meeting the earlier
    result under its name (the digest covers the task options ``spec``, a dataclass or a dict)."""
    keyed = spec if isinstance(spec, dict) else asdict(spec)
    digest = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:8]
    parts = [prefix] + (["ev" + "_".join(map(str, lengths))] if lengths else [])
    parts += [slug(f"{k}{v}") for k, v in sorted(options.items())]
    return "-".join(parts + ([f"base{base_length}"] if base_length else []) + [digest])
