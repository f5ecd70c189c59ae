"""The ``Evaluator`` protocol: every evaluation of a run (the loss at every length, its masked-LM form,
attention statistics, passkey, RULER, synthetic tasks, lm-eval) is one class registered here by name.

An evaluator has a ``name``, the typed request it takes (``request_type``: the fields its result is
keyed by) and two ways in:

* ``score(run, request, shard, how)``: the evaluation of one ``run.handle.Run`` (what the commands
  call); ``shard`` deals its work out to the processes of a torchrun group (``runtime.Shard``, the one
  implementation), ``how`` says how the result is produced (its name, device, progress, ...), which
  no result is keyed by;
* ``column(run, spec, at, how)``: a sweep's task column for one run (``compare/tasks.py``): the
  request the column's options (``spec``) ask for at the row's lengths and options (``at``), under a
  result name that the request fixes (``column_name``).

Every evaluator reads and writes its result through the slot they share (``evaluate/slot.py``: reuse,
refusal, one atomic finite write on rank 0) and estimates its memory and time before loading weights.

The registry names each class by its module and attribute (``REGISTERED``), imported only when asked:
the task evaluators live in ``tasks/`` and ``integrations/``, which import this package, so it cannot
import them back at its top. A new evaluator is its class and one line here.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

from extrapos.evaluate.slot import slug
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
    force: bool = False  # score even when the work is estimated past a day


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


class Evaluator(Protocol):
    """One evaluation of a run (see the module's docstring)."""

    name: ClassVar[str]
    request_type: ClassVar[type]

    def score(self, run: Run, request: Any, shard: Shard, how: Scoring) -> dict[str, Any]: ...

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]: ...


def evaluator(name: str) -> Evaluator:
    """The evaluator registered as ``name`` (a KeyError naming the registered ones otherwise: a caller's
    defect, never the user's input, which is checked against ``names()`` first)."""
    if name not in REGISTERED:
        raise KeyError(f"no evaluator {name!r}; registered: {', '.join(REGISTERED)}")
    module, attr = REGISTERED[name].split(":")
    cls = getattr(importlib.import_module(module), attr)
    return cls()


def names() -> list[str]:
    return list(REGISTERED)


def loss_evaluator(run: Run) -> Evaluator:
    """The loss evaluation a run takes: the masked-LM loss for an encoder (objective mlm), the next-token
    loss otherwise."""
    return evaluator("mlm" if run.is_encoder else "eval")


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
