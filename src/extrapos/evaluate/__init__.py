"""`extrapos eval`: train short, test long, measured the way the papers do.

Two protocols (``ev = k`` means windows of k x L_t tokens; docs/evaluation.md explains both):

**documents** (the default; needs held-out documents of ``max(k) * L_t + 1`` tokens):

1. Cut held-out documents long enough into non-overlapping spans of ``max(k) * L_t`` targets (shorter
   documents are skipped and counted), spread over as many documents as the budget allows: the first
   span of every document before the second of any (evenly spaced documents when the budget holds
   fewer spans than there are documents).
2. Split every span into non-overlapping windows of each length; every window starts at position 0.
   So every length scores exactly the same target tokens, and only the context differs.

**stream** (for corpora of documents shorter than the longest window, ``evaluate.stream``): the
held-out documents joined with end-of-text; fixed blocks of L_t targets, each scored at every length
by the window of k x L_t tokens that ends with it, its context crossing document boundaries
(``boundary = "cross"``) or masked to the target's own document (``"mask"``).

Either way:

3. Report per length: mean token loss, perplexity, bits per byte (nats of the scored tokens over
   the UTF-8 bytes they decode to), and the loss of each window's last L_t tokens ("tail": does
   a longer context help the tokens that have the most of it?).
4. Per-position loss in the longest windows, in buckets: where the model breaks.
5. For confidence intervals (``extrapos.report.stats``), per length and per document: the sum of its
   scored token losses and its number of scored tokens, with the documents' indices in the split
   (``doc_index``), so that rows scoring the same documents are paired. And the mean over windows
   of each window's perplexity (``seq_ppl``), the segmented-sequences paper's aggregate (Karypis
   et al., eq. 3), beside exp(mean loss).

Inference-time changes (ExPE/ExQPE ``scale``, RoPE scalings, learned-table interpolation) are
options of the encoding, set with ``set_options`` before scoring and recorded in the result.

This file is the package's public face; the parts live beside it: ``request`` (what defines an
evaluation, its keys and name), ``lengths`` (multiples of L_t and window lengths), ``spans`` (which
targets are scored), ``inputs`` (the run and the split loaded), ``scoring`` (losses in windows),
``estimates`` (memory and time, before any loading), ``documents`` and ``stream`` (the protocols),
``next_token`` (`extrapos eval` of a decoder), ``format`` (its console table), ``slot`` (the result slot
every evaluator shares), ``mlm`` (the same protocol for encoders: masked-LM loss) and
``attention_stats`` (`extrapos attention`: what each head attends to at every length).
"""

from extrapos.evaluate.documents import score_documents
from extrapos.evaluate.estimates import check_eval_memory, check_eval_time
from extrapos.evaluate.format import INTERVAL_NOTE, PAIRED_NOTE, format_result
from extrapos.evaluate.inputs import EvalInputs, ScoredRun, load_eval_inputs, load_scored_run
from extrapos.evaluate.next_token import evaluate, result_slot
from extrapos.evaluate.request import (
    BOUNDARIES,
    DEFAULT_LENGTHS,
    LEGACY_FIELDS,
    PROTOCOLS,
    SELECTIONS,
    UNSET_FIELDS,
    EvalRequest,
    check_lengths,
    check_request,
    default_name,
    request_lengths,
    resolve_request,
    result_key,
)
from extrapos.evaluate.scoring import Scored, bucketed, score_windows, token_losses
from extrapos.evaluate.slot import check_result_name
from extrapos.evaluate.spans import collect_spans, per_document, spread_counts, targets_digest

__all__ = [
    "BOUNDARIES",
    "DEFAULT_LENGTHS",
    "INTERVAL_NOTE",
    "LEGACY_FIELDS",
    "PAIRED_NOTE",
    "PROTOCOLS",
    "SELECTIONS",
    "UNSET_FIELDS",
    "EvalInputs",
    "EvalRequest",
    "Scored",
    "ScoredRun",
    "bucketed",
    "check_eval_memory",
    "check_eval_time",
    "check_lengths",
    "check_request",
    "check_result_name",
    "collect_spans",
    "default_name",
    "evaluate",
    "format_result",
    "load_eval_inputs",
    "load_scored_run",
    "per_document",
    "request_lengths",
    "resolve_request",
    "result_key",
    "result_slot",
    "score_documents",
    "score_windows",
    "spread_counts",
    "targets_digest",
    "token_losses",
]
