"""RULER-style long-context tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?", §3): seven generated tasks scored per task and length.

* retrieval: ``niah_single`` (one needle, one key), ``niah_multikey`` (several needles with distinct keys,
  one asked: the other keys' values are the distractors), ``niah_multivalue`` (one key, several values:
  all of them, in order), ``niah_multiquery`` (several keys asked at once);
* multi-hop tracing: ``vt`` (variable tracking: which variables a chain of assignments gives a value,
  beside a second chain);
* aggregation: ``cwe`` (the most common words of a list) and ``fwe`` (the most frequent words of a list
  whose counts follow Zipf's law).

The tasks' words come from ``extrapos.data.synthetic.ruler_content``, the generator that also makes the
``synthetic:ruler`` training corpus; here they are joined by spaces into the run's own tokens and hidden in a
haystack of filler sentences or held-out corpus text (``extrapos.tasks.passkey.PasskeyBuilder``: the needles
go between sentences / words). An example of length n is n + 1 tokens, the prompt then the answer: the model
reads n of them, so at 1x the answer's last token is predicted at position L_t - 1, as in training.

Scoring follows ``extrapos passkey``: ``rank`` (default) compares the log-likelihood of the answer tokens
with ``candidates - 1`` wrong answers of the same token length (the distractors found in the context first,
then random answers of the same shape; chance 1 / candidates), ``generate`` checks the greedy continuation
token for token, ``both`` does both. Tiny base models cannot follow RULER's instructions, so the question
is phrased to be continued by the answer ("... The magic number for apple is").
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from extrapos.data.synthetic import RULER_TASKS, RULER_WORDS, RulerContent, assemble_ruler
from extrapos.errors import UserError
from extrapos.evaluate.slot import check_result_name, slug, task_slot
from extrapos.tasks.common import (
    accuracy_heatmap,
    check_seed,
    computed_metrics,
    continuation_logprobs,
    examples_digest,
    format_every_metric,
    given_options,
    greedy_batch,
    load_task_run,
    refuse_encoder,
    task_result,
)
from extrapos.tasks.passkey import MODES, PasskeyBuilder, check_passkey_memory, primary_metric

#: draws of random wrong answers per candidate before a request is refused
_DRAWS = 200


def check_shape(pairs: int, queries: int, digits: int) -> None:
    """The needles' counts and the values' digits: every key distinct (half the word pool at most, as the
    variable-tracking chains take six), every asked key a stored one, values of at least one digit."""
    if not 1 <= queries <= pairs <= len(RULER_WORDS) // 2:
        raise UserError(
            f"--pairs and --queries need 1 <= queries <= pairs <= {len(RULER_WORDS) // 2}, got pairs "
            f"{pairs} and queries {queries}."
        )
    if not 1 <= digits <= 18:
        raise UserError(f"--digits must be between 1 and 18, got {digits}.")


@dataclass
class RulerPrompt:
    """One example: ``tokens`` (the prompt), ``answer`` (its tokens), the words behind it and its needles'
    token offsets."""

    task: str
    tokens: list[int]
    answer: list[int]
    content: RulerContent
    needle_starts: list[int]


class RulerBuilder:
    """Builds RULER prompts for one tokenizer and one haystack (None: the filler; else corpus tokens)."""

    def __init__(
        self, tokenizer, haystack: np.ndarray | None = None, pairs: int = 4, queries: int = 2, digits: int = 4
    ):
        check_shape(pairs, queries, digits)
        self.tok, self.pairs, self.queries, self.digits = tokenizer, pairs, queries, digits
        self.hay = PasskeyBuilder(tokenizer, haystack)
        self._words: dict[str, list[int]] = {}
        self.word_tokens = max(len(self.word(w)) for w in RULER_WORDS)

    def word(self, w: str) -> list[int]:
        ids = self._words.get(w)
        if ids is None:
            ids = self._words[w] = self.tok.encode(" " + w)
        return ids

    def encode(self, words: Sequence[str]) -> list[int]:
        """Words joined by spaces, as the run's tokens (each word as the tokenizer splits it after a
        space)."""
        return [i for w in words for i in self.word(w)]

    def build(self, task: str, length: int, rng: np.random.Generator) -> RulerPrompt:
        """An example of ``length``: a prompt of ``length + 1 - len(answer)`` tokens, then the answer. A
        needle task's values never occur in the haystack (a corpus may hold the same digits): such a draw is
        replaced by the next one."""
        for _ in range(20):
            p = self._build(task, length, rng)
            if not self._value_in_haystack(p):
                return p
        raise UserError(
            f"the haystack keeps holding the {task} values; use another haystack or more --digits."
        )

    def _value_in_haystack(self, p: RulerPrompt) -> bool:
        if p.content.kind != "values":
            return False
        hay = list(p.tokens)
        for start, needle in zip(p.needle_starts, p.content.needles):
            hay[start : start + len(self.encode(needle))] = [-1] * len(self.encode(needle))
        values = [p.content.answer[i : i + self.digits] for i in range(0, len(p.content.answer), self.digits)]
        values += p.content.distractors
        text = " " + " ".join(map(str, hay)) + " "
        return any(" " + " ".join(map(str, self.encode(v))) + " " in text for v in values)

    def _build(self, task: str, length: int, rng: np.random.Generator) -> RulerPrompt:
        # the answer's token length depends only on its shape, except for words split into several tokens:
        # the prompt is built for the longest and padded on the left with haystack when the answer is shorter
        content, tokens, answer, starts = assemble_ruler(
            task,
            length + 1 - self._longest_answer(task),
            rng,
            self.encode,
            self.hay.hay_tokens,
            self.hay.boundary,
            self.word_tokens,
            self.pairs,
            self.queries,
            self.digits,
        )
        pad = self._longest_answer(task) - len(answer)
        if pad:
            tokens = self.hay.hay_tokens(pad, rng) + tokens
            starts = [s + pad for s in starts]
        return RulerPrompt(task, tokens, answer, content, starts)

    def _longest_answer(self, task: str) -> int:
        from extrapos.data.synthetic import ruler_content

        c = ruler_content(task, np.random.default_rng(0), 64, self.pairs, self.queries, self.digits)
        per = max(len(self.word(d)) for d in "0123456789") if c.kind == "values" else self.word_tokens
        return per * len(c.answer)

    def min_length(self, task: str) -> int:
        """The shortest example of ``task`` this tokenizer can fill."""
        from extrapos.data.synthetic import ruler_content, ruler_min_listing

        c = ruler_content(task, np.random.default_rng(0), 64, self.pairs, self.queries, self.digits)
        if task in ("cwe", "fwe"):
            body = ruler_min_listing(task) * self.word_tokens
        else:
            body = sum(len(self.encode(n)) for n in c.needles) + 2 * self.digits
        return body + len(self.encode(c.question)) + self._longest_answer(task)

    def candidates(self, prompt: RulerPrompt, n: int, rng: np.random.Generator) -> list[list[int]]:
        """``n`` distinct answers' tokens, the true one first: the distractors of the context, then random
        answers of the same shape, each of the true answer's token length and never the true answer's words
        in another order."""
        want, content = len(prompt.answer), prompt.content
        out = [prompt.answer]
        seen = {tuple(prompt.answer)}
        truth = sorted(content.answer)

        def offer(words: list[str]) -> None:
            ids = self.encode(words)
            if len(out) < n and len(ids) == want and tuple(ids) not in seen and sorted(words) != truth:
                seen.add(tuple(ids))
                out.append(ids)

        for d in content.distractors:
            offer(d)
        for _ in range(_DRAWS * n):
            if len(out) == n:
                return out
            offer(content.alternative(rng))
        if len(out) < n:
            raise UserError(
                f"could not draw {n - 1} wrong answers for {prompt.task} of the answer's token length; use "
                "fewer --candidates."
            )
        return out


# ---- scoring -----------------------------------------------------------------------------------------


def score_prompts(
    model,
    builder: RulerBuilder,
    prompts: Sequence[RulerPrompt],
    mode: str,
    candidates: int,
    rng: np.random.Generator,
    batch_tokens: int = 16_384,
) -> dict[str, Any]:
    """Score prompts of one task and length: the rank of the true answer among ``candidates`` and/or the
    greedy continuation's exact match, with the per-example outcomes the intervals resample."""
    out: dict[str, Any] = {"n": len(prompts)}
    per_example: dict[str, list[list[int]]] = {}
    device = next(model.parameters()).device
    if mode in ("rank", "both"):
        ranks = np.zeros(len(prompts), dtype=np.int64)
        for i, p in enumerate(prompts):
            scores = continuation_logprobs(
                model, p.tokens, builder.candidates(p, candidates, rng), batch_tokens
            )
            ranks[i] = 1 + int((scores[1:] >= scores[0]).sum())  # ties count against the true answer
        out.update(
            {
                "rank_accuracy": float((ranks == 1).mean()),
                "mean_rank": float(ranks.mean()),
                "mrr": float((1.0 / ranks).mean()),
                "chance": 1.0 / candidates,
            }
        )
        per_example["rank_accuracy"] = [(ranks == 1).astype(int).tolist(), [1] * len(ranks)]
    if mode in ("generate", "both"):
        hits = np.zeros(len(prompts), dtype=np.int64)
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(prompts):  # greedy_batch decodes equal-length prompts together
            by_shape.setdefault((len(p.tokens), len(p.answer)), []).append(i)
        for (T, a), idx in by_shape.items():
            per_batch = max(1, batch_tokens // (T + a))
            for s in range(0, len(idx), per_batch):
                group = idx[s : s + per_batch]
                x = torch.tensor([prompts[i].tokens for i in group], dtype=torch.long, device=device)
                gen = greedy_batch(model, x, a).cpu().tolist()
                for i, g in zip(group, gen):
                    hits[i] = int(g == prompts[i].answer)
        out["exact_match"] = float(hits.mean())
        per_example["exact_match"] = [hits.tolist(), [1] * len(prompts)]
    out["per_example"] = per_example
    out["examples_digest"] = examples_digest(*(np.asarray(p.tokens + p.answer) for p in prompts))
    return out


def check_tasks(tasks: Sequence[str], flag: str = "--tasks") -> list[str]:
    """RULER task names, checked: distinct names of ``RULER_TASKS``, at least one."""
    tasks = [t.strip() for t in tasks if t.strip()]
    unknown = [t for t in tasks if t not in RULER_TASKS]
    if not tasks or unknown or len(set(tasks)) != len(tasks):
        raise UserError(
            f"{flag} must list distinct RULER tasks from {', '.join(RULER_TASKS)}, got "
            f"{', '.join(tasks) or 'none'}."
        )
    return tasks


def check_request(
    tasks: Sequence[str],
    lengths: Sequence[int],
    trials: int,
    mode: str,
    candidates: int,
    seed: int,
    pairs: int = 4,
    queries: int = 2,
    digits: int = 4,
) -> list[str]:
    """Everything a RULER request asks for, checked before any work (the CLI's flags, a sweep's keys)."""
    tasks = check_tasks(tasks)
    check_shape(pairs, queries, digits)
    if mode not in MODES:
        raise UserError(f"unknown RULER mode {mode!r}; choose rank, generate or both.")
    if not lengths or any(int(k) != k or k < 1 for k in lengths):
        raise UserError(
            "RULER lengths must be positive integers (multiples of the training length), e.g. 1,2,4."
        )
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise UserError(f"trials must be a positive integer, got {trials!r}.")
    if mode != "generate" and not 2 <= candidates <= 1000:
        raise UserError(f"--candidates must be between 2 and 1000, got {candidates}.")
    check_seed(seed)
    return tasks


@dataclass
class RulerOptions:
    """What a RULER evaluation asks for, recorded as its result's request (equal requests reuse it):
    ``tasks`` at ``lengths`` (multiples of L_t: ``base_length``, default the run's), ``trials`` examples per
    cell, scored by ``mode`` among ``candidates``; ``haystack``: "filler", "corpus" (the run's held-out split
    ``split``) or a prepared data directory in the run's tokenizer; ``pairs``, ``queries`` and ``digits`` size
    the needles; ``position_options`` are set on the encoding; ``step``: the checkpoint (default the
    latest)."""

    tasks: list[str] = field(default_factory=lambda: list(RULER_TASKS))
    lengths: list[int] = field(default_factory=lambda: [1, 2, 4])
    trials: int = 20
    mode: str = "rank"
    haystack: str = "filler"
    split: str = "test"
    candidates: int = 10
    pairs: int = 4
    queries: int = 2
    digits: int = 4
    seed: int = 0
    position_options: dict[str, Any] = field(default_factory=dict)
    base_length: int | None = None
    step: int | None = None

    def checked(self) -> RulerOptions:
        """The options checked before any work (``check_request``), lengths sorted and made distinct."""
        tasks = check_request(
            self.tasks,
            self.lengths,
            self.trials,
            self.mode,
            self.candidates,
            self.seed,
            self.pairs,
            self.queries,
            self.digits,
        )
        return replace(
            self,
            tasks=tasks,
            lengths=sorted({int(k) for k in self.lengths}),
            position_options=dict(self.position_options or {}),
        )


def ruler(
    run_dir: str | Path,
    options: RulerOptions | None = None,
    *,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    """Score a run on RULER (``RulerOptions``, any of whose fields may be given as keywords instead); write
    RUN/eval/NAME.json and return it. The same request is reused; a different one under the same name is a
    UserError unless ``overwrite``."""
    from tqdm.auto import tqdm

    from extrapos.tasks.passkey import _corpus_haystack

    opts = given_options(RulerOptions, options, fields).checked()
    tasks, lengths, trials, mode = opts.tasks, opts.lengths, opts.trials, opts.mode
    candidates = opts.candidates
    run_dir = Path(run_dir)
    name = check_result_name(name or default_name(mode, opts.haystack, opts.position_options))
    refuse_encoder(run_dir, "ruler")
    request = asdict(opts)
    slot = task_slot(run_dir, name, request, opts.step, overwrite)
    if slot.previous is not None:
        return slot.previous
    check_passkey_memory(
        run_dir, lengths, trials, mode, candidates, opts.base_length, device, batch_tokens,
        advice="ask for shorter --lengths or fewer --trials",
    )  # fmt: skip
    t0 = time.perf_counter()
    run, L, options_applied = load_task_run(
        run_dir, slot, device, opts.base_length, opts.position_options, max(lengths)
    )
    hay_tokens, hay_source = (
        (None, "filler") if opts.haystack == "filler" else _corpus_haystack(run, opts.haystack, opts.split)
    )
    builder = RulerBuilder(run.tokenizer, hay_tokens, opts.pairs, opts.queries, opts.digits)
    short = {t: builder.min_length(t) for t in tasks if builder.min_length(t) > min(lengths) * L}
    if short:
        need = ", ".join(f"{t} {n}" for t, n in short.items())
        raise UserError(
            f"the shortest RULER examples ({min(lengths)} x {L} tokens) cannot hold every task (tokens "
            f"needed: {need}); drop the shortest lengths or those tasks."
        )
    cells = []
    bar = tqdm(total=len(lengths) * len(tasks), disable=not progress, desc=f"ruler {run_dir.name}")
    for k in lengths:
        for task in tasks:
            t_cell = time.perf_counter()
            rng = np.random.default_rng([opts.seed, k, RULER_TASKS.index(task)])
            prompts = [builder.build(task, k * L, rng) for _ in range(trials)]
            scores = score_prompts(run.model, builder, prompts, mode, candidates, rng, batch_tokens)
            cells.append(
                {
                    "task": task,
                    "ev": k,
                    "length": k * L,
                    **scores,
                    "seconds": round(time.perf_counter() - t_cell, 3),
                }
            )
            bar.update(1)
    bar.close()
    metric = primary_metric(mode)
    result = {
        **task_result(name, "ruler", run_dir, request, run, options_applied, L, slot),
        "haystack_source": hay_source,
        "metric": metric,
        "examples": {t: _example(run.tokenizer, builder, t, min(lengths) * L) for t in tasks},
        "results": cells,
        "by_length": [
            {"ev": k, "length": k * L, metric: float(np.mean([c[metric] for c in cells if c["ev"] == k]))}
            for k in lengths
        ],
        "wall_time": time.perf_counter() - t0,
    }
    slot.write(result, opts.position_options)  # rank 0 writes; every process waits until it is on disk
    return result


def default_name(mode: str, haystack: str, position_options: dict[str, Any] | None = None) -> str:
    hay = haystack if haystack in ("filler", "corpus") else slug(Path(haystack).name)
    parts = ["ruler", mode, hay] + [f"{k}{v}" for k, v in sorted((position_options or {}).items())]
    return "-".join(slug(str(p)) for p in parts)


def _example(tokenizer, builder: RulerBuilder, task: str, length: int) -> dict[str, str]:
    p = builder.build(task, length, np.random.default_rng(0))
    return {"prompt": tokenizer.decode(p.tokens), "answer": tokenizer.decode(p.answer)}


# ---- reports -------------------------------------------------------------------------------------------


def cell_interval(cell: dict[str, Any], metric: str):
    """The 95% bootstrap interval of one cell's accuracy over its examples (``stats.loss_interval`` with the
    example as unit: the resampling the report's task tables use); None when the cell lacks the metric."""
    from extrapos.report import stats

    pair = cell.get("per_example", {}).get(metric)
    return None if pair is None else stats.loss_interval(pair[0], pair[1])


def format_ruler(result: dict[str, Any], metric: str | None = None) -> str:
    """A markdown grid: one row per task, one column per length, the accuracy and its 95% interval in each
    cell, and the mean over tasks per length (RULER's average)."""
    metric = metric or result["metric"]
    cells = result["results"]
    lengths = sorted({(c["ev"], c["length"]) for c in cells})
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    req = result["request"]
    bounded = metric in ("rank_accuracy", "exact_match")
    lines = [
        f"ruler {req['mode']} ({metric.replace('_', ' ')}; {req['trials']} examples per cell, haystack "
        f"{req['haystack']}, encoding {result['encoding']}, L_t={result['train_length']}"
        + ("; [a, b] = 95% bootstrap interval over the examples" if bounded else "")
        + ")",
        "| task | " + " | ".join(f"{ev}x ({n})" for ev, n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for task in tasks:
        texts = []
        for ev, _ in lengths:
            c = next(c for c in cells if c["task"] == task and c["ev"] == ev)
            iv = cell_interval(c, metric) if bounded else None
            texts.append(f"{c[metric]:.2f}" + (f" [{iv.low:.2f}, {iv.high:.2f}]" if iv else ""))
        lines.append(f"| {task} | " + " | ".join(texts) + " |")
    means = [np.mean([c[metric] for c in cells if c["ev"] == ev]) for ev, _ in lengths]
    lines.append("| **mean** | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    if metric == "rank_accuracy":
        lines.append(f"(chance: {1 / req['candidates']:.2f})")
    return "\n".join(lines)


def format_all(result: dict[str, Any]) -> str:
    """One grid per computed metric: what the console shows after `extrapos ruler`."""
    return format_every_metric(result, format_ruler)


def plot_grid(result: dict[str, Any], path: str | Path, metric: str | None = None) -> Path:
    """Save a task x length heatmap of the accuracy (matplotlib) to ``path``."""
    metric = metric or result["metric"]
    cells = result["results"]
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    lengths = sorted({c["length"] for c in cells})
    grid = np.full((len(tasks), len(lengths)), math.nan)
    for c in cells:
        grid[tasks.index(c["task"]), lengths.index(c["length"])] = c[metric]
    title = f"RULER {metric.replace('_', ' ')}: {result['encoding']} (L_t={result['train_length']})"
    return accuracy_heatmap(
        grid,
        tasks,
        lengths,
        train_length=result["train_length"],
        title=title,
        xlabel="example length (tokens)",
        ylabel=None,
        path=path,
        size=(3, 0.5),
    )


__all__ = [
    "RulerBuilder",
    "RulerOptions",
    "RulerPrompt",
    "check_request",
    "check_tasks",
    "computed_metrics",
    "format_all",
    "format_ruler",
    "plot_grid",
    "ruler",
    "score_prompts",
]
