"""docs/results/ruler/lm-eval.md's table is what benchmarks/compare_ruler_lm_eval.py printed from the
committed comparison (docs/results/ruler/lm-eval/comparison.json), and that comparison's cells are the
committed results' own numbers: a re-run that changes them cannot leave the page behind."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results" / "ruler" / "lm-eval.md"
FOLDER = ROOT / "docs" / "results" / "ruler" / "lm-eval"


@pytest.fixture(scope="module")
def compare():
    pytest.importorskip("lm_eval")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compare_ruler_lm_eval
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return compare_ruler_lm_eval


def test_the_page_holds_the_comparison_table(compare):
    cells = json.loads((FOLDER / "comparison.json").read_text())["cells"]
    assert compare.markdown(cells) in PAGE.read_text()


def test_the_comparison_holds_the_results_scores():
    cells = json.loads((FOLDER / "comparison.json").read_text())["cells"]
    scores = {}
    for length in (512, 1024):
        lm = json.loads((FOLDER / f"lm-eval-ruler-{length}.json").read_text())
        for name, result in lm["results"].items():
            task = name.removeprefix("ruler_")
            scores[("lm-eval", task, length)] = (result[f"{length},none"], len(lm["samples"][name]))
        xp = json.loads((FOLDER / f"ruler-offline-{length}.json").read_text())
        for cell in xp["results"]:
            scores[("extrapos", cell["task"], cell["length"])] = (cell["recall"], cell["n"])
    assert len(cells) == len(scores) == 20
    for c in cells:
        assert (c["score"], c["n"]) == pytest.approx(scores[(c["side"], c["task"], c["length"])])
        assert c["other_metric_equal"]
