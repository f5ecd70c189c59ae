"""An lm-evaluation-harness model for extrapos runs (Gao et al. 2024, "The Language Model Evaluation
Harness").

Importing this module registers the model ``extrapos``::

    import extrapos.integrations.lm_eval          # registers --model extrapos
    lm_eval.simple_evaluate(model="extrapos", model_args="run=runs/rope,max_length=1024,scale=0.5",
    tasks=[...])

or call ``run_lm_eval(RUN, tasks)``, which also writes ``RUN/eval/lm-eval-<tasks>.json``.

model_args: ``run`` (the run directory, required), ``max_length`` (tokens of context the model may
see, default the run's training length L_t; set it to k x L_t to evaluate extrapolation),
``batch_size``, ``device``, ``step`` (a checkpoint), and inference-time encoding options applied
with ``model.pos.set_options``: ``scale`` (ExPE), ``rope_scaling`` = linear | ntk | dynamic | yarn
with ``factor`` (default max_length / L_t).

Long-context suites (RULER, LongBench) run through the same model; they size their prompts from
the task metadata ``max_seq_lengths`` (``metadata={"max_seq_lengths": [4096, 8192]}`` in
``simple_evaluate`` / ``--metadata`` on the command line), and ``max_length`` must be at least the
longest of them or the prompts are cut from the left.

Requests are scored as the harness defines them: ``loglikelihood`` sums log p(continuation |
context) over the continuation tokens (context cut from the left to fit ``max_length``),
``loglikelihood_rolling`` scores a whole text in disjoint windows of ``max_length`` tokens, and
``generate_until`` decodes greedily with a KV cache until a stop string, end of text or
``max_gen_toks``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F

from extrapos.errors import UserError

try:
    # lm-eval fills its registry with its own models (hf, vllm, ...) only when the registry is empty at
    # the first lookup; registering ``extrapos`` first would leave them unknown ("no model for this name
    # found"), so its model list is loaded before ours is added
    import lm_eval.models  # noqa: F401
    from lm_eval import utils as lm_utils
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - the eval extra is missing
    raise UserError(
        "the lm-eval integration needs lm-evaluation-harness; run `pip install 'extrapos[eval]'`."
    ) from e

from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import ColumnAt, Evaluator, Prepared, Scoring, column_name
from extrapos.evaluate.slot import ABSENT, ResultSlot, check_result_name, jsonable, slug, task_slot
from extrapos.integrations.lm_eval_quiet import quiet_harness
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard
from extrapos.tasks.common import check_lm_eval_request, greedy_batch, refuse_encoder

logger = logging.getLogger(__name__)


def position_options(
    scale: float | None = None,
    rope_scaling: str | None = None,
    factor: float | None = None,
    max_length: int | None = None,
    train_length: int | None = None,
) -> dict[str, Any]:
    """The encoding options of the model_args, as ``extrapos eval`` sets them."""
    options: dict[str, Any] = {}
    if scale is not None:
        options["scale"] = float(scale)
    if rope_scaling:
        if rope_scaling not in ("linear", "ntk", "dynamic", "yarn"):
            raise UserError(f"rope_scaling must be linear, ntk, dynamic or yarn, got {rope_scaling!r}.")
        options["scaling"] = rope_scaling
        default = (max_length / train_length) if max_length and train_length else 1.0
        options["factor"] = float(factor) if factor is not None else float(max(default, 1.0))
    elif factor is not None:
        raise UserError("factor needs rope_scaling (linear, ntk, dynamic or yarn).")
    return options


# lm-eval's own default (simple_evaluate, and its CLI's --bootstrap_iters): stderr for every metric that
# has one, closed-form where lm-eval has it (accuracy), bootstrapped otherwise
LM_EVAL_BOOTSTRAP_ITERS = 100_000


@register_model("extrapos")
class ExtraposLM(TemplateLM):
    """An extrapos run (trained or imported) as an lm-eval ``LM`` (a ``TemplateLM``: the harness splits
    contexts from continuations the standard way, we score the tokens)."""

    def __init__(
        self,
        run: Run | str | None = None,
        max_length: int | None = None,
        batch_size: int | str = 8,
        device: str = "cpu",
        step: int | None = None,
        scale: float | None = None,
        rope_scaling: str | None = None,
        factor: float | None = None,
        max_gen_toks: int = 256,
        **unused: Any,
    ) -> None:
        super().__init__()
        from extrapos.run.directory import load_run

        if run is None:
            raise UserError("the extrapos lm-eval model needs model_args run=RUN_DIR.")
        self.run = load_run(run, device=device, step=None if step is None else int(step))
        self.tokenizer = self.run.tokenizer
        self.model = self.run.model
        self.train_length = self.run.cfg.model.train_length
        self._max_length = int(max_length) if max_length is not None else self.train_length
        if self._max_length < 2:
            raise UserError(f"max_length must be at least 2 tokens, got {self._max_length}.")
        self.batch_size = (
            8 if batch_size in (None, "auto") or str(batch_size).startswith("auto") else int(batch_size)
        )
        self.max_gen_toks = int(max_gen_toks)
        self.options = position_options(scale, rope_scaling, factor, self._max_length, self.train_length)
        if self.options:
            self.model.pos.set_options(**self.options)
        self._device = torch.device(device)

    # ---- tokenization (what TemplateLM asks for) -------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eot_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return f"extrapos-{self.tokenizer.hash}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    # ---- scoring ----------------------------------------------------------------------------------

    @torch.no_grad()
    def score_tokens(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), whether greedy decoding gives the continuation) per pair.

        Each row is context + continuation cut from the left to ``max_length + 1`` tokens; rows are
        batched longest first and right-padded (causal attention: padding after a row never changes it).
        """
        results: list[tuple[float, bool] | None] = [None] * len(pairs)
        rows = []
        for i, (ctx, cont) in enumerate(pairs):
            if not cont:
                results[i] = (0.0, True)
                continue
            whole = (list(ctx) + list(cont))[-(self.max_length + 1) :]
            n_cont = min(len(cont), len(whole) - 1)
            rows.append((i, whole[:-1], whole[-n_cont:]))
        rows.sort(key=lambda r: -len(r[1]))
        for s in range(0, len(rows), self.batch_size):
            group = rows[s : s + self.batch_size]
            width = len(group[0][1])
            x = torch.full((len(group), width), self.eot_token_id, dtype=torch.long)
            for r, (_, inp, _) in enumerate(group):
                x[r, : len(inp)] = torch.tensor(inp)
            x = x.to(self._device)
            pos = torch.arange(width, device=self._device).expand(len(group), -1)
            h = self.model.hidden_states(x, pos)
            for r, (i, inp, cont) in enumerate(group):
                at = torch.arange(len(inp) - len(cont), len(inp), device=self._device)
                logp = F.log_softmax(self.model.logits(h[r, at]).float(), dim=-1)
                target = torch.tensor(cont, device=self._device)
                results[i] = (
                    float(logp.gather(-1, target[:, None]).sum()),
                    bool((logp.argmax(-1) == target).all()),
                )
        return cast(list[tuple[float, bool]], results)  # every pair's slot is filled above

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        out = self.score_tokens([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", key, res)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts: disjoint windows of ``max_length`` tokens, the first one
        predicted from the end-of-text token (the harness's rolling protocol)."""
        windows, owner = [], []
        for i, req in enumerate(requests):
            (text,) = req.args
            for pair in lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.eot_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                windows.append(lm_utils.make_disjoint_window(pair))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owner, self.score_tokens(windows)):
            totals[i] += logp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding with the KV cache; prompts of equal token length and equal settings share a
        batch."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, list[int]]]] = defaultdict(list)
        settings = {}
        for i, req in enumerate(requests):
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            if kwargs.get("do_sample") and float(kwargs.get("temperature", 1.0)) > 0:
                raise UserError(
                    "the extrapos lm-eval model decodes greedily; run the task with do_sample=false."
                )
            ids = self.tok_encode(context)[-max(1, self.max_length - max_gen) :]
            key = (len(ids), max_gen, tuple(until))
            settings[key] = (max_gen, until)
            groups[key].append((i, ids))
        for key, items in groups.items():
            max_gen, until = settings[key]
            for s in range(0, len(items), self.batch_size):
                batch = items[s : s + self.batch_size]
                x = torch.tensor([ids for _, ids in batch], dtype=torch.long, device=self._device)

                def done(gen: torch.Tensor, until: list[str] = until) -> bool:
                    return all(self._stopped(row.tolist(), until) for row in gen)

                gen = greedy_batch(self.model, x, max_gen, stop=done) if max_gen > 0 else x[:, :0]
                for (i, _), row in zip(batch, gen.tolist()):
                    text = self._cut(row, until)
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return cast(list[str], out)  # every request is in one group, so every slot is filled

    def _stopped(self, row: list[int], until: list[str]) -> bool:
        if self.eot_token_id in row:
            return True
        text = self.tok_decode(row)
        return any(u and u in text for u in until)

    def _cut(self, row: list[int], until: list[str]) -> str:
        if self.eot_token_id in row:
            row = row[: row.index(self.eot_token_id)]
        text = self.tok_decode(row)
        for u in until:
            if u and u in text:
                text = text[: text.index(u)]
        return text


@dataclass
class LmEvalOptions:
    """What an lm-eval run asks for: the harness's ``tasks`` and settings, the encoding options of the
    model_args (``position_options``) and the checkpoint (``step``); ``run_lm_eval`` takes them as
    keywords."""

    tasks: list[str]
    num_fewshot: int | None = None
    limit: int | float | None = None
    max_length: int | None = None
    batch_size: int = 8
    scale: float | None = None
    rope_scaling: str | None = None
    factor: float | None = None
    include_path: str | Path | None = None
    include_defaults: bool = True
    metadata: dict[str, Any] | None = None
    bootstrap_iters: int = 0  # a sweep's lm-eval columns (compare/tasks.py); run_lm_eval: lm-eval's default
    log_samples: bool = False
    seed: int = 1234
    step: int | None = None


def lm_eval_request(run_dir: Run | str | Path, opts: LmEvalOptions, name: str | None = None) -> Prepared:
    """The request of ``opts`` checked before the run or the harness is loaded, and its result name
    (default ``lm-eval-<tasks>``): ``Prepared.request`` the request the result records, ``inputs`` the
    options."""
    tasks, limit = opts.tasks, opts.limit
    if not tasks:
        raise UserError("give at least one lm-eval task, e.g. tasks=['arc_easy'] (--tasks arc_easy).")
    check_lm_eval_request(limit, opts.batch_size, opts.num_fewshot, opts.metadata, opts.max_length)
    if limit is not None and limit >= 2**63:  # the harness slices its documents with islice (a C ssize_t)
        raise UserError(
            f"--limit must be below 2^63 examples per task, got {limit:g}; give a smaller --limit."
        )
    if limit is not None and limit >= 1:  # a count of examples; below 1 it is lm-eval's fraction of each task
        limit = int(limit)
    if name is not None:
        check_result_name(name)  # before anything is loaded: a name, never a path
    handle = Run.open(run_dir)
    refuse_encoder(handle, "lm-eval")
    options = position_options(
        opts.scale,
        opts.rope_scaling,
        opts.factor,
        opts.max_length,
        handle.cfg.model.train_length,
    )
    name = name or "lm-eval-" + slug("_".join(tasks)) + "".join(
        f"-{slug(f'{k}{v}')}" for k, v in sorted(options.items())
    )
    request = {
        "tasks": list(tasks),
        "num_fewshot": opts.num_fewshot,
        "limit": limit,
        "max_length": opts.max_length,
        "seed": opts.seed,
        "metadata": opts.metadata,
        "options": options,
        "step": opts.step,
        "bootstrap_iters": opts.bootstrap_iters,
        "log_samples": opts.log_samples,
    }
    return Prepared(handle, request, name, opts)


def lm_eval_slot(prepared: Prepared, overwrite: bool = False) -> ResultSlot:
    """The result slot of an lm-eval request (``evaluate.slot.task_slot``)."""
    handle, request, name = prepared.run, prepared.request, prepared.name
    # a result of an older extrapos (no ``checkpoint`` recorded) of the same request is scored again and
    # replaced: nothing says which weights it scored
    older = {"checkpoint": ABSENT, "request": jsonable({k: request[k] for k in _OLDER_REQUEST})}
    again: list[tuple[dict[str, Any], str | None]] = [(older, None)]
    if request["bootstrap_iters"]:  # a result of the earlier default (no stderr) is scored again, not refused
        without = {"request": jsonable({**request, "bootstrap_iters": 0})}
        again.append((without, f"{name} has no stderr (bootstrap_iters 0); scoring it again with them"))
    return task_slot(handle, name, request, request["step"], overwrite, older=again)


def run_lm_eval(
    run_dir: Run | str | Path,
    tasks: list[str],
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    max_length: int | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    scale: float | None = None,
    rope_scaling: str | None = None,
    factor: float | None = None,
    include_path: str | Path | None = None,
    include_defaults: bool = True,
    metadata: dict[str, Any] | None = None,
    bootstrap_iters: int = LM_EVAL_BOOTSTRAP_ITERS,
    log_samples: bool = False,
    seed: int = 1234,
    name: str | None = None,
    step: int | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on a run; write ``RUN/eval/NAME.json`` (default ``lm-eval-<tasks>``) and return
    it.

    ``include_path``: a directory of extra task YAMLs (local tasks, offline; ``include_defaults=False``
    skips indexing the harness's own tasks, which takes seconds); ``metadata``: task
    metadata such as RULER's ``max_seq_lengths``; ``limit``: examples per task (for quick checks).
    The result goes through the slot every task result uses (``evaluate.slot.task_slot``): the same
    request on the same weights is reused without running the harness (said on the console unless
    ``quiet``), a different request under the same name is refused unless ``overwrite``; ``name`` is a file
    name in ``RUN/eval/``, never a path. ``quiet`` also turns off datasets' and lm-eval's progress bars (a
    sweep's columns pass it); lm-eval's warnings and git's are kept off stderr either way
    (``lm_eval_quiet.py``).
    """
    opts = LmEvalOptions(
        list(tasks), num_fewshot, limit, max_length, batch_size, scale, rope_scaling, factor, include_path,
        include_defaults, metadata, bootstrap_iters, log_samples, seed, step,
    )  # fmt: skip
    handle = run_dir if isinstance(run_dir, Run) else Run(run_dir)  # read once, where the slot needs it
    how = Scoring(name, overwrite, device, not quiet)
    return drive(LmEvalEvaluator(), handle, opts, None, how)


def score_lm_eval(prepared: Prepared, slot: ResultSlot, how: Scoring) -> dict[str, Any]:
    """The harness run on ``prepared`` (``LmEvalEvaluator.score``): the result to write."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    handle, request, opts, device = prepared.run, prepared.request, prepared.inputs, how.device
    tasks, num_fewshot, max_length, batch_size = (
        opts.tasks,
        opts.num_fewshot,
        opts.max_length,
        opts.batch_size,
    )
    scale, rope_scaling, factor, include_path = opts.scale, opts.rope_scaling, opts.factor, opts.include_path
    include_defaults, metadata, bootstrap_iters = opts.include_defaults, opts.metadata, opts.bootstrap_iters
    log_samples, seed = opts.log_samples, opts.seed
    run_dir, name, limit = handle.path, slot.out_path.stem, request["limit"]
    t0 = time.perf_counter()
    lm = ExtraposLM(
        run=handle,
        max_length=max_length,
        batch_size=batch_size,
        device=device,
        step=slot.ckpt.step,
        scale=scale,
        rope_scaling=rope_scaling,
        factor=factor,
    )
    # lm-eval's warnings, git's complaint and (under --no-progress) the bars of datasets and lm-eval kept off
    # stderr, so a failure ends in its one sentence alone (lm_eval_quiet.py)
    with quiet_harness(how.progress):
        manager = TaskManager(
            include_path=str(include_path) if include_path else None,
            include_defaults=include_defaults or not include_path,
            metadata=metadata,
        )
        unknown = [t for t in tasks if t not in manager.all_tasks]
        if unknown:
            raise UserError(
                f"lm-eval knows no task {', '.join(unknown)}; check the name (lm_eval ls tasks) or pass "
                "include_path=DIR holding its YAML."
            )
        try:
            raw = lm_eval.simple_evaluate(
                model=lm,
                tasks=list(tasks),
                num_fewshot=num_fewshot,
                limit=limit,
                task_manager=manager,
                bootstrap_iters=bootstrap_iters,
                log_samples=log_samples,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
                metadata=metadata,
            )
        except OSError as e:
            if not _unreachable(e):
                raise
            # datasets / huggingface_hub say "Couldn't reach ..." with a ConnectionError (an OSError): left to
            # the command line's file-system sentence it read as a path or free-space problem
            reason = str(e).strip().splitlines()[0].rstrip(".").replace(". ", "; ") if str(e).strip() else ""
            raise UserError(
                f"lm-eval could not fetch the dataset of {', '.join(tasks)} ({reason or type(e).__name__}): "
                "without a network it must already be in the Hugging Face datasets cache, so fetch it once "
                "where there is one (then copy ~/.cache/huggingface, or point HF_HOME at the copy, and set "
                "HF_DATASETS_OFFLINE=1) or give a local task with --include-path DIR."
            ) from None
        except AssertionError as e:
            # RULER's tasks size their prompts with a Hugging Face tokenizer named in the task metadata; their
            # own message asks for --model_args, which `extrapos lm-eval` does not take
            if "No tokenizer or pretrained provided" not in str(e):
                raise
            raise UserError(
                f"lm-eval's RULER tasks ({', '.join(tasks)}) size their prompts with a Hugging Face "
                'tokenizer: add "tokenizer": "DIR" to --metadata (metadata={"tokenizer": DIR}), DIR the '
                f"folder `extrapos export {run_dir} --out DIR` writes (transformers 5 reads the run folder "
                "too)."
            ) from None
        except ValueError as e:
            # the harness draws the few-shot examples with random.sample from the task's own split
            if num_fewshot and "larger than population" in str(e):
                raise UserError(
                    f"--num-fewshot {num_fewshot} (num_fewshot) asks for more few-shot examples than "
                    f"{', '.join(tasks)} can draw from; lower --num-fewshot."
                ) from None
            raise
    if raw is None:  # pragma: no cover - only non-zero ranks get None
        raise UserError("lm-eval returned no results.")
    result = {
        "name": name,
        "task": "lm-eval",
        "run": str(run_dir),
        "tasks": list(tasks),
        "encoding": lm.run.cfg.model.positions_plan().name,
        "applied": lm.options,
        "max_length": lm.max_length,
        "train_length": lm.train_length,
        "checkpoint_step": lm.run.step,
        "checkpoint": slot.checkpoint,
        "request": request,
        "results": raw.get("results", {}),
        "n-shot": raw.get("n-shot", {}),
        "versions": raw.get("versions", {}),
        "n-samples": raw.get("n-samples", {}),
        "wall_time": time.perf_counter() - t0,
    }
    if log_samples:
        result["samples"] = raw.get("samples", {})
    return jsonable(result)


def _unreachable(error: OSError) -> bool:
    """A dataset that could not be fetched (no network, offline mode, not in the cache), as opposed to a
    file-system error: a ConnectionError (datasets, huggingface_hub's OfflineModeIsEnabled) or one of
    requests' connection errors (OSErrors too)."""
    if isinstance(error, ConnectionError):
        return True
    try:
        import requests
    except ImportError:  # pragma: no cover - the harness depends on it
        return False
    return isinstance(error, (requests.ConnectionError, requests.Timeout))


# the request keys an lm-eval result recorded before it recorded its checkpoint and options
_OLDER_REQUEST = ("tasks", "num_fewshot", "limit", "max_length", "seed", "metadata")


def cli() -> None:
    """``extrapos-lm-eval``: lm-eval's own command line with ``--model extrapos`` registered.

    lm-eval 0.4 reads no entry points, so an installed package cannot announce a model to its
    ``lm_eval`` command (docs/huggingface.md); this module registers ``extrapos`` on import, and the
    built-in models are imported too, since a registry that already holds a model no longer loads
    them itself."""
    import lm_eval.models  # noqa: F401
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


class LmEvalEvaluator(Evaluator[Any]):  # given LmEvalOptions, it prepares the recorded request (a dict)
    """lm-evaluation-harness tasks (``run_lm_eval``), scored whole by every process (the same numbers)."""

    name: ClassVar[str] = "lm-eval"
    request_type: ClassVar[type] = LmEvalOptions
    refused_as: ClassVar[str] = "result"

    def prepare(self, run: Run | str | Path, request: LmEvalOptions, how: Scoring) -> Prepared:
        return lm_eval_request(run, request, how.name)

    def open_slot(self, prepared: Prepared, how: Scoring) -> ResultSlot:
        return lm_eval_slot(prepared, how.overwrite)

    def estimate(self, prepared: Prepared, how: Scoring) -> float | None:
        """Nothing: lm-eval's requests are the harness's to size (its contexts are cut at max_length)."""

    def options(self, request: dict[str, Any]) -> dict[str, Any]:
        return request["options"]

    def score(self, prepared: Prepared, slot: ResultSlot, shard: Shard, how: Scoring) -> dict[str, Any]:
        return score_lm_eval(prepared, slot, how)

    def finish(self, slot: ResultSlot, result: dict[str, Any], written: bool, how: Scoring) -> None:
        """A reused result said on the console (unless quiet)."""
        if not written and how.progress:
            logger.info(f"extrapos lm-eval: {slot.out_path} holds this request on these weights; reused.")

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """A sweep's lm-eval column, scored once per row at the run's L_t (unless ``spec.max_length``): the
        saved result of this request on the run's current weights is reused before the harness starts."""
        options = at.position_options
        # a row's eval options use the encoding's names (scale; scaling + factor); the adapter takes them as
        # scale, rope_scaling and factor and applies them with the same set_options call
        unsupported = set(options) - {"scale", "scaling", "factor"}
        if unsupported:
            raise UserError(
                f"lm-eval columns take the eval options scale, scaling and factor only, not "
                f"{', '.join(sorted(unsupported))}; drop lm-eval or that row's option."
            )
        asked = LmEvalOptions(
            scale=options.get("scale"),
            rope_scaling=options.get("scaling"),
            factor=options.get("factor"),
            **asdict(spec),
        )
        position_options(asked.scale, asked.rope_scaling, asked.factor)  # before lm-eval starts
        name = column_name("lm-eval", [], options, None, spec)
        # the saved result of this request on the run's current weights is reused by the driver before the
        # harness starts: a resumed sweep does not even start it
        return run_lm_eval(run, device=how.device, name=name, quiet=True, **asdict(asked))
