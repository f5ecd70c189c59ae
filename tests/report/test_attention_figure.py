"""The Figure 3 table (``report/attention_figure.py``) over training seeds: runs that share a label are one
row's seeds, paired per seed with the first row's run of the same seed, with Student's t over the seeds;
and with one run per label the committed one-seed page, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from extrapos.errors import UserError
from extrapos.report import attention_figure

FIGURE3 = Path(__file__).resolve().parents[2] / "docs" / "results" / "segmented-figure3"
DOCUMENTS = 6
QUERIES = np.array([20.0, 31.0, 44.0, 25.0, 57.0, 38.0])


def result(heads: tuple[float, float], docs: range = range(DOCUMENTS)) -> dict:
    """An attention result at ev = 2 whose two heads have these mean median weights past L_t on every
    document (so the row's mean over documents, layers and heads is their average)."""
    sums = [[q * heads[0], q * heads[1]] for q in QUERIES]
    row = {
        "ev": 2,
        "doc_index": list(docs),
        "layers": [{"layer": 0, "beyond": {"median_weight": list(heads)}}],
        "per_document": [
            {"layer": 0, "every": None, "beyond": {"queries": QUERIES.tolist(), "median_weight": sums}}
        ],
        "median_weight_histogram": {"edges": [0.0, 1.0, 2.0], "counts": [[[3.0, 1.0], [2.0, 0.0]]]},
    }
    return {
        "train_length": 8,
        "results": [row],
        "run": "runs/x",
        "encoding": "rope",
        "checkpoint_step": 1,
        "documents_used": DOCUMENTS,
    }


# Two seeds. Row means: parent 0.50 and 0.40; chunk 0.60 and 0.55 (+0.10, +0.15 paired per seed);
# shift 0.60 and 0.51 (+0.10, +0.11). Per head, chunk - parent: (+0.10, +0.30) and (+0.10, 0.00);
# shift - parent: (+0.05, -0.03) and (+0.15, +0.25).
SEED1 = {"parent": (0.40, 0.60), "chunk": (0.50, 0.70), "shift": (0.45, 0.75)}
SEED2 = {"parent": (0.30, 0.50), "chunk": (0.60, 0.50), "shift": (0.27, 0.75)}


def seeded_runs() -> list[tuple[str, dict]]:
    """The order `benchmarks/figure3_seeds.sh` passes them in: every row of seed 1, then of seed 2."""
    return [(label, result(heads)) for seed in (SEED1, SEED2) for label, heads in seed.items()]


def test_labels_repeated_unevenly_are_refused_in_one_sentence_naming_the_fix():
    assert attention_figure.seed_groups(["a", "b", "a", "b"]) == (["a", "b"], 2)
    assert attention_figure.seed_groups(["a", "b", "c"]) == (["a", "b", "c"], 1)
    with pytest.raises(UserError, match=r"'a' 2 times, 'b' 1 times.*once per seed"):
        attention_figure.seed_groups(["a", "b", "a"])


def test_the_command_refuses_uneven_labels_before_reading_any_run(tmp_path, capsys):
    from extrapos.cli import main

    missing = [str(tmp_path / name) for name in ("p0", "c0", "p1")]  # never opened
    args = ["attention", *missing, "--labels", "p,c,p", "--figure", str(tmp_path / "fig")]
    assert main(args) == 2
    assert "give every label once per seed" in capsys.readouterr().err
    assert not (tmp_path / "fig").exists()


def test_seed_rows_pair_each_seed_with_the_first_rows_same_seed_and_take_t_over_seeds():
    """Hand-computed: chunk's per-seed differences +0.10 and +0.15 give +0.125 +- 12.706 x 0.0354 / sqrt(2)
    = [-0.193, +0.443] (within noise); shift's +0.10 and +0.11 give [+0.041, +0.169]. Pairing chunk's seed 2
    with the parent's seed 1 would give +0.05 and +0.20, so [-0.828, +1.078]."""
    runs = seeded_runs()
    groups = attention_figure.grouped(runs)
    assert [(label, len(rs)) for label, rs in groups] == [("parent", 2), ("chunk", 2), ("shift", 2)]
    lines = {
        line.split(" | ")[0][2:]: line for line in attention_figure.seeds_table(groups, [2]).splitlines()
    }
    assert lines["parent"] == "| parent | 0.450 [-0.185, 1.085] | baseline |"
    assert lines["chunk"] == "| chunk | 0.575 [0.257, 0.893] | +0.125 [-0.193, +0.443] within noise |"
    assert lines["shift"] == "| shift | 0.555 [-0.017, 1.127] | +0.105 [+0.041, +0.169] |"

    # each seed alone, its document interval (every document has the same mean here: a point) and its
    # difference to the parent of the same seed
    seeds = {
        line.split(" | ")[0][2:]: line for line in attention_figure.per_seed_table(groups, [2]).splitlines()
    }
    assert seeds["parent (seed #2)"] == "| parent (seed #2) | 0.400 [0.400, 0.400] | baseline |"
    assert seeds["chunk (seed #1)"].endswith("| +0.100 [+0.100, +0.100] |")
    assert seeds["chunk (seed #2)"].endswith("| +0.150 [+0.150, +0.150] |")
    assert seeds["shift (seed #2)"] == "| shift (seed #2) | 0.510 [0.510, 0.510] | +0.110 [+0.110, +0.110] |"

    # per layer and head: the mean over seeds of the paired difference, and the seeds of its sign
    heads = attention_figure.head_table(groups, 2).splitlines()
    assert (
        heads[0]
        == "| layer | head | chunk - parent | seeds of its sign | shift - parent | seeds of its sign |"
    )
    assert heads[2:] == ["| 0 | 0 | +0.200 | 2/2 | +0.010 | 1/2 |", "| 0 | 1 | +0.050 | 1/2 | +0.200 | 2/2 |"]


def test_a_seed_read_on_other_documents_is_not_paired():
    runs = seeded_runs()
    runs[4] = ("chunk", result(SEED2["chunk"], docs=range(1, DOCUMENTS + 1)))  # seed 2's chunk
    groups = attention_figure.grouped(runs)
    table = attention_figure.seeds_table(groups, [2])
    assert "| – (other documents in seed #2) |" in table
    assert "| 0 | 0 | – | – | +0.010 | 1/2 |" in attention_figure.head_table(groups, 2)


def test_write_figure_with_seeds_says_what_the_interval_covers_and_pools_the_plot(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(attention_figure, "plot", lambda groups, evs, path: drawn.append(groups) or path)
    md, _ = attention_figure.write_figure(seeded_runs(), tmp_path)
    text = md.read_text()
    assert text.startswith(
        "# Median attention weight past L_t = 8 (the segmented-sequences paper's Figure 3), 2 seeds"
    )
    assert "Student's t 95% over the 2 seeds: it covers training noise" in text
    assert "a sentence about the result quotes it" in text
    assert (
        "- chunk, seed #2: `runs/x`" in text
        and "| chunk (seed #2) |" in text
        and "| 0 | 1 | +0.050 |" in text
    )
    assert [[label for label, _ in groups] for groups in drawn] == [["parent", "chunk", "shift"]]
    assert [len(rs) for _, rs in drawn[0]] == [2, 2, 2]  # one density per row, its seeds pooled
    edges, counts = attention_figure._pooled(drawn[0][0][1], 2)
    assert edges.tolist() == [0.0, 1.0, 2.0] and counts.tolist() == [10.0, 2.0]  # 2 seeds x (5, 1)


def test_one_run_per_label_renders_the_committed_figure3_page_byte_for_byte(tmp_path, monkeypatch):
    """docs/results/segmented-figure3/median-weight.md is what its three committed attention results render
    today; the results' run paths were made relative to their folder when committed, so they are put back
    as the page names them."""
    monkeypatch.setattr(attention_figure, "plot", lambda groups, evs, path: path)
    labels = {"parent": "parent (RoPE)", "chunk": "chunk-0.25 x4", "continue": "continue"}
    results = [
        (label, {**json.loads((FIGURE3 / f"{name}.json").read_text()), "run": f"runs/fig3/{name}"})
        for name, label in labels.items()
    ]
    md, _ = attention_figure.write_figure(results, tmp_path)
    assert md.read_bytes() == (FIGURE3 / "median-weight.md").read_bytes()


def test_the_committed_three_seed_figure3_page_is_what_its_nine_readings_render(tmp_path, monkeypatch):
    """docs/results/segmented-figure3-seeds/median-weight.md (the medium RoPE parent, its chunk and continue
    children, three seeds each) is what the nine committed attention results render today, labels repeated
    per seed in the order benchmarks/figure3_seeds.sh gives them; their run paths were made relative to their
    folder when committed, so they are put back as the page names them."""
    monkeypatch.setattr(attention_figure, "plot", lambda groups, evs, path: path)
    folder = FIGURE3.parent / "segmented-figure3-seeds"
    labels = {"rope": "RoPE parent", "chunk": "chunk-0.25 x4", "continue": "continue"}
    results = [
        (
            label,
            {
                **json.loads((folder / f"{name}-seed{s}.json").read_text()),
                "run": f"runs/figure3-seeds/{name}-seed{s}",
            },
        )
        for name, label in labels.items()
        for s in range(3)
    ]
    md, _ = attention_figure.write_figure(results, tmp_path)
    assert md.read_bytes() == (folder / "median-weight.md").read_bytes()
