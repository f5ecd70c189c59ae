"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2) and needle-in-a-haystack.

A prompt is a haystack with one needle hidden at a chosen depth, then a question::

    <haystack ...> The pass key is 71432. Remember it. 71432 is the pass key. <haystack ...>
    What is the pass key? The pass key is

The haystack is the paper's filler ("The grass is green. The sky is blue. The sun is yellow. Here
we go. There and back again." repeated) or held-out documents of a prepared corpus split (the
"needle in a haystack" variant). Prompts are assembled from token pieces, so the prompt has exactly
``length`` tokens of the run's tokenizer. The needle goes between sentences of the filler (between
words of a corpus haystack, whose window also starts at a word) at the boundary nearest to token
``round(depth * (length - needle - question))``: depth 0 puts it first, depth 1 right before the
question, and no word is ever cut in two by it.

Two scorers:

* ``generate``: exact match of the greedy continuation (KV cache) with the key.
* ``rank``: the log-likelihood of the key tokens after the prompt, ranked among ``candidates - 1``
  other keys of the same token length (chance accuracy is 1 / candidates). Small models that never
  learned to write a number after "is" can still show whether they *prefer* the right one.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from extrapos.errors import UserError
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import ColumnAt, Evaluator, Prepared, Scoring, column_name
from extrapos.evaluate.slot import ResultSlot, check_result_name, request_name, slug, task_slot
from extrapos.owned import check_owned_file
from extrapos.run.handle import LoadedRun, Run
from extrapos.run.memory import check_memory, forward_bytes
from extrapos.run.runtime import Shard
from extrapos.tasks.common import (
    MAX_CANDIDATES,
    MAX_KEY_DIGITS,
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
from extrapos.tasks.passkey_task import PasskeyColumns

if TYPE_CHECKING:
    from extrapos.data.tokenizer import Tokenizer
    from extrapos.model import Decoder, ModelConfig
    from extrapos.run.config import DataConfig

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
MODES = ("rank", "generate", "both")
MARGIN = 8  # haystack tokens the shortest prompt holds besides the needle and the question


@dataclass
class PasskeyPrompt:
    """One prompt: ``tokens`` (exactly the asked length), the needle's span, the key and its tokens."""

    tokens: list[int]
    needle_start: int
    needle_len: int
    key: str
    answer: list[int]  # the key as it continues the prompt (" 71432")
    depth: float


class PasskeyBuilder:
    """Builds passkey prompts of an exact token length for one tokenizer and one haystack.

    ``haystack``: None for the filler text, else a 1-D array of corpus tokens (documents back to
    back) from which each prompt takes a window at a seeded random offset.
    """

    def __init__(self, tokenizer: Tokenizer, haystack: np.ndarray | None = None, key_digits: int = 5) -> None:
        if key_digits < 1:
            raise UserError(f"key_digits must be at least 1, got {key_digits}.")
        self.tok, self.key_digits = tokenizer, key_digits
        self.filler = tokenizer.encode(FILLER + " ")
        self.question = tokenizer.encode(" " + QUESTION)
        self.haystack = haystack
        if haystack is not None and len(haystack) == 0:
            raise UserError("the haystack corpus split holds no tokens; choose another split or corpus.")
        # where the needle may go in the tiled filler: after a sentence (offsets into one filler copy)
        self.filler_starts = [
            i
            for i in range(len(self.filler))
            if i == 0 or tokenizer.decode(self.filler[:i]).rstrip()[-1:] == "."
        ]
        self._word_start: dict[int, bool] = {}

    def starts_word(self, token: int) -> bool:
        """Whether ``token`` begins a new word (its text starts with whitespace): a corpus haystack is cut and
        the needle inserted only before such tokens, so no word is split at a token boundary."""
        flag = self._word_start.get(token)
        if flag is None:
            text = self.tok.decode([token])
            flag = self._word_start[token] = bool(text) and text[0].isspace()
        return flag

    def boundary(self, hay: list[int], target: int) -> int:
        """The insertion point nearest to ``target`` that lies between sentences of the filler (between
        words of a corpus haystack); 0 always qualifies, ``len(hay)`` only as the target itself."""
        n = len(hay)
        if self.haystack is None:
            F = len(self.filler)
            base = target - target % F
            points = [b + s for b in (base - F, base, base + F) for s in self.filler_starts]
        else:
            window = range(max(0, target - 64), min(n, target + 65))
            points = [i for i in window if self.starts_word(int(hay[i]))]
        # the haystack's end is where it was cut to length: only depth 1 (target n) puts the needle there
        points = [p for p in points if 0 <= p < n] + [0] + ([n] if target >= n else [])
        return min(points, key=lambda p: (abs(p - target), p))

    def needle(self, key: str) -> list[int]:
        return self.tok.encode(" " + NEEDLE.format(key=key) + " ")

    def answer(self, key: str) -> list[int]:
        return self.tok.encode(" " + key)

    def random_key(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(10 ** (self.key_digits - 1), 10**self.key_digits)))

    def min_length(self) -> int:
        """The shortest prompt that holds a needle and the question (the longest needle of this key size)."""
        return len(self.needle("9" * self.key_digits)) + len(self.question) + MARGIN

    def hay_tokens(self, n: int, rng: np.random.Generator) -> list[int]:
        if self.haystack is None:
            reps = n // len(self.filler) + 1
            return (self.filler * reps)[:n]
        total = len(self.haystack)
        start = int(rng.integers(0, total))
        # start the window at a word, so its first token is never the tail of a cut word
        for step in range(64):
            if self.starts_word(int(self.haystack[(start + step) % total])):
                start = (start + step) % total
                break
        idx = (start + np.arange(n)) % total  # wrap around: a small split still fills a long haystack
        return np.asarray(self.haystack[idx], dtype=np.int64).tolist()

    def build(
        self, length: int, depth: float, rng: np.random.Generator, key: str | None = None
    ) -> PasskeyPrompt:
        """A prompt of exactly ``length`` tokens with the needle at ``depth`` (0 = first, 1 = last before the
        question)."""
        if not 0.0 <= depth <= 1.0:
            raise UserError(f"needle depths must be in [0, 1], got {depth}.")
        key = key or self.random_key(rng)
        needle = self.needle(key)
        hay_len = length - len(needle) - len(self.question)
        if hay_len < 0:
            raise UserError(
                f"a passkey prompt of {length} tokens cannot hold the needle and the question "
                f"({len(needle) + len(self.question)} tokens); use longer lengths."
            )
        hay = self.hay_tokens(hay_len, rng)
        at = self.boundary(hay, int(round(depth * hay_len)))
        tokens = hay[:at] + needle + hay[at:] + self.question
        return PasskeyPrompt(tokens, at, len(needle), key, self.answer(key), depth)

    def alternatives(self, key: str, n: int, rng: np.random.Generator) -> list[str]:
        """``n`` distinct keys other than ``key`` whose answer has the same number of tokens."""
        want = len(self.answer(key))
        out: list[str] = []
        seen = {key}
        for _ in range(100 * max(n, 1) + 1000):
            if len(out) == n:
                return out
            k = self.random_key(rng)
            if k not in seen and len(self.answer(k)) == want:
                seen.add(k)
                out.append(k)
        raise UserError(
            f"could not draw {n} alternative keys of {self.key_digits} digits with the same token "
            "length as the true key; use fewer candidates or more key_digits."
        )


def first_number(text: str) -> str | None:
    """The first run of digits in a generated continuation (None when it starts with anything else)."""
    m = re.match(r"\s*(\d+)", text)
    return m.group(1) if m else None


# ---- scoring -----------------------------------------------------------------------------------------


def score_prompts(
    model: Decoder,
    tokenizer: Tokenizer,
    builder: PasskeyBuilder,
    prompts: Sequence[PasskeyPrompt],
    mode: str,
    candidates: int,
    rng: np.random.Generator,
    batch_tokens: int = 16_384,
    shard: Shard | None = None,
) -> dict[str, Any]:
    """Score equal-length prompts: rank of the true key among ``candidates`` and/or greedy exact match.

    ``shard`` (``runtime.Shard``, under torchrun) deals the jobs out to the processes: one prompt in
    rank mode, one batch of prompts in generate mode, each scored by one process exactly as a single
    process scores it (same batch), the outcomes summed back; every process draws every prompt's
    alternative keys, so ``rng`` moves as in a single process and the numbers are the same.
    """
    from extrapos.run.runtime import Shard

    shard = shard or Shard()
    out: dict[str, Any] = {"n": len(prompts)}
    # per prompt (numerators, denominators): what the report's bootstrap intervals resample
    per_example: dict[str, list[list[int]]] = {}
    device = next(model.parameters()).device
    if mode in ("rank", "both"):
        ranks = torch.zeros(len(prompts), dtype=torch.float64)
        for i, p in enumerate(prompts):
            alts = builder.alternatives(p.key, candidates - 1, rng)
            if not shard.take():
                continue
            scores = continuation_logprobs(
                model, p.tokens, [p.answer] + [builder.answer(k) for k in alts], batch_tokens
            )
            ranks[i] = 1 + int((scores[1:] >= scores[0]).sum())  # ties count against the true key
        ranks_a = shard.sum(ranks).numpy().astype(np.int64)
        out.update(
            {
                "rank_accuracy": float((ranks_a == 1).mean()),
                "mean_rank": float(ranks_a.mean()),
                "mrr": float((1.0 / ranks_a).mean()),
                "chance": 1.0 / candidates,
            }
        )
        per_example["rank_accuracy"] = [(ranks_a == 1).astype(int).tolist(), [1] * len(ranks)]
    if mode in ("generate", "both"):
        n_new = max(len(p.answer) for p in prompts) + 1
        per_batch = max(1, batch_tokens // (len(prompts[0].tokens) + n_new))
        hits = torch.zeros(len(prompts), dtype=torch.float64)
        for s in range(0, len(prompts), per_batch):
            if not shard.take():
                continue
            group = prompts[s : s + per_batch]
            x = torch.tensor([p.tokens for p in group], dtype=torch.long, device=device)
            gen = greedy_batch(model, x, n_new).cpu().tolist()
            for i, (g, p) in enumerate(zip(gen, group)):
                hits[s + i] = float(first_number(tokenizer.decode(g)) == p.key)
        hits_a = shard.sum(hits).numpy().astype(bool)
        out["exact_match"] = float(np.mean(hits_a))
        per_example["exact_match"] = [hits_a.astype(int).tolist(), [1] * len(prompts)]
    out["per_example"] = per_example
    out["examples_digest"] = examples_digest(*(np.asarray(p.tokens) for p in prompts))
    return out


def _corpus_haystack(run: Run | LoadedRun, haystack: str, split: str) -> tuple[np.ndarray, str]:
    from extrapos.data import open_split
    from extrapos.data.shards import read_manifest

    data_dir = run.data_dir if haystack == "corpus" else Path(haystack)
    if data_dir is None:
        raise UserError(
            f"the data {run.path.name} trained on is gone; pass haystack=DIR (--haystack DIR) with a "
            "prepared data directory tokenized with the run's tokenizer, or haystack='filler'."
        )
    manifest = read_manifest(data_dir)
    if manifest["tokenizer"]["hash"] != run.tokenizer.hash:
        raise UserError(
            f"{data_dir} was tokenized with another tokenizer than the run's; prepare the corpus with "
            f"the run's tokenizer (extrapos data prepare --tokenizer {run.path}/tokenizer.json)."
        )
    tokens = open_split(data_dir, split).tokens
    return np.asarray(tokens), str(data_dir)


@dataclass
class PasskeyOptions(PasskeyColumns):
    """What a passkey evaluation asks for, recorded as its result's request (equal requests reuse it).

    ``lengths``: multiples of L_t (``base_length``, default the run's); ``depths``: needle depths in [0, 1];
    ``trials`` prompts per (length, depth); ``mode``: "rank" (log-likelihood rank of the key among
    ``candidates``), "generate" (greedy exact match) or "both"; ``haystack``: "filler", "corpus" (the run's
    own prepared data, split ``split``) or a prepared data directory tokenized with the run's tokenizer;
    ``position_options`` are set on the encoding for this evaluation (e.g. {"scale": 0.5}; the value "max"
    means the longest length); ``step``: the checkpoint (default the latest)."""

    lengths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    split: str = "test"
    position_options: dict[str, Any] = field(default_factory=dict)
    base_length: int | None = None
    step: int | None = None

    def checked(self) -> PasskeyOptions:
        """The options checked before any work, lengths sorted and made distinct."""
        if self.mode not in MODES:
            raise UserError(f"unknown passkey mode {self.mode!r}; choose rank, generate or both.")
        if not self.lengths or any(int(k) != k or k < 1 for k in self.lengths):
            raise UserError(
                "passkey lengths must be positive integers (multiples of the training length), e.g. 1,2,4."
            )
        if not self.depths or any(not 0 <= d <= 1 for d in self.depths):
            raise UserError("needle depths must be fractions in [0, 1], e.g. 0,0.25,0.5,0.75,1.")
        if self.trials < 1:
            raise UserError(f"trials must be at least 1, got {self.trials}.")
        if not 1 <= self.key_digits <= MAX_KEY_DIGITS:
            raise UserError(f"--key-digits must be between 1 and {MAX_KEY_DIGITS}, got {self.key_digits}.")
        check_candidates(self.mode, self.candidates, self.key_digits)
        check_seed(self.seed)
        return replace(
            self,
            lengths=sorted({int(k) for k in self.lengths}),
            depths=[float(d) for d in self.depths],
            position_options=dict(self.position_options or {}),
        )


def passkey(
    run_dir: Run | str | Path,
    options: PasskeyOptions | None = None,
    *,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = False,
    force: bool = False,
    shard: Shard | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Score a run on passkey retrieval over ``options.lengths`` x ``options.depths`` (``PasskeyOptions``,
    any of whose fields may be given as keywords instead); write RUN/eval/NAME.json.

    Returns the result dict (also written, atomically); the same request is reused, a different one
    under the same name is a UserError unless ``overwrite``; scoring estimated past a day is refused
    unless ``force`` (``check_passkey_time``). Under torchrun the prompts are dealt out to the processes
    of ``shard`` (default: the group this process joined).
    """
    opts = given_options(PasskeyOptions, options, fields)
    how = Scoring(name, overwrite, device, progress, force, batch_tokens)
    return drive(PasskeyEvaluator(), run_dir, opts, shard, how)


def score_passkey(
    prepared: Prepared[PasskeyOptions], slot: ResultSlot, shard: Shard, how: Scoring
) -> dict[str, Any]:
    """The passkey grid of ``prepared`` (``PasskeyEvaluator.score``): the result to write, its prompts
    dealt out to the processes of ``shard``."""
    from tqdm.auto import tqdm

    handle, opts, name = prepared.run, prepared.request, prepared.name
    lengths, depths, trials, mode = opts.lengths, opts.depths, opts.trials, opts.mode
    device, batch_tokens, progress = how.device, how.batch_tokens, how.progress
    request = asdict(opts)
    t0 = time.perf_counter()
    run, L, options_applied = load_task_run(
        handle, slot, device, opts.base_length, opts.position_options, max(lengths)
    )
    hay_tokens, hay_source = (
        (None, "filler") if opts.haystack == "filler" else _corpus_haystack(run, opts.haystack, opts.split)
    )
    builder = PasskeyBuilder(run.tokenizer, hay_tokens, opts.key_digits)
    check_prompt_fits(lengths, L, builder.min_length(), True, "drop the shortest lengths")

    cells = []
    bar = tqdm(total=len(lengths) * len(depths), disable=not progress, desc=f"passkey {handle.path.name}")
    for k in lengths:
        for j, depth in enumerate(depths):
            t_cell = time.perf_counter()
            rng = np.random.default_rng([opts.seed, k, j])
            prompts = [builder.build(k * L, depth, rng) for _ in range(trials)]
            scores = score_prompts(
                run.model, run.tokenizer, builder, prompts, mode, opts.candidates, rng, batch_tokens, shard
            )
            cells.append(
                {
                    "ev": k,
                    "length": k * L,
                    "depth": depth,
                    **scores,
                    "seconds": round(time.perf_counter() - t_cell, 3),
                }
            )
            bar.update(1)
    bar.close()
    metric = primary_metric(mode)
    by_length = [
        {"ev": k, "length": k * L, metric: float(np.mean([c[metric] for c in cells if c["ev"] == k]))}
        for k in lengths
    ]
    result = {
        **task_result(name, "passkey", handle.path, request, run, options_applied, L, slot),
        "haystack_source": hay_source,
        "metric": metric,
        "example": _example(run.tokenizer, builder, L * lengths[0]),
        "results": cells,
        "by_length": by_length,
        "wall_time": time.perf_counter() - t0,
    }
    return result


def check_prompt_fits(lengths: Sequence[int], L: int, need: int, exact: bool, advice: str) -> None:
    """Refuse ``lengths`` (multiples of ``L``) whose shortest prompt holds fewer than ``need`` tokens (the
    needle, the question and ``MARGIN``; ``exact`` false: at least that many, ``prompt_floor``)."""
    if min(lengths) * L < need:
        tokens = f"{need} tokens" if exact else f"at least {need} tokens of this tokenizer"
        raise UserError(
            f"the shortest passkey prompt ({min(lengths)} x {L} tokens) cannot hold the needle and the "
            f"question ({tokens}); {advice}."
        )


def prompt_floor(data: DataConfig, run_dir: Path | None, key_digits: int) -> tuple[int, bool]:
    """The fewest tokens a passkey prompt needs with a sweep row's tokenizer, known before the row trains,
    and whether that is exact (``PasskeyBuilder.min_length``): exact where the tokenizer exists already
    (the row's run, a prepared ``data.dir``, a tokenizer file); a sweep prepares ``bpe:N`` data only after
    its checks (and ``gpt2`` may not be fetched yet), so there a lower bound: both cut text with GPT-2's
    pre-tokenizer regex (Radford et al. 2019) before merging bytes, no token crosses a piece, and the needle
    and question take at least as many tokens as pieces. Any other tokenizer: one token each. A bound never
    refuses a sweep whose prompts fit; ``score_passkey`` checks the exact count again."""
    from tokenizers import pre_tokenizers

    from extrapos.data.named_tokenizers import NAMED_TOKENIZERS
    from extrapos.data.tokenizer import is_trained_spec
    from extrapos.tasks.common import known_tokenizer

    spec = str(data.tokenizer).strip()
    tokenizer = known_tokenizer(data, run_dir)
    if tokenizer is not None:
        return PasskeyBuilder(tokenizer, None, key_digits).min_length(), True
    if data.dir or not (is_trained_spec(spec) or spec in NAMED_TOKENIZERS):
        return 1 + 1 + MARGIN, False
    pieces = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex, as bpe:N trains with
    needle = pieces.pre_tokenize_str(" " + NEEDLE.format(key="9" * key_digits) + " ")
    question = pieces.pre_tokenize_str(" " + QUESTION)
    return len(needle) + len(question) + MARGIN, False


def check_candidates(mode: str, candidates: int, key_digits: int) -> None:
    """Rank mode's candidate keys: at least 2, at most ``MAX_CANDIDATES`` (each is a forward over the
    whole prompt) and at most half the keys of ``key_digits`` digits (the alternatives are drawn at
    random until that many distinct ones are found, which must end quickly)."""
    if mode == "generate":
        return
    keys = 9 * 10 ** (key_digits - 1)
    limit = min(MAX_CANDIDATES, max(2, keys // 2))
    if not 2 <= candidates <= limit:
        raise UserError(
            f"--candidates must be between 2 and {limit} for keys of {key_digits} digits "
            f"(at most {MAX_CANDIDATES}, and half the {keys} possible keys), got {candidates}."
        )


def check_passkey_memory(
    source: ModelConfig | str | Path,
    lengths: Sequence[int],
    trials: int,
    mode: str,
    candidates: int,
    base_length: int | None,
    device: str,
    batch_tokens: int = 16_384,
    advice: str = "ask for shorter --lengths or fewer --trials",
    what: str = "passkey prompts",
) -> None:
    """Refuse before loading the model a request whose longest cell cannot fit in memory (``what``: the
    prompts' name in the sentence, e.g. RULER's): the cell's
    ``trials`` prompts (a list of token ids each), rank mode's candidate rows and one forward over
    them, generate mode's batch of prompts with its KV cache (``run.memory.forward_bytes``). ``source``: a
    run directory, or a model config (a sweep's row before it is trained)."""
    from extrapos.model import ModelConfig
    from extrapos.run.config import load_run_config

    model = source if isinstance(source, ModelConfig) else load_run_config(Path(source)).model
    T = max(lengths) * (base_length or model.train_length)
    need = trials * T * 8  # the cell's prompts, built before they are scored
    if mode in ("rank", "both"):
        rows = min(candidates, max(1, batch_tokens // T))
        need += candidates * (T + 8) * 8 + forward_bytes(model, T + 8, rows)
    if mode in ("generate", "both"):
        rows = min(trials, max(1, batch_tokens // T))
        need += forward_bytes(model, T + 8, rows, cache=True)
    check_memory(
        need,
        device,
        f"{what} of {max(lengths)} x {base_length or model.train_length} = {T} tokens ({trials} per cell)",
        advice,
    )


def check_passkey_time(
    run: Run, opts: PasskeyOptions, device: str, force: bool, ask: bool = False
) -> float | None:
    """Print the least time the cells take when past a minute and refuse them past a day unless ``force``
    (past an hour: confirmed with ``ask``; returns the estimate, ``run.timing``): every trial of every
    (length, depth) cell runs its prompt once per candidate in rank mode and once, with a few new tokens, in
    generate mode, each token seeing half the prompt."""
    from extrapos.run.timing import check_time, forward_flops

    model = run.cfg.model
    L = opts.base_length or model.train_length
    runs = (opts.candidates if opts.mode in ("rank", "both") else 0) + (opts.mode in ("generate", "both"))
    flops = sum(
        forward_flops(model, len(opts.depths) * opts.trials * runs * (k * L + opts.key_digits), k * L / 2)
        for k in opts.lengths
    )
    what = f"passkey cells up to {max(opts.lengths)} x {L} tokens"
    return check_time(flops, device, what, "ask for shorter --lengths or fewer --trials", force, ask=ask)


def is_matplotlib_png(path: Path) -> bool:
    """A PNG that matplotlib saved (its header's text chunk names it), as every extrapos plot is."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and b"Matplotlib" in head


def check_plot_path(run_dir: str | Path, path: str | Path) -> Path:
    """``--plot`` checked before any work: a .png file that is not a directory and, inside the run, only
    under RUN/plots/ (a run's own files are never replaced by a picture)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise UserError(f"--plot writes a PNG image, so give it a file name ending in .png, got {path}.")
    if path.is_dir():
        raise UserError(f"--plot {path} is a directory; give a file name ending in .png.")
    run_dir = Path(run_dir).resolve()
    where = path.resolve()
    if where.is_relative_to(run_dir) and not where.is_relative_to(run_dir / "plots"):
        raise UserError(
            f"--plot {path} is inside the run {run_dir}, whose files a plot never replaces; write it "
            f"under {run_dir / 'plots'} or outside the run."
        )
    if not where.is_relative_to(run_dir):  # another run's files, or a picture of the user's, are kept
        check_owned_file(path, "--plot", "an extrapos plot", is_matplotlib_png)
    return path


def primary_metric(mode: str) -> str:
    return "exact_match" if mode == "generate" else "rank_accuracy"


def default_name(opts: PasskeyOptions) -> str:
    """The result's name when no --name is given: the mode, haystack, lengths and encoding options, then a
    digest of the whole request (depths, trials, seed, key digits, candidates, split, checkpoint...). A name
    of the mode, haystack and options alone made a second, different request (other lengths, seed or
    depths) collide with the first, as RULER's did (issue 48); an equal request keeps its name, so its result
    is reused. ``opts``: checked (``PasskeyOptions.checked``), so lengths in another order name the same."""
    hay = (
        "filler"
        if opts.haystack == "filler"
        else ("corpus" if opts.haystack == "corpus" else slug(Path(opts.haystack).name))
    )
    parts = ["passkey", opts.mode, hay, "ev" + "_".join(map(str, opts.lengths))]
    return request_name(parts + [f"{k}{v}" for k, v in sorted(opts.position_options.items())], opts)


def _example(tokenizer: Tokenizer, builder: PasskeyBuilder, length: int) -> dict[str, Any]:
    p = builder.build(length, 0.5, np.random.default_rng(0))
    return {"length": length, "key": p.key, "text": tokenizer.decode(p.tokens)}


# ---- reports -------------------------------------------------------------------------------------------


def format_grid(result: dict[str, Any], metric: str | None = None) -> str:
    """A markdown grid: one row per length, one column per depth, the accuracy in each cell (and the mean)."""
    metric = metric or result["metric"]
    cells = result["results"]
    depths = sorted({c["depth"] for c in cells})
    lengths = sorted({(c["ev"], c["length"]) for c in cells})
    req = result["request"]
    lines = [
        f"passkey {req['mode']} ({metric}; {req['trials']} trials per cell, haystack {req['haystack']}, "
        f"encoding {result['encoding']}, L_t={result['train_length']})",
        "| ev | length | " + " | ".join(f"depth {d:g}" for d in depths) + " | mean |",
        "|---:|---:|" + "---:|" * (len(depths) + 1),
    ]
    for ev, length in lengths:
        row = {c["depth"]: c[metric] for c in cells if c["ev"] == ev}
        vals = [row[d] for d in depths]
        lines.append(
            f"| {ev} | {length} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {np.mean(vals):.2f} |"
        )
    if metric == "rank_accuracy":
        lines.append(f"(chance: {1 / req['candidates']:.2f})")
    return "\n".join(lines)


def format_all(result: dict[str, Any]) -> str:
    """One grid per computed metric: what the console shows after a passkey run."""
    return format_every_metric(result, format_grid)


def plot_heatmap(result: dict[str, Any], path: str | Path, metric: str | None = None) -> Path:
    """Save a length x depth heatmap of the accuracy (matplotlib) to ``path``."""
    metric = metric or result["metric"]
    cells = result["results"]
    depths = sorted({c["depth"] for c in cells})
    lengths = sorted({c["length"] for c in cells})
    grid = np.full((len(depths), len(lengths)), math.nan)
    for c in cells:
        grid[depths.index(c["depth"]), lengths.index(c["length"])] = c[metric]
    title = f"passkey {metric}: {result['encoding']} (L_t={result['train_length']})"
    return accuracy_heatmap(
        grid,
        [f"{d:g}" for d in depths],
        lengths,
        train_length=result["train_length"],
        title=title,
        xlabel="prompt length (tokens)",
        ylabel="needle depth",
        path=path,
        size=(2.5, 0.55),
        edge_line=True,
    )


__all__ = [
    "FILLER",
    "NEEDLE",
    "QUESTION",
    "PasskeyBuilder",
    "PasskeyOptions",
    "PasskeyPrompt",
    "passkey",
    "computed_metrics",
    "format_all",
    "format_grid",
    "plot_heatmap",
    "score_prompts",
    "first_number",
]


class PasskeyEvaluator(Evaluator[PasskeyOptions]):
    """Passkey retrieval (``passkey``; Mohtashami & Jaggi 2023, §4.2), its prompts dealt out to ``shard``."""

    name: ClassVar[str] = "passkey"
    request_type: ClassVar[type] = PasskeyOptions
    refused_as: ClassVar[str] = "result"

    def prepare(
        self, run: Run | str | Path, request: PasskeyOptions, how: Scoring
    ) -> Prepared[PasskeyOptions]:
        opts = request.checked()
        name = check_result_name(how.name or default_name(opts))
        handle = Run.open(run)
        refuse_encoder(handle, "passkey")
        return Prepared(handle, opts, name)

    def open_slot(self, prepared: Prepared[PasskeyOptions], how: Scoring) -> ResultSlot:
        opts = prepared.request
        return task_slot(prepared.run, prepared.name, asdict(opts), opts.step, how.overwrite)

    def estimate(self, prepared: Prepared[PasskeyOptions], how: Scoring) -> float | None:
        opts = prepared.request
        check_passkey_memory(
            prepared.run.cfg.model, opts.lengths, opts.trials, opts.mode, opts.candidates, opts.base_length,
            how.device, how.batch_tokens,
        )  # fmt: skip
        return check_passkey_time(prepared.run, opts, how.device, how.force, how.ask)

    def options(self, request: PasskeyOptions) -> dict[str, Any]:
        return request.position_options

    def score(
        self, prepared: Prepared[PasskeyOptions], slot: ResultSlot, shard: Shard, how: Scoring
    ) -> dict[str, Any]:
        return score_passkey(prepared, slot, shard, how)

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """A sweep's passkey column: accuracy per length over the depths of ``spec``."""
        name = column_name(f"passkey-{spec.mode}", at.lengths, at.position_options, at.base_length, spec)
        opts = PasskeyOptions(**at.where(), **asdict(spec))
        return passkey(run, opts, name=name, progress=how.progress, device=how.device)
