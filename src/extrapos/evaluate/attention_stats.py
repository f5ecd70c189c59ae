"""`extrapos attention`: what each head attends to at every evaluation length (docs/attention-diagnostics.md).

The segmented-sequences paper reads attention to explain extrapolation (its Figure 3: the median
attention weight of positions past L_t); this module gives such readings per layer and head at each
length k x L_t,
on the held-out windows `extrapos eval` scores (its documents protocol, the same spans and windows).

The attention probabilities are materialized from the model's own pieces, so they are the ones the
model uses: each block's ``Attention.capture`` hook (model.py) hands over q and k after the
encoding's transforms (RoPE rotations, ExPE's inputs) and the bias description (ALiBi, CABLE, T5,
Kerple, FIRE, CoPE, DAPE, ...), which ``attention.bias_block`` expands (a ``LogitBias`` gets the
block's logits as in ``attention/chunked.py``); the causal and document masks are applied as there. Queries
run in blocks, so memory is O(block x T) at any length.

Per query i, with p_ij its attention probabilities over the visible keys j (n_i of them):

* entropy ``H_i = -sum_j p_ij log p_ij`` (nats), and ``H_i / log n_i`` (1 = uniform; queries that see
  one key have no normalised entropy and are left out of its mean);
* sink mass ``sum of p_ij over the first k visible keys`` (k = 1, 4): the window's first tokens, or
  the first tokens of the query's own document under a document mask;
* distance ``|i - j|`` in tokens: its mean ``sum_j p_ij |i - j|`` and its median, the lower weighted
  median ``min {d : sum_{j: |i-j| <= d} p_ij >= 1/2}``;
* the median weight ``n_i x median_j p_ij`` (the lower median over the visible keys): 1 when the
  weights are even, near 0 when a few keys hold the mass (the segmented-sequences paper's Figure 3
  reads this median, "well below the mean", for positions past L_t).

Each statistic is averaged over every query position of every window (each query counts once), per
layer and head; and again over the queries past L_t only (``beyond``: those with more context than
training gave any, where extrapolation happens; none at ev = 1). The sums behind every mean are kept
per held-out document, so intervals resample documents as they do for the loss (``report/stats.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import torch
from torch import Tensor

from extrapos.attention import bias_block, document_visible
from extrapos.errors import UserError
from extrapos.evaluate.driver import drive
from extrapos.evaluate.evaluator import ColumnAt, Evaluator, Prepared, Scoring, column_name
from extrapos.evaluate.request import EvalRequest
from extrapos.evaluate.slot import ResultSlot, check_result_name, open_slot
from extrapos.evaluate.window_options import per_window_options
from extrapos.files import save_png
from extrapos.positions.base import FoldedBias, LogitBias, PairwiseBias
from extrapos.run.handle import Run
from extrapos.run.runtime import Shard

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from extrapos.model import Attention, Decoder

SINKS = (1, 4)
#: the statistics of every (layer, head), in the order of the console table
STATISTICS = (
    "entropy",
    "entropy_norm",
    *(f"sink{k}" for k in SINKS),
    "mean_distance",
    "median_distance",
    "median_weight",
)
LABELS = {
    "entropy": "entropy (nats)",
    "entropy_norm": "entropy / log n",
    **{f"sink{k}": f"mass on first {k}" for k in SINKS},
    "mean_distance": "mean distance",
    "median_distance": "median distance",
    "median_weight": "median weight x n",
}
#: the statistics the console shows for the queries past L_t
BEYOND_COLUMNS = ("entropy_norm", "sink1", "median_distance", "median_weight")
#: elements (B x H x queries x keys) of one block of probabilities; the statistics keep a few such
#: blocks alive (16 MB each in fp32), whatever the length
BLOCK_ELEMENTS = 1 << 22
#: bins of the per-query median weight x n past L_t (the segmented-sequences paper's Figure 3 is its
#: histogram): n x the lower median of n weights that sum to 1 lies in [0, 2) (at most n/2 weights can be
#: at least the median), so 40 bins of 0.05 cover every value
MEDIAN_WEIGHT_EDGES = [i / 20 for i in range(41)]
#: bump when a definition changes: saved results of an older definition are computed again
VERSION = 4


# ---- the attention probabilities ----------------------------------------------------------------


def attention_probabilities(
    q: Tensor,
    k: Tensor,
    bias: Any = None,
    *,
    causal: bool = True,
    documents: Tensor | None = None,
    queries: tuple[int, int] | None = None,
    window: int | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_h) + bias) under the causal, document and sliding-window (``window``)
    masks, for the queries ``queries`` = [q0, q1) (default all), as ``attention.attention_reference``
    forms it.

    Shapes as in the attention package (``attention/__init__.py``): q (B, H, Tq, d_h), k (B, H_kv, Tk,
    d_h), queries aligned to the end of the keys. Returns (probabilities (B, H, tq, tk), visible (B or 1,
    1, tq, tk) bool), in fp32 (fp64 for fp64 inputs), over the keys [0, tk): causally, the keys after
    the last query are left out.
    """
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    past = Tk - Tq
    q0, q1 = queries or (0, Tq)
    kend = past + q1 if causal else Tk
    dtype = torch.promote_types(q.dtype, torch.float32)
    keys = k[:, :, :kend]
    if keys.shape[1] != H:  # grouped-query attention: each key head serves H / H_kv query heads
        keys = keys.repeat_interleave(H // keys.shape[1], dim=1)
    qb = q[:, :, q0:q1]
    scores = (qb.to(dtype) @ keys.to(dtype).transpose(-1, -2)) / math.sqrt(Dh)
    if documents is not None:
        visible = document_visible(documents, past, (q0, q1), (0, kend), causal)
    else:
        i = torch.arange(q0, q1, device=q.device).unsqueeze(-1) + past
        visible = torch.arange(kend, device=q.device) <= i if causal else torch.ones_like(scores[0, 0]).bool()
        visible = visible[None, None]
    if window is not None:  # the layer's sliding window (model.sliding_window) hides the keys before it
        i = torch.arange(q0, q1, device=q.device).unsqueeze(-1) + past
        visible = visible & (torch.arange(kend, device=q.device) > i - window)
    if isinstance(bias, LogitBias):
        qf, kf = bias.q_feat[:, :, q0:q1], bias.k_feat[:, :, :kend]
        mask = visible if documents is not None else visible[0, 0]
        scores = scores + bias.fn(scores, qb, qf, kf, mask).to(dtype)
    elif isinstance(bias, FoldedBias):
        # q_feat_i * k_feat_j is exact up to a row constant: shifting k_feat by the block's last query's
        # own key (as attention/fold.py does) keeps the products small, hence precise, at long lengths
        kf = bias.k_feat[:, :, :kend].to(dtype)
        ref = past + q1 - 1
        shifted = FoldedBias(bias.q_feat[:, :, q0:q1].to(dtype), kf - kf[:, :, ref : ref + 1])
        scores = scores + bias_block(shifted)
    elif isinstance(bias, PairwiseBias):
        scores = scores + bias_block(replace(bias, k_feat=bias.k_feat[:, :, :kend]), slice(q0, q1)).to(dtype)
    elif bias is not None:
        raise TypeError(f"unknown bias description {type(bias).__name__}")
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1), visible


def block_statistics(probs: Tensor, visible: Tensor, first_query: int, past: int) -> dict[str, Tensor]:
    """The statistics (module docstring) of every query of a block: each (B, H, tq), plus ``valid_norm``
    (queries that see at least two keys) for the normalised entropy.

    ``probs`` (B, H, tq, tk) over keys 0..tk-1 with ``visible`` (B or 1, 1, tq, tk); the block's queries
    are at key indices ``past + first_query + t``."""
    B, H, tq, tk = probs.shape
    n_visible = visible.sum(-1).expand(B, H, tq)
    entropy = -torch.special.xlogy(probs, probs).sum(-1)
    valid = n_visible >= 2
    entropy_norm = torch.where(valid, entropy / n_visible.clamp(min=2).log(), torch.zeros_like(entropy))
    out = {"entropy": entropy, "entropy_norm": entropy_norm, "valid_norm": valid}
    rank = visible.cumsum(-1)  # 1 for the first visible key of each row, 2 for the second, ...
    for k in SINKS:
        out[f"sink{k}"] = (probs * (visible & (rank <= k))).sum(-1)
    i = torch.arange(tq, device=probs.device).unsqueeze(-1) + past + first_query
    distance = (i - torch.arange(tk, device=probs.device)).abs()  # (tq, tk)
    out["mean_distance"] = (probs * distance).sum(-1)
    # the mass at each distance d (bidirectional rows put two keys at most d > 0), then its running sum
    mass = torch.zeros_like(probs).scatter_add_(-1, distance.expand(B, H, tq, tk), probs)
    below_half = (mass.cumsum(-1) < 0.5).sum(-1)
    out["median_distance"] = below_half.clamp(max=tk - 1).to(probs.dtype)
    weights = probs.masked_fill(~visible, float("nan"))  # the invisible keys are no weights at all
    out["median_weight"] = weights.nanmedian(-1).values * n_visible
    return out


class Accumulator:
    """Sums of the statistics of one layer over queries (float64), per head: every query, or with
    ``first_query`` only those at that window position or later (e.g. L_t: the queries that have more
    context than training gave any).

    The sums are kept per group of rows (``groups`` of them; ``row_groups`` gives the group of each row
    of the batch being read, e.g. the held-out document a window comes from), so that intervals can
    resample documents as ``report/stats.py`` does for the loss; without ``row_groups`` every row is
    group 0."""

    def __init__(self, first_query: int = 0, groups: int = 1, histogram: bool = False) -> None:
        self.first_query = first_query
        self.groups = groups
        # with ``histogram``: per head, how many queries had each bin of median weight x n
        self.histogram: Tensor | None = None if not histogram else torch.zeros(0, dtype=torch.float64)
        self.row_groups: Tensor | None = None  # (B,) int64: the group of each row of the current batch
        self.sums: dict[str, Tensor] = {}  # statistic -> (groups, H)
        self.group_queries = torch.zeros(groups, dtype=torch.float64)  # per head: the same queries
        self.group_queries_norm: Tensor | None = None  # (groups, H): queries that see two keys or more

    @property
    def queries(self) -> int:
        return int(self.group_queries.sum())

    def add(self, stats: dict[str, Tensor], position: int = 0) -> None:
        """Add a block's statistics (``block_statistics``) whose first query is at window position
        ``position``."""
        skip = max(0, self.first_query - position)
        B, H, tq = stats["entropy"].shape
        if skip >= tq:
            return
        if skip:
            stats = {name: value[:, :, skip:] for name, value in stats.items()}
            tq -= skip
        groups = self.row_groups if self.row_groups is not None else torch.zeros(B, dtype=torch.long)
        valid = stats["valid_norm"]
        for name in STATISTICS:
            value = stats[name].double()
            total = (value * valid if name == "entropy_norm" else value).sum(2).cpu()
            self.sums[name] = self.sums.get(name, torch.zeros(self.groups, H, dtype=torch.float64))
            self.sums[name].index_add_(0, groups, total)
        if self.group_queries_norm is None:
            self.group_queries_norm = torch.zeros(self.groups, H, dtype=torch.float64)
        self.group_queries_norm.index_add_(0, groups, valid.sum(2).cpu().double())
        self.group_queries.index_add_(0, groups, torch.full((B,), float(tq), dtype=torch.float64))
        if self.histogram is not None:
            self._count(stats["median_weight"])

    def _count(self, median_weight: Tensor) -> None:
        """Add (B, H, tq) median weights to the per-head histogram over ``MEDIAN_WEIGHT_EDGES``."""
        H = median_weight.shape[1]
        bins = len(MEDIAN_WEIGHT_EDGES) - 1
        if self.histogram is None or self.histogram.numel() == 0:
            self.histogram = torch.zeros(H, bins, dtype=torch.float64)
        width = MEDIAN_WEIGHT_EDGES[1] - MEDIAN_WEIGHT_EDGES[0]
        index = (median_weight.double().cpu() / width).floor().clamp(0, bins - 1).long()
        heads = torch.arange(H).view(1, H, 1).expand_as(index)
        self.histogram.view(-1).index_add_(
            0, (heads * bins + index).reshape(-1), torch.ones(index.numel(), dtype=torch.float64)
        )

    def means(self) -> dict[str, list[float | None]] | None:
        """Per statistic, the per-head means over every group; None when no query was added."""
        if not self.queries:
            return None
        # set by the first ``add``, which every query counted went through
        queries_norm = cast(Tensor, self.group_queries_norm)
        out = {}
        for name in STATISTICS:
            count = queries_norm.sum(0) if name == "entropy_norm" else self.group_queries.sum()
            mean = self.sums[name].sum(0) / count
            out[name] = [None if math.isnan(x) else float(x) for x in mean.tolist()]
        return out

    def per_group(self) -> dict[str, list] | None:
        """The sums per group and head and the numbers of queries they are over (a mean over any set of
        groups is the sum of their sums over the sum of their counts); None when no query was added."""
        if not self.queries:
            return None
        return {
            "queries": self.group_queries.tolist(),
            "queries_norm": cast(Tensor, self.group_queries_norm).tolist(),  # set by the first ``add``
            **{name: self.sums[name].tolist() for name in STATISTICS},
        }


def layer_statistics(
    q: Tensor,
    k: Tensor,
    bias: Any = None,
    *,
    causal: bool = True,
    documents: Tensor | None = None,
    accumulators: list[Accumulator] | None = None,
    block_elements: int = BLOCK_ELEMENTS,
    window: int | None = None,
) -> list[Accumulator]:
    """The statistics of one layer's attention (q, k, bias as the model's ``Attention.capture`` gets
    them; ``window``: the layer's sliding window), query block by query block, added to each of
    ``accumulators`` (one new by default)."""
    accumulators = accumulators if accumulators is not None else [Accumulator()]
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    past = Tk - Tq
    block = max(1, min(Tq, block_elements // max(1, B * H * Tk)))
    for q0 in range(0, Tq, block):
        q1 = min(q0 + block, Tq)
        probs, visible = attention_probabilities(
            q, k, bias, causal=causal, documents=documents, queries=(q0, q1), window=window
        )
        stats = block_statistics(probs, visible, q0, past)
        for acc in accumulators:
            acc.add(stats, past + q0)
    return accumulators


@torch.no_grad()
def model_statistics(
    model: Decoder,
    tokens: Tensor,
    positions: Tensor,
    accumulators: list[list[Accumulator]],
    documents: Tensor | None = None,
) -> None:
    """One no-grad forward of ``model`` on ``tokens`` (B, T), adding every layer's statistics to its
    accumulators (``accumulators[layer]``); the forward itself is unchanged (the hooks only read q, k
    and the bias)."""
    causal = model.cfg.causal
    # the blocks' ModuleList yields Modules: each is a model.Block, whose ``attn`` is the layer's Attention
    attns = [cast("Attention", block.attn) for block in model.blocks]

    def observer(accs: list[Accumulator], window: int | None) -> Callable[..., None]:
        def capture(q: Tensor, k: Tensor, v: Tensor, bias: Any, docs: Tensor | None) -> None:
            layer_statistics(q, k, bias, causal=causal, documents=docs, accumulators=accs, window=window)

        return capture

    try:
        for attn, accs in zip(attns, accumulators):
            attn.capture = observer(accs, attn.window)
        model.hidden_states(tokens, positions, documents=documents)
    finally:
        for attn in attns:
            attn.capture = None


# ---- the command ---------------------------------------------------------------------------------


def _key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def result_slot(run: Run, req: EvalRequest, name: str, overwrite: bool) -> ResultSlot:
    """The slot (``evaluate.slot``) of ``RUN/attention/<name>.json``: the saved result is reused when it is
    this very result (the same request of the same weights under the same definitions) and refused when it
    holds another request (unless ``overwrite``); the same request of other weights or older definitions,
    or a damaged file, is computed again."""
    ckpt, digest = run.checkpoint(req.step)
    # a result of older definitions (VERSION) is the same request, read again like older weights
    request_key = _key({"request": req.key_fields()})
    result_key = _key({"request": request_key, "step": ckpt.step, "weights": digest, "version": VERSION})
    return open_slot(
        run.path,
        name,
        ckpt,
        digest,
        request={"request_key": request_key},
        result={"result_key": result_key},
        overwrite=overwrite,
        refusal="holds different attention diagnostics; pass --name to keep both or --overwrite to "
        "replace it.",
        folder="attention",
        writes="attention diagnostics",
        key=result_key,
        request_key=request_key,
    )


def default_name(req: EvalRequest) -> str:
    from extrapos.evaluate.request import default_name as eval_name

    return eval_name(req)


def diagnose(
    run_dir: Run | str | Path,
    req: EvalRequest | None = None,
    name: str | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    batch_tokens: int = 16_384,
    progress: bool = True,
    force: bool = False,
    ask: bool = False,
) -> dict[str, Any]:
    """The attention statistics of a run at every length of ``req`` (an ``evaluate.EvalRequest``, documents
    protocol), on the windows `extrapos eval` scores; writes and returns ``RUN/attention/<name>.json``
    (reused when it holds this request of these weights) and the plot beside it. Work estimated past a
    day is refused unless ``force`` (``evaluate.check_eval_time``); ``ask``: past an hour, confirmed on a
    terminal (a command's own work, ``run.timing``)."""
    how = Scoring(name, overwrite, device, progress, force, batch_tokens, ask)
    return drive(AttentionEvaluator(), run_dir, req or EvalRequest(), None, how)


def score_attention(prepared: Prepared[EvalRequest], slot: ResultSlot, how: Scoring) -> dict[str, Any]:
    """The statistics of every layer and head at every length (``AttentionEvaluator.score``): the result
    to write."""
    from tqdm.auto import tqdm

    from extrapos.evaluate.inputs import load_eval_inputs

    handle, req, name = prepared.run, prepared.request, prepared.name
    device, batch_tokens, progress = how.device, how.batch_tokens, how.progress
    t0 = time.perf_counter()
    inputs = load_eval_inputs(handle, req, slot.ckpt, device, progress)
    run, L = inputs.run, inputs.L
    model = run.model
    spans = torch.from_numpy(inputs.spans)
    n_layers = len(model.blocks)
    rows = []
    total = spans.shape[0] * inputs.max_len * len(inputs.lengths)
    bar = tqdm(total=total, unit="tok", disable=not progress, desc=f"attention {handle.path.name}")
    # each length's window in tokens (the evaluator resolves them; older evaluators had only multiples)
    windows = getattr(inputs, "windows", None) or [k * L for k in inputs.lengths]
    documents, span_group = np.unique(inputs.owners, return_inverse=True)  # each span's document, 0..n-1
    for k, window in zip(inputs.lengths, windows):
        if inputs.per_window:  # as the evaluator: e.g. a learned table interpolated to each window
            model.pos.set_options(**per_window_options(model.pos, inputs.per_window, window, L))
        # the evaluator's windows: each span cut into non-overlapping windows, each starting at position 0
        windows = spans[:, :-1].reshape(-1, window)
        per_span = windows.shape[0] // spans.shape[0]
        window_group = torch.from_numpy(span_group).repeat_interleave(per_span)  # each window's document
        # every query, and the queries past L_t (more context than training gave; none at ev <= 1)
        accumulators = [
            [
                Accumulator(groups=len(documents)),
                Accumulator(first_query=L, groups=len(documents), histogram=True),
            ]
            for _ in range(n_layers)
        ]
        per_batch = max(1, batch_tokens // window)
        dev = next(model.parameters()).device
        positions = torch.arange(window, device=dev).unsqueeze(0)
        for b in range(0, windows.shape[0], per_batch):
            toks = windows[b : b + per_batch].to(dev)
            for acc in (a for pair in accumulators for a in pair):
                acc.row_groups = window_group[b : b + per_batch]
            model_statistics(model, toks, positions.expand(toks.shape[0], -1), accumulators)
            bar.update(toks.numel())
        rows.append(
            {
                "ev": k,
                "window": window,
                "windows": int(windows.shape[0]),
                "queries": accumulators[0][0].queries,
                "queries_beyond": accumulators[0][1].queries,
                "layers": [
                    # every window adds queries to the accumulator of every query: its means are there
                    {"layer": i, **cast(dict[str, Any], every.means()), "beyond": beyond.means()}
                    for i, (every, beyond) in enumerate(accumulators)
                ],
                # per held-out document (``doc_index`` in the split), the sums the means are made of,
                # for intervals that resample documents (report/stats.py) and rows paired on them
                "doc_index": documents.tolist(),
                # past L_t, per layer and head: the queries in each bin of median weight x n (Figure 3)
                "median_weight_histogram": None
                if not accumulators[0][1].queries
                else {
                    "edges": MEDIAN_WEIGHT_EDGES,
                    # the accumulators past L_t keep a histogram (histogram=True above)
                    "counts": [cast(Tensor, beyond.histogram).tolist() for _, beyond in accumulators],
                },
                "per_document": [
                    {"layer": i, "every": every.per_group(), "beyond": beyond.per_group()}
                    for i, (every, beyond) in enumerate(accumulators)
                ],
            }
        )
    bar.close()
    result = {
        "name": name,
        "kind": "attention",
        "version": VERSION,
        "run": str(handle.path),
        "request": req.written() if hasattr(req, "written") else asdict(req),
        "request_key": slot.request_key,
        "result_key": slot.key,
        "weights_sha256": slot.digest,
        "encoding": run.cfg.model.positions_plan().name,
        "applied": json.loads(json.dumps(req.position_options, default=str)),
        "train_length": L,
        "causal": bool(model.cfg.causal),
        "n_layers": n_layers,
        "n_heads": int(model.cfg.n_heads),
        "checkpoint_step": run.step,
        "data_dir": inputs.data_dir,
        "documents_used": inputs.docs_used,
        "documents_skipped": inputs.docs_skipped,
        "spans": int(spans.shape[0]),
        "statistics": list(STATISTICS),
        "results": rows,
        "wall_time": time.perf_counter() - t0,
    }
    return result


# ---- console and plot ------------------------------------------------------------------------------


def head_mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def format_result(result: dict[str, Any]) -> str:
    """Per length and layer, the mean over heads of every statistic (the heads are in the JSON)."""
    lines = [
        f"{result['run']}  encoding={result['encoding']}  L_t={result['train_length']}  "
        f"applied={result['applied'] or 'nothing'}",
        f"{result['spans']} spans from {result['documents_used']} held-out documents; per layer, the mean "
        f"over its {result['n_heads']} heads (per head: the JSON)",
        "| ev | layer | " + " | ".join(LABELS[s] for s in STATISTICS) + " |",
        "|---:|---:|" + "---:|" * len(STATISTICS),
    ]
    for row in result["results"]:
        for layer in row["layers"]:
            cells = [_cell(s, head_mean(layer[s])) for s in STATISTICS]
            lines.append(f"| {row['ev']} | {layer['layer']} | " + " | ".join(cells) + " |")
    if any(row.get("per_document") for row in result["results"]):
        lines += [
            "",
            "over every layer and head, with 95% intervals from resampling the documents (docs/"
            "attention-diagnostics.md):",
            "| ev | " + " | ".join(LABELS[s] for s in INTERVAL_COLUMNS) + " |",
            "|---:|" + "---|" * len(INTERVAL_COLUMNS),
        ]
        for row in result["results"]:
            cells = [statistic_interval(row, s)[1] for s in INTERVAL_COLUMNS]
            lines.append(f"| {row['ev']} | " + " | ".join(cells) + " |")
    beyond = [(row, layer) for row in result["results"] for layer in row["layers"] if layer.get("beyond")]
    if beyond:
        lines += [
            "",
            f"queries past L_t = {result['train_length']} only (more context than training gave any):",
            "| ev | layer | " + " | ".join(LABELS[s] for s in BEYOND_COLUMNS) + " |",
            "|---:|---:|" + "---:|" * len(BEYOND_COLUMNS),
        ]
        for row, layer in beyond:
            cells = [_cell(s, head_mean(layer["beyond"][s])) for s in BEYOND_COLUMNS]
            lines.append(f"| {row['ev']} | {layer['layer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the statistics the console gives intervals for (mean over every layer and head)
INTERVAL_COLUMNS = ("entropy_norm", "median_distance", "median_weight")


def statistic_interval(row: dict[str, Any], stat: str, which: str = "every") -> tuple[Any, str]:
    """The 95% interval of one length's ``stat``, averaged over every layer and head (``which``: "every"
    query or those "beyond" L_t), by resampling the held-out documents as ``stats.loss_interval`` does for
    the loss; or None and the reason in words (too few documents, none recorded)."""
    from extrapos.report import stats

    parts = [layer[which] for layer in row.get("per_document") or []]
    if not parts or any(part is None for part in parts):
        return None, "no per-document sums recorded" if not parts else "no queries"
    n = len(row["doc_index"])
    if n < stats.MIN_DOCUMENTS:
        return None, f"too few documents for an interval ({n}; it needs {stats.MIN_DOCUMENTS})"
    sums = sum(np.asarray(part[stat]).sum(1) for part in parts)  # (documents,): over layers and heads
    if stat == "entropy_norm":
        counts = sum(np.asarray(part["queries_norm"]).sum(1) for part in parts)
    else:  # every head of every layer reads the same queries
        counts = sum(np.asarray(part["queries"]) * np.asarray(part[stat]).shape[1] for part in parts)
    interval = stats.loss_interval(sums, counts)
    return interval, f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def _cell(stat: str, value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}" if "distance" in stat else f"{value:.3f}"


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Median attended distance and normalised entropy vs length (one line per layer, mean over heads), and
    both per head at the longest length as heat maps; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info(
            "attention: matplotlib is not installed, skipping the plot (pip install 'extrapos[plots]')."
        )
        return None
    rows = result["results"]
    evs = [r["ev"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, stat in zip(axes[0], ("median_distance", "entropy_norm")):
        for layer in range(result["n_layers"]):
            values = [head_mean(r["layers"][layer][stat]) for r in rows]
            ax.plot(evs, [math.nan if v is None else v for v in values], marker="o", label=f"layer {layer}")
        if stat == "median_distance":
            if result["causal"]:  # uniform attention over the i + 1 visible keys: median floor(i / 2)
                uniform = [sum(i // 2 for i in range(r["window"])) / r["window"] for r in rows]
                ax.plot(evs, uniform, color="grey", linestyle="--", linewidth=1, label="uniform attention")
            ax.set_yscale("symlog", base=2, linthresh=1)  # distances grow with the window: ratios read
        ax.set_xscale("log", base=2)
        ax.set_xticks(evs, [str(e) for e in evs])
        ax.set_xlabel("evaluation length / training length (ev)")
        ax.set_ylabel(LABELS[stat] + " (mean over heads)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_title("Median distance attended to (tokens)", fontsize=10)
    axes[0][1].set_title("Attention entropy / log(visible keys)", fontsize=10)
    longest = rows[-1]
    for ax, stat in zip(axes[1], ("median_distance", "entropy_norm")):
        grid = [[math.nan if v is None else v for v in layer[stat]] for layer in longest["layers"]]
        image = ax.imshow(grid, aspect="auto", cmap="viridis")
        fig.colorbar(image, ax=ax)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(result["n_heads"]))
        ax.set_yticks(range(result["n_layers"]))
        ax.set_title(f"{LABELS[stat]} per head at ev={longest['ev']}", fontsize=10)
    fig.suptitle(
        f"{Path(result['run']).name}: {result['encoding']}, L_t={result['train_length']}", fontsize=10
    )
    fig.tight_layout()
    try:
        save_png(fig, path, dpi=110)  # whole or not at all, an abandoned temporary of it swept
    finally:
        plt.close(fig)
    return path


class AttentionEvaluator(Evaluator[EvalRequest]):
    """`extrapos attention` (``diagnose``): what each head attends to at every length, on eval's windows; in
    one process (the statistics are not dealt out to a group)."""

    name: ClassVar[str] = "attention"
    request_type: ClassVar[type] = EvalRequest
    refused_as: ClassVar[str] = "attention diagnostics"

    def prepare(self, run: Run | str | Path, request: EvalRequest, how: Scoring) -> Prepared[EvalRequest]:
        from extrapos.evaluate.request import check_request, request_lengths, resolve_request

        req = resolve_request(request)
        check_request(req)
        if req.protocol != "documents" or req.stride is not None:
            raise UserError(
                "attention diagnostics read the documents protocol's windows (no stream, no --stride); drop "
                "those options."
            )
        handle = Run.open(run)
        name = check_result_name(how.name or default_name(req))
        # fractional and token lengths are checked against L_t before any result is looked at
        request_lengths(req, req.base_length or handle.cfg.model.train_length)
        return Prepared(handle, req, name)

    def open_slot(self, prepared: Prepared[EvalRequest], how: Scoring) -> ResultSlot:
        return result_slot(prepared.run, prepared.request, prepared.name, how.overwrite)

    def estimate(self, prepared: Prepared[EvalRequest], how: Scoring) -> float | None:
        from extrapos.evaluate.estimates import check_eval_memory, check_eval_time

        check_eval_memory(prepared.run, prepared.request, how.device, how.batch_tokens)
        return check_eval_time(prepared.run, prepared.request, how.device, how.force, how.ask)

    def options(self, request: EvalRequest) -> dict[str, Any]:
        return request.position_options

    def score(
        self, prepared: Prepared[EvalRequest], slot: ResultSlot, shard: Shard, how: Scoring
    ) -> dict[str, Any]:
        return score_attention(prepared, slot, how)

    def finish(self, slot: ResultSlot, result: dict[str, Any], written: bool, how: Scoring) -> None:
        """The plot beside the result: drawn after a write, and again for a reused result that lost it."""
        png = slot.out_path.with_suffix(".png")
        if written or not png.is_file():
            plot(result, png)

    def column(self, run: Run, spec: Any, at: ColumnAt, how: Scoring) -> dict[str, Any]:
        """A sweep's attention column (``spec``: max_tokens, split and the statistics its report shows)."""
        req = EvalRequest(
            lengths=list(at.lengths),
            base_length=at.base_length,
            split=spec.split,
            max_tokens=spec.max_tokens,
            position_options=dict(at.position_options),
        )
        name = column_name("attention", at.lengths, at.position_options, at.base_length, spec.keyed())
        result = diagnose(run, req, name=name, device=how.device, progress=how.progress)
        return {**result, "report_statistics": list(spec.statistics)}  # what the report shows of it
