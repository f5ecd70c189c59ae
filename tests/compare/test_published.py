"""`extrapos compare`'s last words about the published table: the comparison where the repository publishes
one, one sentence where it cannot be made, and ``--against FILE`` read before any training."""

import json
import shutil
from pathlib import Path

import pytest

from extrapos.compare import published as published_mod
from extrapos.compare.published import PUBLISHED, closing_words, published_file, seeds_file
from extrapos.errors import UserError
from extrapos.presets import sweep_names
from extrapos.report.against_published import MATCHES

ROOT = Path(__file__).resolve().parents[2]


def test_the_published_presets_are_those_with_a_table_in_docs_results():
    with_table = {p.parent.name for p in (ROOT / "docs" / "results").glob("*/results.json")}
    assert set(PUBLISHED) == with_table & set(sweep_names())
    assert published_file("quick") == ROOT / "docs" / "results" / "quick" / "results.json"
    assert seeds_file(published_file("quick")) == ROOT / "docs" / "results" / "quick-seeds" / "results.json"
    assert seeds_file(published_file("quick-seeds")) is None and seeds_file(published_file("mlm")) is None


@pytest.fixture
def quick_out(tmp_path):
    """A comparison folder holding the published quick table, as `make demo` on the publishing machine
    would write it."""
    out = tmp_path / "compare-quick"
    out.mkdir()
    shutil.copy(published_file("quick"), out / "results.json")
    return out


def test_make_demo_ends_with_the_table_beside_the_published_one(quick_out):
    words = closing_words("quick", quick_out)
    assert words is not None and "quick-seeds/results.json" in words
    assert "| Sinusoidal | 5.722 (+0.000 within ±0.058) |" in words
    assert words.splitlines()[-1] == f"Verdict: {MATCHES}."


def test_a_moved_row_is_named(quick_out):
    rows = json.loads((quick_out / "results.json").read_text())
    for cell in rows[1]["results"]:  # Sinusoidal, one nat worse everywhere
        cell["loss"] += 1.0
    (quick_out / "results.json").write_text(json.dumps(rows))
    last = closing_words("quick", quick_out).splitlines()[-1]
    assert last.startswith("Verdict: row Sinusoidal differs beyond noise at 1x (6.722 against 5.722: +1.000")


def test_no_comparison_for_an_unpublished_sweep_or_a_changed_run(quick_out):
    assert closing_words("retrieval", quick_out) is None
    assert closing_words(str(ROOT / "configs" / "compare" / "quick.toml"), quick_out) is None
    words = closing_words("quick", quick_out, changed="--set train.tokens=200000")
    assert words is not None and words.startswith("Not compared with the published quick table:")
    assert "--set train.tokens=200000" in words and "\n" not in words


def test_a_missing_published_file_is_one_sentence(quick_out, tmp_path, monkeypatch):
    """A pip-installed package has no docs/results/: the user is told so, not shown a traceback."""
    monkeypatch.setattr(published_mod, "RESULTS_DIR", tmp_path / "site-packages" / "docs" / "results")
    words = closing_words("quick", quick_out)
    assert words is not None and "\n" not in words
    assert words.startswith(
        "The published quick table (docs/results/quick/results.json) is in the repository"
    )


def test_against_names_a_table_explicitly(quick_out, tmp_path):
    seeds = ROOT / "docs" / "results" / "quick-seeds" / "results.json"
    words = closing_words("my-sweep.toml", quick_out, against=str(seeds))
    # quick-seeds is a mean over 3 seeds with its own spread; seed 0 (the quick table) lies within it
    assert words is not None and words.splitlines()[-1] == f"Verdict: {MATCHES}."
    (tmp_path / "bad.json").write_text('{"results": {}}')
    with pytest.raises(UserError, match=r"bad.json is not the results.json of a comparison"):
        closing_words("quick", quick_out, against=str(tmp_path / "bad.json"))


def test_a_table_with_no_loss_columns_says_so(tmp_path):
    words = closing_words("quick", tmp_path)
    assert words == "No loss table to compare with the published one: this comparison scored no loss columns."


def test_the_cli_reads_against_before_any_training(tmp_path, capsys):
    from extrapos.cli import main

    out = tmp_path / "out"
    code = main(["compare", "quick", "--out", str(out), "--against", str(tmp_path / "nowhere.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err.endswith("does not exist; pass the results.json a comparison wrote.") and "\n" not in err


def test_compare_against_its_own_table_end_to_end(tmp_path, tiny_data, capsys):
    """A tiny sweep run twice: the second run reuses every row and, asked with --against, sets its table
    beside the first's (bands from the published table's own two seeds)."""
    from extrapos.cli import main
    from tests.conftest import tiny_overrides

    sets = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 4})
    spec = tmp_path / "sweep.toml"
    spec.write_text(
        'title = "tiny"\ntrain = "cpu/tiny"\nlengths = [1, 2]\nmax_eval_tokens = 128\nseeds = [0, 1]\n'
        f"set = {json.dumps(sets)}\n"
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
    )
    out = tmp_path / "out"
    assert main(["compare", str(spec), "--out", str(out), "--no-progress"]) == 0
    assert "Verdict" not in capsys.readouterr().out  # a sweep of one's own has no published table
    shutil.copy(out / "results.json", tmp_path / "published.json")
    against = ["--against", str(tmp_path / "published.json")]
    assert main(["compare", str(spec), "--out", str(out), "--no-progress", *against]) == 0
    printed = capsys.readouterr().out
    assert "| RoPE | " in printed and "(+0.000 within ±" in printed
    assert printed.rstrip().splitlines()[-1] == f"Verdict: {MATCHES}."
