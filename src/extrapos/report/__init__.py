"""The report layer: results turned into tables, intervals and plots, above the run layer.

``stats`` (bootstrap intervals over documents, paired differences, seeds; numpy only), ``render``
(the loss tables and plots of `extrapos report` and `extrapos compare`), ``task_tables`` (the task
columns of a comparison report), ``against_published`` (a table beside a published one, each cell judged
by the run-to-run noise seeds measured), ``attention_figure`` (the segmented-sequences paper's Figure 3) and
``claims`` (the claims ledger, docs/results/claims.md: each claim of the papers beside our measurement). They
read saved results, never a model, and import only the run layer and below; the evaluation commands import
``stats`` for their intervals. The package re-exports nothing: an import names its module
(``from extrapos.report.stats import loss_interval``).
"""
