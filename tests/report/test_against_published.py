"""A table beside the published one: the stored quick table against itself, against what an AVX2 machine
printed (issue 50), and against copies moved within and beyond the seeds' spread."""

import copy
import json
import statistics
from pathlib import Path

import pytest

from extrapos.report.against_published import (
    MATCHES,
    NOISE_SDS,
    Band,
    against_published,
    compare_tables,
    noise_bands,
    render,
)
from extrapos.report.stats import length_interval

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
#: what `make demo` printed on a 2-core AMD EPYC with AVX2 only (issue 50); CABLE was 0.001 lower
AVX2_SINUSOIDAL = {1: 5.724, 2: 5.851, 4: 6.100, 8: 6.378, 16: 6.496}


@pytest.fixture(scope="module")
def quick():
    return json.loads((RESULTS / "quick" / "results.json").read_text())


@pytest.fixture(scope="module")
def seeds():
    return json.loads((RESULTS / "quick-seeds" / "results.json").read_text())


def _moved(results, row, by):
    """A copy of ``results`` with ``row``'s loss at each length moved by ``by(ev, loss)``."""
    out = copy.deepcopy(results)
    for r in out:
        if r["name"] == row:
            for cell in r["results"]:
                cell["loss"] += by(cell["ev"], cell["loss"])
    return out


def _sigma(seeds, row, ev):
    part = next(r for r in seeds if r["name"] == row)
    return statistics.stdev(next(c["loss"] for c in s["results"] if c["ev"] == ev) for s in part["seeds"])


def test_the_published_table_matches_itself(quick, seeds):
    comparison = against_published(quick, quick, seeds)
    assert len(comparison.cells) == 7 * 5 and not comparison.notes
    assert comparison.verdict() == MATCHES
    assert all(c.band is not None and c.band.source == "seeds" for c in comparison.cells)


def test_the_avx2_table_of_issue_50_matches_within_noise(quick, seeds):
    mine = _moved(quick, "Sinusoidal", lambda ev, loss: AVX2_SINUSOIDAL[ev] - loss)
    mine = _moved(mine, "CABLE", lambda ev, loss: -0.001)
    comparison = against_published(mine, quick, seeds)
    assert comparison.verdict() == MATCHES
    # at 16x the AVX2 row is outside the published interval over documents, inside the seeds' spread
    sinusoidal = next(r for r in quick if r["name"] == "Sinusoidal")
    interval, _ = length_interval(sinusoidal, 16)
    assert interval is not None and not interval.contains(AVX2_SINUSOIDAL[16])
    cell = next(c for c in comparison.cells if (c.row, c.ev) == ("Sinusoidal", 16))
    assert cell.within and cell.difference == pytest.approx(0.1296, abs=1e-3)
    text = render(comparison, "docs/results/quick/results.json", "docs/results/quick-seeds/results.json")
    assert "| Sinusoidal | 5.724 (+0.002 within ±0.058) |" in text
    assert text.endswith(f"Verdict: {MATCHES}.")


def test_a_row_moved_beyond_the_spread_is_named_in_the_verdict(quick, seeds):
    # RoPE moved by 6 of its seeds' standard deviations at 8x and 16x, within 1 elsewhere
    def by(ev, loss):
        return 6 * _sigma(seeds, "RoPE", ev) if ev >= 8 else _sigma(seeds, "RoPE", ev)

    comparison = against_published(_moved(quick, "RoPE", by), quick, seeds)
    verdict = comparison.verdict()
    assert verdict.startswith("row RoPE differs beyond noise at 8x (") and " and 16x (" in verdict
    assert "1x" not in verdict and "Sinusoidal" not in verdict and MATCHES not in verdict
    assert {(c.row, c.ev) for c in comparison.beyond} == {("RoPE", 8), ("RoPE", 16)}
    assert "**5.520 (+0.118 beyond ±0.078)**" in render(comparison, "published")


def test_a_copy_within_the_spread_matches(quick, seeds):
    # every row moved by 3 of its cell's seed standard deviations (the band is 4), some up, some down
    mine = quick
    for i, r in enumerate(quick):
        sign = 1 if i % 2 else -1
        mine = _moved(mine, r["name"], lambda ev, loss, n=r["name"], s=sign: s * 3 * _sigma(seeds, n, ev))
    comparison = against_published(mine, quick, seeds)
    assert comparison.verdict() == MATCHES
    assert max(abs(c.difference) for c in comparison.cells) > 0.5  # Sinusoidal's 16x moved by 3 x 0.175


def test_a_cell_whose_seeds_agreed_gets_the_tables_typical_noise(quick, seeds):
    """ExPE's three seeds agree to 0.004 at 16x (0.014-0.019 at its other lengths): the band is the
    median sigma of the seeds table, not four times 0.004."""
    bands = noise_bands(quick, quick, seeds)
    sigmas = [_sigma(seeds, r["name"], c["ev"]) for r in seeds for c in r["results"]]
    half = bands[("ExPE", 16)].high - next(r for r in quick if r["name"] == "ExPE")["results"][4]["loss"]
    assert _sigma(seeds, "ExPE", 16) < 0.005
    assert half == pytest.approx(NOISE_SDS * statistics.median(sigmas))


def test_seeds_on_both_sides_narrow_the_band(seeds):
    """A mean over 3 seeds against a mean over 3: their difference spreads by sqrt(1/3 + 1/3), two single
    runs' by sqrt(2), so the band is sqrt(1/3) of the single runs' one."""
    band = noise_bands(seeds, seeds)[("RoPE", 1)]
    sigma = _sigma(seeds, "RoPE", 1)  # above the table's median sigma
    assert (band.high - band.low) / 2 == pytest.approx(NOISE_SDS * sigma * (1 / 3) ** 0.5)


def test_without_seeds_the_published_interval_is_the_band(quick):
    """The interval over documents holds no training noise: the AVX2 row falls outside it at 8x and 16x."""
    comparison = against_published(
        _moved(quick, "Sinusoidal", lambda ev, loss: AVX2_SINUSOIDAL[ev] - loss), quick
    )
    assert all(c.band is not None and c.band.source == "interval" for c in comparison.cells)
    assert comparison.verdict() == (
        "row Sinusoidal differs beyond noise at 8x (6.378 against 6.295: +0.083 outside [6.237, 6.360]) "
        "and 16x (6.496 against 6.366: +0.130 outside [6.314, 6.424])"
    )


def test_rows_that_scored_other_targets_or_steps_are_left_out_with_a_sentence(quick, seeds):
    mine = copy.deepcopy(quick)
    mine[0]["results"][2]["targets"] = "0000000000000000"  # NoPE: another corpus or tokenizer
    mine[2]["checkpoint_step"] = 100  # RoPE: another training budget
    mine = _moved(mine, "NoPE", lambda ev, loss: 1.0)  # no noise explains it, and it is not judged
    comparison = against_published(mine, quick, seeds)
    assert {c.row for c in comparison.cells} == {"Sinusoidal", "ALiBi", "CABLE", "ExPE", "ExQPE"}
    assert comparison.notes == [
        "row NoPE is not compared: it scored other target tokens at 4x than the published row (another "
        "corpus, tokenizer or evaluation budget).",
        "row RoPE is not compared: it was scored at step 100, the published row at step 391 (another "
        "training budget).",
    ]
    assert comparison.verdict() == MATCHES + " in the cells that could be judged (the others are named above)"


def test_compare_tables_judges_numbers_by_their_bands():
    published = {"A": {1: 5.0, 2: 5.1}, "B": {1: 6.0}, "C": {1: 7.0}}
    mine = {"A": {1: 5.05, 2: 5.3}, "B": {1: 6.0}, "D": {1: 1.0}}
    bands = {("A", 1): Band(4.9, 5.1, "seeds"), ("A", 2): Band(5.0, 5.2, "seeds")}
    comparison = compare_tables(mine, published, bands)
    assert [(c.row, c.ev, c.within) for c in comparison.cells] == [
        ("A", 1, True),
        ("A", 2, False),
        ("B", 1, None),
    ]
    assert comparison.notes == [
        "row D is not in the published table.",
        "published rows not in this table: C.",
    ]
    assert (
        comparison.verdict() == "row A differs beyond noise at 2x (5.300 against 5.100: +0.200 beyond ±0.100)"
    )
    nothing = compare_tables({"A": {1: 5.0}}, {"A": {1: 5.0}}, {})
    assert nothing.verdict().startswith("no cell of this table could be judged")
