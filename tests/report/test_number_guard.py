"""Every measured number on the README, the results pages (docs/results/*.md), each results folder's
README.md (docs/results/*/README.md) and the hand-written GPU session pages (docs/results/gpu/h200-*.md) is
generated or tied to the committed file it came from (``extrapos.report.number_guard``; the rule in
docs/results/README.md, "How a number is tied")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from extrapos.report.number_guard import check_page, check_text, counted_numbers, pages

ROOT = Path(__file__).resolve().parents[2]
UNTIED = "tied to nothing"

#: pages whose numbers are not all tied yet, with how many are tied to nothing: the count may only fall, and a
#: page leaves this list when it reaches 0 (issue 47 item 5: every docs/results/*.md page has left it; a new
#: page starts tied). The folders' READMEs joined the guard later and are tied through too
PENDING: dict[str, int] = {}
#: numbers marked ``untied`` (measured, but no committed file holds them), per page: may only fall
UNTIED_MARKED = {
    "README.md": 12,
    "docs/results/README.md": 2,
    "docs/results/attention/README.md": 27,  # extrapos eval's losses and wall times, the console's intervals
    "docs/results/cost.md": 8,
    "docs/results/cpu-profile.md": 16,
    "docs/results/expe-table2.md": 1,
    "docs/results/gpu/h200-first.md": 4,  # the device tool's call times, the table's rounded gaps
    "docs/results/gpu/h200-second.md": 11,  # the device tool's times, two non-baseline differences, a sum
    "docs/results/medium.md": 8,
    "docs/results/quick-precision.md": 3,
    "docs/results/quick.md": 6,
    "docs/results/retrieval.md": 17,
    # the bootstrap intervals and paired differences (recomputable from the JSON files' per-example scores,
    # not committed), training times and load averages of the run summaries, estimates
    "docs/results/ruler/README.md": 52,
    "docs/results/segmented-figure3.md": 2,
}


@pytest.mark.parametrize("page", pages(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_number_on_the_page_is_tied(page):
    name = str(page.relative_to(ROOT))
    checked = check_page(page, ROOT)
    loose = [e for e in checked.errors if UNTIED in e]
    wrong = [e for e in checked.errors if UNTIED not in e]
    assert not wrong, "\n".join(wrong)  # a marker that names nothing, or a number its marker does not hold
    if name in PENDING:
        assert 0 < len(loose) <= PENDING[name], (
            f"{name}: {len(loose)} numbers tied to nothing (the ceiling is {PENDING[name]}; "
            "lower it, or remove the page from PENDING at 0)\n" + "\n".join(loose[:20])
        )
    else:
        assert not loose, "\n".join(loose)
    assert len(checked.untied) <= UNTIED_MARKED.get(name, 0), "\n".join(checked.untied)


def test_the_readme_is_tied_through():
    checked = check_page(ROOT / "README.md", ROOT)
    assert checked.errors == [] and checked.tied >= 250


def test_claims_md_is_generated_whole():
    checked = check_page(ROOT / "docs" / "results" / "claims.md", ROOT)
    assert checked.errors == [] and checked.generated > 100 and checked.tied == 0


def _one_digit_changed(text: str, number: str) -> tuple[str, int]:
    """``text`` with the last digit of the first ``number`` in it changed, and that number's line."""
    at = text.index(number)
    digit = number[-1]
    changed = number[:-1] + ("1" if digit != "1" else "2")
    return text[:at] + changed + text[at + len(number) :], text[:at].count("\n") + 1


@pytest.mark.parametrize("number", ["+0.803", "0.036", "5.722", "3.633", "0.53 / 0.50", "17.6"])
def test_a_changed_digit_of_a_tied_number_fails_naming_its_line(number):
    """A copy of the README with one digit of a tied number changed (a prose number, a number in a table
    copied from a report, a number in a table cell) fails, naming the README's line."""
    text = (ROOT / "README.md").read_text()
    assert check_text(text, "README.md", ROOT).errors == []
    changed, line = _one_digit_changed(text, number)
    errors = check_text(changed, "README.md", ROOT).errors
    assert errors and any(e.startswith(f"README.md:{line}:") for e in errors), errors


def test_a_new_number_without_a_marker_fails():
    text = (ROOT / "README.md").read_text()
    added = text.replace("## Start\n", "## Start\n\nA new finding: RoPE is 0.123 nats behind.\n", 1)
    line = added[: added.index("0.123")].count("\n") + 1
    assert check_text(added, "README.md", ROOT).errors == [
        f"README.md:{line}: 0.123 is {UNTIED} (add a marker)"
    ]


def test_markers_tie_json_keys_report_cells_and_tables(tmp_path):
    results = tmp_path / "docs" / "results" / "x"
    results.mkdir(parents=True)
    (results / "r.json").write_text(json.dumps({"rows": [{"name": "RoPE", "loss": 5.4419, "s": 0.047}]}))
    (results / "report.md").write_text(
        "- sweep wall time 110.8 min\n\nDifference to RoPE:\n\n| model | ev=1 |\n|---|---:|\n"
        "| CABLE | -0.036 [-0.075, -0.004] |\n"
    )
    x = "docs/results/x"
    ok = (
        f"RoPE scores 5.442<!-- from {x}/r.json: rows[name=RoPE].loss --> in 47 ms<!-- from\n"
        f"{x}/r.json: rows[0].s *1000 -->, CABLE is ahead by 0.036 [0.075, 0.004]<!-- from\n"
        f"{x}/report.md: [Difference][CABLE][ev=1] --> after 111 min<!-- from {x}/report.md:\n"
        "[sweep wall time] -->. The paper's 2.63<!-- unmeasured: the paper's Table 3 --> and a 95% "
        "interval.\n\n| model | ev=1 |\n|---|---:|\n| CABLE | -0.036 [-0.075, -0.004] |\n"
        f"<!-- table from {x}/report.md -->\n"
    )
    checked = check_text(ok, "p.md", tmp_path)
    assert checked.errors == [] and checked.tied == 9 and checked.unmeasured == 1
    errors = check_text(ok.replace("5.442", "5.443"), "p.md", tmp_path).errors
    assert any(e.startswith("p.md:1: 5.443 is not a value") for e in errors)
    assert any("rows[name=RoPE].loss = 5.4419 is printed nowhere" for e in errors)  # the stale marker too
    changed = ok.replace("| -0.036 [-0.075, -0.004] |\n<", "| -0.037 [-0.075, -0.004] |\n<")
    errors = check_text(changed, "p.md", tmp_path).errors
    assert errors[0] == "p.md:9: the row on line 8 is not its row of docs/results/x/report.md"
    assert "p.md:8: -0.037 is not a value its marker names (docs/results/x/report.md)" in errors
    errors = check_text(ok.replace("rows[name=RoPE]", "rows[name=ALiBi]"), "p.md", tmp_path).errors
    assert any("no element with name = ALiBi" in e for e in errors)


def test_what_counts_as_a_measurement():
    """Decimals, percentages, times, comparative x and arrows count; settings, lengths, versions, ordinals,
    glued names and confidence levels do not (the rule in the module's docstring)."""

    def counted(line):
        return [n.text for n in counted_numbers(line, 1)]

    assert counted("loss 5.442 at 16x, +0.803 [+0.616, +1.008], 1.84M parameters") == [
        "5.442",
        "+0.803",
        "+0.616",
        "+1.008",
        "1.84",
    ]
    assert counted("took 68 min, 47 ms, 541 s; 15% and 70 % of the peak; 3.5-14x faster; 17-100x less") == [
        "68",
        "47",
        "541",
        "15",
        "70",
        "3.5",
        "14",
        "17",
        "100",
    ]
    assert counted("13 -> 247 tokens; 23-33 min") == ["13", "247", "23", "33"]
    assert counted("went from 92-101 to 75-78 us (NoPE 57 \u00b5s)") == ["92", "101", "75", "78", "57"]
    assert (
        counted("L_t = 64, 12 documents, 16x, Table 3.2, torch 2.13.0, x0.5, chunk-0.25, 95% interval") == []
    )
    assert counted("0.24-0.31 vs 2026-11-26") == ["0.24", "0.31"]
    assert counted("lr 2e-3 -> 2e-4, 1.5e+2 and 3E4; took 2 min") == ["2"]


#: the committed reports whose table cells the pages' markers name: their difference, change-with-length and
#: seed tables are recomputed here from results.json, so a marker into report.md is a marker into the JSON
MARKED_REPORTS = sorted(
    {
        path
        for page in pages(ROOT)
        for path in re.findall(r"<!--\s*from\s+(\S+/report\.md):", page.read_text())
        if (ROOT / path).with_name("results.json").is_file()
    }
)


@pytest.mark.parametrize("report", MARKED_REPORTS)
def test_a_marked_report_is_what_its_results_render(report):
    from extrapos.report import render

    text = (ROOT / report).read_text()
    results = json.loads((ROOT / report).with_name("results.json").read_text())
    rows = [render.Row(r["name"], r) for r in results]
    if len(render.protocol_groups(rows)) != 1 or len(render.kind_groups(rows)) != 1:
        pytest.skip("a report of several protocols or kinds: one set of tables each")
    baseline = re.search(r"Difference to the baseline row \((.+?)\), row minus", text)
    assert baseline is not None
    cells = render.cell_intervals(rows, baseline.group(1))
    assert render.difference_table(rows, cells) in text
    change = render.length_change_table(rows)
    assert change is None or change in text
    if any(r.get("seeds") for r in results):
        assert render.seed_table(rows) in text


def test_a_quoted_expression_ties_numbers_of_a_log_and_a_reciprocal_ties_an_inverse(tmp_path):
    """A REF in double quotes is a regular expression over a text file (a log): the numbers of its first
    group are the values; ``**-1`` ties a ratio printed as its inverse. A changed digit fails either way."""
    (tmp_path / "steps.log").write_text("fp32 step 425.3 ms\nbf16 step 237.6 ms, 1.79x\n")
    (tmp_path / "r.json").write_text(json.dumps({"eval": {"ratio": 0.2845}}))
    ok = (
        'bf16 takes 238 ms<!-- from steps.log: "bf16 step ([0-9.]+) ms" --> against 425.3 ms<!-- from\n'
        'steps.log: "fp32 step ([0-9.]+) ms" -->, 1.79x faster<!-- from steps.log: ", ([0-9.]+)x" -->; '
        "evaluation 3.5x faster<!-- from r.json: eval.ratio **-1 -->.\n"
    )
    checked = check_text(ok, "p.md", tmp_path)
    assert checked.errors == [] and checked.tied == 4
    errors = check_text(ok.replace("238 ms", "239 ms"), "p.md", tmp_path).errors
    assert any(e.startswith("p.md:1: 239 is not a value") for e in errors), errors
    errors = check_text(ok.replace("3.5x", "3.6x"), "p.md", tmp_path).errors
    assert any(e.startswith("p.md:2: 3.6 is not a value") for e in errors), errors
    errors = check_text(ok.replace('"bf16 step', '"bf17 step'), "p.md", tmp_path).errors
    assert any("matches no number" in e for e in errors), errors


def test_a_confidence_level_split_over_two_lines_is_not_a_measurement():
    assert [n.text for n in counted_numbers("with a 95%", 1, "interval over documents")] == []
    assert [n.text for n in counted_numbers("took 68", 1, "min on 2 cores")] == ["68"]
    assert [n.text for n in counted_numbers("with a 95%", 1, "of the runs")] == ["95"]


@pytest.mark.parametrize(
    "page, number",
    [
        ("docs/results/segmented-figure3.md", "-0.011 [-0.013"),  # prose tied to a figure's table
        ("docs/results/segmented-figure3.md", "| 0.517"),  # a table under a 'table from' marker
        ("docs/results/sinusoidal.md", "6.694"),  # a table row tied cell by cell
        ("docs/results/extension.md", "0.009 [0.006"),  # prose tied to pairs.md
        ("docs/results/cost.md", "| 4.54"),  # a table row tied to bench.md
        ("docs/results/cost.md", "1.34-1.41x"),  # prose tied by a quoted expression
        ("docs/results/README.md", "68 min"),  # the index, tied to the page it summarises
        ("docs/results/mlm.md", "**6.573**"),  # a JSON key
        ("docs/results/expe-table2.md", "8.792"),  # a report kept from the git history
        ("docs/results/cpu-profile.md", "| 65 (15%)"),  # a table row tied to its .log by an expression
        ("docs/results/cpu-profile.md", "1.78x"),  # a ratio of two logged numbers ('over')
        ("docs/results/medium.md", "2.9-3.3 nats"),  # prose tied to report cells
        ("docs/results/peers.md", "0.032-0.037"),  # prose tied to pairs.md
        ("docs/results/attention/README.md", "| 0.0661"),  # a table cell, a mean over heads of the JSON
        ("docs/results/attention/README.md", "0.79 rising"),  # prose tied to a mean over heads
        ("docs/results/attention/README.md", "96%"),  # a ratio to a number of the page ('over')
        ("docs/results/attention/README.md", "73 s"),  # a wall time, a JSON key
        ("docs/results/gpu/h200-second.md", "31.2 %"),  # a table cell, a JSON key scaled (*100)
        ("docs/results/ruler/README.md", "0.450 and 0.700"),  # prose tied to per-task cells of report.md
    ],
)
def test_a_changed_digit_on_a_results_page_fails_naming_its_line(page, number):
    """A copy of a results page with one digit of a tied number changed fails, naming the page's line (issue
    47's "done when": changing any number of a results page fails a default test). A page still in PENDING
    has numbers tied to nothing before the change; the change adds an error of its own."""
    text = (ROOT / page).read_text()
    before = check_text(text, page, ROOT).errors
    assert all(UNTIED in e for e in before) if page in PENDING else before == []
    at = text.index(number)
    digit_at = at + max(i for i, c in enumerate(number) if c.isdigit())  # the quoted text's last digit
    changed = text[:digit_at] + ("1" if text[digit_at] != "1" else "2") + text[digit_at + 1 :]
    line = text[:at].count("\n") + 1
    errors = [e for e in check_text(changed, page, ROOT).errors if e not in before]
    assert errors and any(e.startswith(f"{page}:{line}:") for e in errors), errors


def test_a_mean_ties_a_number_the_json_keeps_apart(tmp_path):
    """``mean(PATH)`` ties the mean of what PATH names under each element (a mean over heads, one per
    length); a null names nothing (a "-" cell); a changed digit fails."""
    layers = [{"x": [1.0, 2.0], "past": None}, {"x": [3.0, 6.0], "past": {"x": [0.5, 0.75]}}]
    (tmp_path / "a.json").write_text(json.dumps({"results": [{"ev": 1, "layers": layers}]}))
    ok = "| ev | x | past x |\n|---|---:|---:|\n| 1 | 3.00 | 0.625 |\n"
    ok += "<!-- from a.json: results[*].mean(layers[*].x); results[*].mean(layers[*].past.x) -->\n"
    checked = check_text(ok, "p.md", tmp_path)
    assert checked.errors == [] and checked.tied == 2
    errors = check_text(ok.replace("3.00", "3.01"), "p.md", tmp_path).errors
    assert any(e.startswith("p.md:3: 3.01 is not a value its marker names") for e in errors), errors


def test_a_table_may_join_a_second_tables_cell_and_both_are_checked(tmp_path):
    """A page's cell "accuracy / exact match" joins the same row's cells of two same-header tables of the
    report; a changed digit on either side of the " / " fails."""
    (tmp_path / "report.md").write_text(
        "Token accuracy:\n\n| model | ev=1 |\n|---|---:|\n| NoPE | 0.491 [0.466, 0.516] |\n\n"
        "Exact match:\n\n| model | ev=1 |\n|---|---:|\n| NoPE | 0.008 |\n"
    )
    ok = "| model | ev=1 |\n|---|---:|\n| NoPE | 0.491 [0.466, 0.516] / 0.008 |\n"
    ok += "<!-- table from report.md -->\n"
    assert check_text(ok, "p.md", tmp_path).errors == []
    for changed in (ok.replace("/ 0.008", "/ 0.009"), ok.replace("0.491", "0.492")):
        errors = check_text(changed, "p.md", tmp_path).errors
        assert "p.md:4: the row on line 3 is not its row of report.md" in errors, errors


def test_a_ratio_of_two_committed_numbers_ties_a_derived_ratio(tmp_path):
    """``A over B`` ties a ratio the page computes ("3.2x NoPE" from two step times); a changed digit
    fails, and so does a ratio of the wrong pair."""
    (tmp_path / "r.json").write_text(json.dumps({"nope": 0.0471, "alibi": 0.1495}))
    (tmp_path / "steps.log").write_text("fp32 peak 92 GFLOP/s, bf16 peak 205 GFLOP/s\n")
    (tmp_path / "t2.json").write_text(json.dumps({"nope": 0.0285}))
    ok = (
        "ALiBi trains 3.2x slower<!-- from r.json: alibi over nope --> and bf16's peak is 2.2x<!-- from "
        'steps.log: "bf16 peak (\\d+)" over "fp32 peak (\\d+)" --> fp32\'s; two threads 1.65x faster'
        "<!-- from\nr.json: nope over t2.json: nope -->.\n"
    )
    checked = check_text(ok, "p.md", tmp_path)
    assert checked.errors == [] and checked.tied == 3
    assert any(
        "3.3 is not a value" in e for e in check_text(ok.replace("3.2x", "3.3x"), "p.md", tmp_path).errors
    )
    errors = check_text(ok.replace("alibi over nope", "nope over alibi"), "p.md", tmp_path).errors
    assert any("printed nowhere" in e for e in errors), errors
