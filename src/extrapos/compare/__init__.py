"""`extrapos compare`: train several encodings on identical data, size, budget and seed; evaluate all
at the same lengths; write one report.

A sweep preset (``configs/compare/<name>.toml``) names a training preset, overrides shared by every
row, the evaluation lengths, and the rows::

    title = "Quick comparison"
    train = "cpu/small"
    set = ["train.tokens=800000"]
    lengths = [1, 2, 4, 8, 16]

    [[rows]]
    name = "ExPE"
    positions = { name = "expe" }

    [[rows]]
    name = "ExPE x0.5"
    reuse = "ExPE"              # no training: the ExPE run, evaluated with an inference-time change
    eval = { scale = 0.5 }

Context-extension rows (segmented sequences, ``configs/compare/extension.toml``) continue a trained
row at L_e = factor x L_t with `extrapos extend`; one row per method, one run per factor::

    eval_each_length = true     # each length alone: windows of k x L_t, "max" options -> k x L_t
    extend_tokens = 196_608     # extension budget (default: compute-equivalent), equal across methods

    [[rows]]
    name = "RoPE chunk-0.25"
    extend = { from = "RoPE OOTB", method = "chunk", alpha = 0.25, factor = [2, 4] }

The factor-k run is scored on windows of k x L_t only, so the row reads like the paper's Table 3:
one column per L_e. Extension runs get the row's ``set`` and the command line's overrides (but not
the sweep's ``set`` nor a command-line budget: those are the base models').

Each trained row is a run directory under ``OUT/runs/``; a finished run is reused and a partial one
resumed, so an interrupted sweep picks up where it stopped. Results are the runs' own
``eval/*.json`` files; the report is rebuilt from them (`extrapos report OUT` does the same, with
the title, baseline and tables the sweep chose, saved in ``OUT/report.json``).

Error bars (``extrapos.report.stats``)::

    baseline = "RoPE"           # the differences' reference row (default: the first row)
    seeds = [0, 1, 2]           # train every trained row once per seed (train.seed = seed)

With ``seeds`` every trained row (and every extension run) has one run per seed,
``OUT/runs/<row>-seed<s>``; within a seed every row sees the same data order, across seeds the
initialisation and the data order change, and the evaluation targets never do (they are the
held-out split's documents, which no seed touches). A row's result is then the mean over its
seeds (``OUT/merged/<row>.json``, the per-seed results inside it under ``seeds``), and its
intervals combine documents and seeds.

Task columns (``extrapos.compare.tasks``): ``tasks = ["synthetic" | "passkey" | "ruler" | "lm-eval", ...]``
with option tables ``synthetic = {...}``, ``passkey = {...}``, ``ruler = {...}``,
``lm_eval = { tasks = [...] }`` score every row beside the loss columns; ``loss = false`` drops the
loss columns (a synthetic corpus's test split holds single L_t examples, which a k x L_t window would
only concatenate)::

    tasks = ["synthetic"]
    loss = false

Encoder rows: a row whose run was trained with ``train.objective = "mlm"`` (the ``encoder`` flavour,
``configs/compare/mlm.toml``) is scored with ``evaluate_mlm`` (masked-LM loss on the same masked tokens
at every length) instead of the next-token protocol, with the same ``eval`` options, seeds and report
(intervals over documents included).

Evaluation protocol (``extrapos.evaluate``, docs/evaluation.md): every row of a sweep is scored the same
way, by default on spans inside held-out documents long enough for the longest window; a corpus of short
documents (web text) joins them into a stream instead::

    protocol = "stream"         # documents joined with end-of-text, fixed target blocks (default "documents")
    boundary = "mask"           # each target sees only its own document (default "cross": context crosses)

A time budget (``extrapos.compare.budget``): ``budget_seconds = 300`` (or ``--budget-seconds 300``) is the
training time of all the trained runs together, on the machine the sweep runs on; a few measured steps of
each row turn it into one token budget, the same for every run (it replaces the preset's and the rows'
train budget; a command-line ``--set train.tokens=...`` still wins). It is recorded in ``OUT/budget.json``,
reused when the sweep resumes, and stated in the report's facts. ``eval_precision = "bf16" | "auto"``
scores the loss columns under bf16 autocast (auto: where the device is a CUDA GPU with bf16); every result
records its precision::

    budget_seconds = 120        # seconds of training for all rows together, equal tokens per row
    eval_precision = "auto"     # bf16 on a GPU, fp32 on a CPU (default "fp32")

Imported and other existing runs: a row ``run = "runs/hf-gpt2"`` names a run directory (an
``extrapos import`` output or any trained run) instead of training one. A relative path is taken from
the current directory, like every path on the command line; the run is never written to except for its
own ``eval/`` results. Such a row is evaluated, reused and extended like a trained row; it cannot be
combined with ``seeds`` (there is one run, not one per seed).

Modules: ``sweep`` (the sweep file, checked), ``run`` (training, evaluation and task columns of every
row), ``tasks`` (the task columns: their options and the scoring of each row), ``seeds`` (results over
seeds), ``facts`` (the report's statements), ``budget`` (the time budget's measured token budget),
``published`` (where a preset's published table lives, and the last words of `extrapos compare`: the user's
table beside it, judged by run-to-run noise; ``--against FILE`` names another).
"""

from extrapos.compare.run import OUT_MARKER, check_out_dir, compare
from extrapos.compare.sweep import ExtensionSpec, Sweep, SweepRow, load_sweep, row_config, slug, task_specs
from extrapos.presets import sweep_names

__all__ = [
    "OUT_MARKER",
    "ExtensionSpec",
    "Sweep",
    "SweepRow",
    "check_out_dir",
    "compare",
    "load_sweep",
    "row_config",
    "slug",
    "sweep_names",
    "task_specs",
]
