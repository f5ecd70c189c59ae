"""The claims ledger (docs/results/claims.md) is generated and cannot go stale, and its data file cannot say
what the results do not: a missing row, a verdict its readings contradict, a number no reading prints."""

import shutil
import textwrap
from pathlib import Path

import pytest

from extrapos.report import claims
from extrapos.report.claims import AGAINST, AGREES, UNDECIDED, ClaimsError, judge, main, render

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

#: a one-paper, one-claim data file on the medium-seeds results; the test substitutes the claim's fields
DATA = """
title = "# Ledger"
intro = "Claims."
how = "How."

[papers.expe]
short = "ExPE paper"
title = "ExPE"
note = "Note."

[tables.expe-t3]
paper = "expe"
where = "Table 3"
setting = "342M, L_t = 512"
unit = "loss"
columns = [1, 16]
[tables.expe-t3.rows]
"ExPE M" = [2.63, 7.56]

[sources.medium-seeds]
page = "medium.md"
command = "extrapos compare medium-seeds"

[[claims]]
id = "fails"
table = "expe-t3"
claim = "ExPE fails at 16x"
rows = ["ExPE M"]
verdict = "{verdict}"
reason = "{reason}"
[[claims.readings]]
from = "medium-seeds"
row = "{row}"
ev = 16
minus_ev = 1
expect = "{expect}"
paper = "ExPE M@16 - ExPE M@1"
"""


def ledger(
    tmp_path: Path, verdict="reproduces the shape", reason="It rises by 1.661.", row="ExPE", expect="> 0"
):
    """A results folder holding the medium-seeds results and a data file with one claim on them."""
    (tmp_path / "medium-seeds").mkdir(exist_ok=True)
    for name in ("results.json", "report.md"):
        shutil.copy(RESULTS / "medium-seeds" / name, tmp_path / "medium-seeds" / name)
    text = DATA.format(verdict=verdict, reason=reason, row=row, expect=expect)
    (tmp_path / "claims.toml").write_text(textwrap.dedent(text))
    return tmp_path


def test_the_committed_ledger_is_current():
    """claims.md is what claims.toml and the committed results render today (regenerate it with
    `python -m extrapos.report.claims` after changing either)."""
    assert (RESULTS / "claims.md").read_text() == render(RESULTS), (
        "docs/results/claims.md is stale: run python -m extrapos.report.claims from the repository root"
    )


def test_every_claim_has_a_verdict_and_every_paper_table_a_claim():
    data, ledger_claims = claims.load(RESULTS)
    assert {c.table.key for c in ledger_claims} == set(data["tables"])
    assert {c.table.paper for c in ledger_claims} == {"expe", "cable", "segmented"}
    assert all(c.verdict in claims.VERDICTS for c in ledger_claims)


def test_the_medium_table_reproduces_the_expe_medium_shape():
    """Issue 47: the medium results reproduce the ExPE paper's Medium table (flat to 4x, failing at 8-16x,
    partly rescued by x0.5), and the ledger says so."""
    by_id = {c.id: c for c in claims.load(RESULTS)[1]}
    assert by_id["expe-t3-fails-past-4x"].verdict == "reproduces the shape"
    assert by_id["expe-t3-scaling-rescues"].verdict == "reproduces the shape"


def test_a_small_ledger_renders(tmp_path):
    page = render(ledger(tmp_path))
    assert "**1 claims.** reproduces the shape: 1" in page
    assert "| ExPE: 16x - 1x | [medium-seeds](medium.md) | +1.661 [+0.750, +2.651] |" in page
    # the per-seed values and the t-interval over the three seeds beside the crossed bootstrap
    assert "+2.404, +1.714, +0.864; t [-0.256, +3.578]" in page
    assert "| +4.930 | as the paper (> 0) |" in page


def test_a_reading_of_a_missing_row_fails_clearly(tmp_path):
    with pytest.raises(
        ClaimsError, match=r"claim 'fails', reading 1: .*has no row 'ExPE x2' \(its rows: RoPE, ExPE"
    ):
        render(ledger(tmp_path, row="ExPE x2"))


def test_a_missing_results_file_fails_clearly(tmp_path):
    folder = ledger(tmp_path)
    (folder / "medium-seeds" / "results.json").unlink()
    with pytest.raises(ClaimsError, match=r"source 'medium-seeds': .*results.json does not exist"):
        render(folder)


def test_a_verdict_the_readings_contradict_is_refused(tmp_path):
    with pytest.raises(ClaimsError, match="'reproduces the shape' but these readings do not agree"):
        render(ledger(tmp_path, expect="< 0"))
    with pytest.raises(ClaimsError, match="'does not' but every reading with an expect agrees"):
        render(ledger(tmp_path, verdict="does not"))
    with pytest.raises(ClaimsError, match="'not measured' takes no readings"):
        render(ledger(tmp_path, verdict="not measured"))
    assert "inconclusive at this scale: 1" in render(ledger(tmp_path, verdict="inconclusive at this scale"))


def test_a_number_no_reading_prints_is_refused(tmp_path):
    """Prose that quotes a reading must quote what the page prints (either sign, rounded as written)."""
    assert render(ledger(tmp_path, reason="It rises by +1.66 (paper 4.93); sizes such as 17.6M pass."))
    with pytest.raises(ClaimsError, match="says 1.662, which none of its readings"):
        render(ledger(tmp_path, reason="It rises by 1.662."))


def test_judge_reads_the_interval_against_the_papers_line():
    assert judge("> 0", 0.1, 0.3) == AGREES and judge("> 0", -0.3, -0.1) == AGAINST
    assert judge("> 0", -0.1, 0.3) == UNDECIDED and judge("< 1", 0.7, 0.9) == AGREES
    assert judge("~ 1", 0.9, 1.1) == AGREES and judge("~ 0", 0.1, 0.2) == AGAINST
    assert judge("|.| < 0.03", -0.01, 0.02) == AGREES and judge("|.| < 0.03", 0.04, 0.06) == AGAINST
    assert judge("|.| < 0.03", 0.01, 0.05) == UNDECIDED
    with pytest.raises(ClaimsError, match="is not"):
        judge(">= 0", 0.0, 1.0)


def test_the_command_writes_and_checks_the_page(tmp_path, capsys):
    folder = ledger(tmp_path)
    assert main(["--results", str(folder), "--check"]) == 1
    assert main(["--results", str(folder)]) == 0
    assert main(["--results", str(folder), "--check"]) == 0
    assert (folder / "claims.md").read_text() == render(folder)
    (folder / "claims.toml").write_text("not toml [")
    assert main(["--results", str(folder)]) == 2
    assert "error:" in capsys.readouterr().err


def _cross_sweep_ledger(tmp_path: Path, seeds=None) -> Path:
    """The one-claim ledger with two more readings: ExPE of medium-seeds minus RoPE of a second sweep (a copy
    of medium-seeds' results, so the pairing is checkable: it must equal the within-sweep difference)."""
    folder = ledger(tmp_path)
    shutil.copytree(folder / "medium-seeds", folder / "other-seeds")
    if seeds is not None:
        import json

        rows = json.loads((folder / "other-seeds" / "results.json").read_text())
        for row in rows:
            row["seed_values"] = seeds
        (folder / "other-seeds" / "results.json").write_text(json.dumps(rows))
    text = (folder / "claims.toml").read_text()
    text = text.replace(
        '[sources.medium-seeds]\npage = "medium.md"\ncommand = "extrapos compare medium-seeds"\n',
        '[sources.medium-seeds]\npage = "medium.md"\ncommand = "extrapos compare medium-seeds"\n\n'
        '[sources.other-seeds]\npage = "medium.md"\ncommand = "extrapos compare other-seeds"\n',
    )
    text += textwrap.dedent(
        """
        [[claims.readings]]
        from = "medium-seeds"
        row = "ExPE"
        ev = 16
        minus = "RoPE"
        minus_from = "other-seeds"
        [[claims.readings]]
        from = "medium-seeds"
        row = "ExPE"
        ev = 16
        minus = "RoPE"
        """
    )
    (folder / "claims.toml").write_text(text)
    return folder


def test_a_row_of_another_sweep_pairs_by_seed_and_document(tmp_path):
    """``minus_from``: a row minus another sweep's row of the same targets and seeds is the same paired
    difference as within one sweep (here the other sweep is a copy, so both readings must agree exactly)."""
    page = render(_cross_sweep_ledger(tmp_path))
    lines = page.splitlines()
    cross = next(line for line in lines if line.startswith("| ExPE - RoPE (other-seeds) at 16x |"))
    within = next(line for line in lines if line.startswith("| ExPE - RoPE at 16x |"))
    assert cross.split("|")[3:] == within.split("|")[3:]  # the same estimate, interval, seeds and t
    assert "+2.461, +1.840, +0.692; t [-0.565, +3.894]" in cross


def test_rows_of_other_seeds_are_not_paired(tmp_path):
    with pytest.raises(ClaimsError, match=r"has seeds \[0, 1, 2\] and 'RoPE' \(other-seeds\) \[3, 4, 5\]"):
        render(_cross_sweep_ledger(tmp_path, seeds=[3, 4, 5]))


def _attention_ledger(tmp_path: Path, readings: str) -> Path:
    """A ledger whose attention source is a copy of the committed three-seed Figure 3 readings."""
    folder = tmp_path / "results"
    shutil.copytree(
        RESULTS / "segmented-figure3-seeds", folder / "fig3", ignore=shutil.ignore_patterns("*.png")
    )
    text = textwrap.dedent(
        """
        title = "# Ledger"
        intro = "Claims."
        how = "How."

        [papers.seg]
        short = "segmented paper"
        title = "Segmented"
        note = "Note."

        [tables.seg-f3]
        paper = "seg"
        where = "Figure 3"
        setting = "no numbers printed"
        unit = "none"
        columns = []

        [sources.fig3]
        kind = "attention"
        path = "fig3"
        page = "segmented-figure3.md"
        command = "extrapos attention"

        [[claims]]
        id = "f3"
        table = "seg-f3"
        claim = "It rises"
        verdict = "inconclusive at this scale"
        reason = "Readings."
        readings = [
        """
    )
    (folder / "claims.toml").write_text(text + readings + "\n]\n")
    return folder


SEEDS = '["{0}-seed0", "{0}-seed1", "{0}-seed2"]'


def test_an_attention_reading_over_seeds_pairs_seed_by_seed(tmp_path):
    """``row`` and ``minus`` as lists of readings, one per seed: the per-seed values and Student's t over them
    are the three-seed Figure 3 page's (its seeds table prints +0.002 [-0.001, +0.005] for chunk at 4x), and
    one seed alone given as a list reads exactly what the plain reading of that file does."""
    readings = ",\n".join(
        [
            f'{{ from = "fig3", label = "chunk - parent, seeds", row = {SEEDS.format("chunk")}, '
            f"minus = {SEEDS.format('rope')}, ev = 4 }}",
            '{ from = "fig3", label = "one seed, a list", row = ["chunk-seed1"], minus = ["rope-seed1"], '
            "ev = 4 }",
            '{ from = "fig3", label = "one seed, plain", row = "chunk-seed1", minus = "rope-seed1", ev = 4 }',
        ]
    )
    page = render(_attention_ledger(tmp_path, readings))
    line = next(x for x in page.splitlines() if x.startswith("| chunk - parent, seeds |"))
    assert "+0.002, +0.001, +0.003; t [-0.001, +0.005]" in line
    listed = next(x for x in page.splitlines() if x.startswith("| one seed, a list |"))
    plain = next(x for x in page.splitlines() if x.startswith("| one seed, plain |"))
    assert listed.split("|")[2:] == plain.split("|")[2:]


@pytest.mark.parametrize(
    "reading, message",
    [
        (
            f'{{ from = "fig3", row = {SEEDS.format("chunk")}, minus = {SEEDS.format("rope")}, ev = 4 }}',
            "needs a label",
        ),
        (
            f'{{ from = "fig3", label = "x", row = {SEEDS.format("chunk")}, minus = ["rope-seed0"], '
            "ev = 4 }",
            "row has 3 seeds and minus 1",
        ),
    ],
)
def test_an_attention_reading_over_seeds_is_refused_when_it_cannot_pair(tmp_path, reading, message):
    with pytest.raises(ClaimsError, match=message):
        render(_attention_ledger(tmp_path, reading))
