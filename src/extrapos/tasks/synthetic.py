"""Accuracy of a run on a synthetic task (``extrapos.data.synthetic``) at k x its training length.

Examples of length exactly k x L_t are generated fresh (their own seeded stream, never the training
examples) and scored teacher-forced: at every answer position the model's greedy prediction
(argmax) is compared with the answer token. Reported per length: per-token accuracy, per-example
exact match (every answer token right), and the mean cross-entropy on answer tokens, the
length-generalization protocol of Kazemnejad et al. (2023, §4).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from extrapos.data.synthetic import SyntheticTask, build_tokenizer, task_of
from extrapos.errors import UserError
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import ColumnAt, Evaluator, Prepared, Scoring, column_name
from extrapos.evaluate.slot import ResultSlot, slug, task_slot
from extrapos.run.handle import Run
from extrapos.run.memory import check_memory, forward_bytes
from extrapos.run.runtime import Shard
from extrapos.tasks.common import (
    check_seed,
    examples_digest,
    given_options,
    refuse_encoder,
    resolve_position_options,
    task_result,
)
from extrapos.tasks.synthetic_task import SyntheticColumns

if TYPE_CHECKING:
    from extrapos.model import Decoder, ModelConfig


@torch.no_grad()
def score_examples(
    model: Decoder, ids: np.ndarray, answer: np.ndarray, batch_tokens: int = 16_384
) -> dict[str, Any]:
    """Teacher-forced accuracy on the answer tokens of equal-length examples ``ids`` (N, n + 1)."""
    device = next(model.parameters()).device
    n = ids.shape[1] - 1
    per_batch = max(1, batch_tokens // n)
    positions = torch.arange(n, device=device).unsqueeze(0)
    correct_tokens = total_tokens = exact = 0
    loss_sum = 0.0
    example_correct: list[int] = []
    example_tokens: list[int] = []
    for s in range(0, len(ids), per_batch):
        x = torch.from_numpy(ids[s : s + per_batch]).to(device)
        mask = torch.from_numpy(answer[s : s + per_batch, 1:]).to(device)
        h = model.hidden_states(x[:, :-1], positions.expand(x.shape[0], -1))
        logits = model.logits(h[mask]).float()
        targets = x[:, 1:][mask]
        right = logits.argmax(-1) == targets
        loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        correct_tokens += int(right.sum())
        total_tokens += int(mask.sum())
        per_row = torch.zeros(x.shape[0], dtype=torch.long, device=device)
        per_row.index_add_(0, mask.nonzero()[:, 0], (~right).long())
        exact += int((per_row == 0).sum())
        answer_per_row = mask.sum(dim=1)
        example_correct += (answer_per_row - per_row).tolist()
        example_tokens += answer_per_row.tolist()
    exact_per_example = [int(c == t) for c, t in zip(example_correct, example_tokens)]
    return {
        "examples": int(len(ids)),
        "answer_tokens": total_tokens,
        "token_accuracy": correct_tokens / max(total_tokens, 1),
        "exact_match": exact / max(len(ids), 1),
        "answer_loss": loss_sum / max(total_tokens, 1),
        # per example (numerators, denominators): what the report's bootstrap intervals resample
        "per_example": {
            "token_accuracy": [example_correct, example_tokens],
            "exact_match": [exact_per_example, [1] * len(exact_per_example)],
        },
        "examples_digest": examples_digest(ids, answer),
    }


@dataclass
class SyntheticOptions(SyntheticColumns):
    """What a synthetic-task evaluation asks for, recorded as its result's request (equal requests reuse
    it): the task's options (``SyntheticColumns``: ``examples`` fresh examples per length, of ``task``, a
    ``synthetic:...`` spec, default the task the run trained on, its prepared data's manifest, drawn with
    ``seed``, default the task's) at ``lengths`` x L_t (``base_length``, default the run's);
    ``position_options`` are set on the encoding; ``step``: the checkpoint (default the latest)."""

    lengths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    position_options: dict[str, Any] = field(default_factory=dict)
    base_length: int | None = None
    step: int | None = None

    def checked(self) -> SyntheticOptions:
        """The options checked before any work, lengths sorted and made distinct."""
        if not self.lengths or any(int(k) != k or k < 1 for k in self.lengths):
            raise UserError(
                "synthetic evaluation lengths must be positive integers (multiples of L_t), e.g. 1,2,4."
            )
        if self.examples < 1:
            raise UserError(f"examples must be at least 1, got {self.examples}.")
        check_seed(self.seed)
        return replace(
            self,
            lengths=sorted({int(k) for k in self.lengths}),
            position_options=dict(self.position_options or {}),
        )


def score_synthetic(
    run_dir: Run | str | Path,
    options: SyntheticOptions | None = None,
    *,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    """Score a run on its synthetic task (``SyntheticOptions``, any of whose fields may be given as
    keywords instead); writes and returns ``RUN/eval/NAME.json``. A length whose examples cannot fit in
    memory is refused before the model is loaded; ``progress`` shows a bar over the lengths.
    """
    how = Scoring(name, overwrite, device, progress, batch_tokens=batch_tokens)
    return drive(SyntheticEvaluator(), run_dir, given_options(SyntheticOptions, options, fields), None, how)


def prepare_synthetic(
    run_dir: Run | str | Path, opts: SyntheticOptions, how: Scoring
) -> Prepared[SyntheticOptions]:
    """The options checked, the memory estimated and the run loaded before its slot: the request names the
    task, which may be the run's own (read from its data). ``Prepared.inputs``: (the loaded run, the
    task, the request the result records)."""
    from extrapos.run.directory import load_run

    name, device, batch_tokens = how.name, how.device, how.batch_tokens
    opts = opts.checked()
    lengths, examples = opts.lengths, opts.examples
    if opts.task is not None:
        SyntheticTask.parse(opts.task)  # a malformed spec is named before the run is loaded
    handle = Run.open(run_dir)
    run_dir = handle.path
    refuse_encoder(handle, "synthetic-eval")
    check_synthetic_memory(handle.cfg.model, lengths, examples, opts.base_length, device, batch_tokens)
    # the request names the task, which may be the run's own: read from its data before the slot
    run = load_run(handle, device=device, step=opts.step)
    t: SyntheticTask | None
    if opts.task is not None:
        t = SyntheticTask.parse(opts.task)
    else:
        t = task_of(run.data_dir) if run.data_dir is not None else None
        if t is None:
            raise UserError(
                f"{run_dir} was not trained on a synthetic corpus (or its data moved); pass "
                "task='synthetic:TASK[:options]' (--task) to say which task to score."
            )
    if run.tokenizer.hash != build_tokenizer(t.task).hash:
        raise UserError(
            f"{run_dir} does not use the synthetic vocabulary; train it on a synthetic: corpus with "
            'data.tokenizer = "synthetic" first.'
        )
    request = {**asdict(opts), "task": t.spec}
    name = name or "-".join(
        ["synthetic", t.task] + [slug(f"{k}{v}") for k, v in sorted(opts.position_options.items())]
    )
    return Prepared(handle, opts, name, (run, t, request))


def score_task(prepared: Prepared[SyntheticOptions], slot: ResultSlot, how: Scoring) -> dict[str, Any]:
    """The synthetic task's accuracy at every length (``SyntheticEvaluator.score``): the result to write."""
    opts, name, (run, t, request) = prepared.request, prepared.name, prepared.inputs
    lengths, examples, batch_tokens, progress = opts.lengths, opts.examples, how.batch_tokens, how.progress
    run_dir = prepared.run.path
    t0 = time.perf_counter()
    L = opts.base_length or run.cfg.model.train_length
    options_applied = resolve_position_options(opts.position_options, max(lengths) * L)
    if options_applied:
        run.model.pos.set_options(**options_applied)
    from tqdm.auto import tqdm

    rows = []
    for k in tqdm(lengths, disable=not progress, desc=f"synthetic-eval {run_dir.name}"):
        ids, answer = t.eval_examples(k * L, examples, opts.seed)
        rows.append({"ev": k, "length": k * L, **score_examples(run.model, ids, answer, batch_tokens)})
    result = {
        **task_result(name, t.spec, run_dir, request, run, options_applied, L, slot),
        "results": rows,
        "wall_time": time.perf_counter() - t0,
    }
    return result


def check_synthetic_memory(
    source: ModelConfig | str | Path,
    lengths: Sequence[int],
    examples: int,
    base_length: int | None,
    device: str,
    batch_tokens: int = 16_384,
    advice: str = "ask for shorter --lengths or fewer --examples",
) -> None:
    """Refuse before loading the model a length whose examples cannot fit in memory: the ``examples``
    rows of ids (int64) and answer flags (each held twice while they are stacked), then one batch's
    forward (``run.memory.forward_bytes``). ``source``: a run directory, or a model config (a sweep's row
    before it is trained)."""
    from extrapos.model import ModelConfig
    from extrapos.run.config import load_run_config

    model = source if isinstance(source, ModelConfig) else load_run_config(Path(source)).model
    L = base_length or model.train_length
    T = max(lengths) * L + 1
    rows = min(examples, max(1, batch_tokens // T))
    need = examples * T * 18 + forward_bytes(model, T, rows)  # ids and answer flags, built then stacked
    check_memory(
        need,
        device,
        f"{examples} synthetic examples of {max(lengths)} x {L} = {T - 1} tokens",
        advice,
    )


def format_synthetic(result: dict[str, Any]) -> str:
    """A markdown table: accuracy per length."""
    lines = [
        f"{result['task']}  encoding={result['encoding']}  L_t={result['train_length']}",
        "| ev | length | token accuracy | exact match | answer loss |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['ev']} | {r['length']} | {r['token_accuracy']:.3f} | {r['exact_match']:.3f} | "
            f"{r['answer_loss']:.3f} |"
        )
    return "\n".join(lines)


class SyntheticEvaluator(Evaluator[SyntheticOptions]):
    """Accuracy on a synthetic task's answer tokens (``score_synthetic``; Kazemnejad et al. 2023, §4), every
    process scoring the whole task (the same numbers)."""

    name: ClassVar[str] = "synthetic"
    request_type: ClassVar[type] = SyntheticOptions
    refused_as: ClassVar[str] = "result"

    def prepare(
        self, run: Run | str | Path, request: SyntheticOptions, how: Scoring
    ) -> Prepared[SyntheticOptions]:
        return prepare_synthetic(run, request, how)

    def open_slot(self, prepared: Prepared[SyntheticOptions], how: Scoring) -> ResultSlot:
        request = prepared.inputs[2]
        return task_slot(prepared.run, prepared.name, request, prepared.request.step, how.overwrite)

    def estimate(self, prepared: Prepared[SyntheticOptions], how: Scoring) -> float | None:
        """Nothing more: the memory was estimated before the run was loaded (``prepare_synthetic``)."""

    def options(self, request: SyntheticOptions) -> dict[str, Any]:
        return request.position_options

    def score(
        self, prepared: Prepared[SyntheticOptions], slot: ResultSlot, shard: Shard, how: Scoring
    ) -> dict[str, Any]:
        return score_task(prepared, slot, how)

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """A sweep's synthetic column (no progress bar: its lengths are few and quick)."""
        name = column_name("synthetic", at.lengths, at.position_options, at.base_length, spec)
        return score_synthetic(
            run, SyntheticOptions(**at.where(), **asdict(spec)), name=name, device=how.device
        )
