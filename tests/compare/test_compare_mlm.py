"""Encoder rows in a sweep: scored with evaluate_mlm (not the next-token protocol), into the same report."""

import csv
import json
import math

import pytest

from extrapos.compare import compare
from extrapos.evaluate import EvalRequest
from extrapos.evaluate.mlm import evaluate_mlm
from tests.conftest import encoder_overrides

KEYS = ("ev", "tokens", "loss", "ppl", "accuracy", "tail_loss", "doc_loss_sums", "doc_tokens")


@pytest.fixture(scope="module")
def many_docs(tmp_path_factory):
    """Thirty short documents (a few hundred tokens each), so the held-out split has several documents and
    the bootstrap over documents has something to resample (sotu's test split is one long address)."""
    import random

    from extrapos.data import prepare_data

    rng = random.Random(0)
    words = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "si", "tu") for b in ("n", "r", "s", "")]
    folder = tmp_path_factory.mktemp("docs")
    for i in range(30):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(150, 300)))
        (folder / f"doc{i:02d}.txt").write_text(text + ".", encoding="utf-8")
    out = tmp_path_factory.mktemp("data") / "short"
    return prepare_data(str(folder), "bpe:512", out, split_fractions=(0.5, 0.1, 0.4), progress=False)


def _sweep(tmp_path, data, seeds=None):
    sets = encoder_overrides(data)
    f = tmp_path / "mlm-sweep.toml"
    f.write_text(
        'title = "tiny mlm"\ntrain = "cpu/tiny"\nlengths = [1, 2, 4]\nmax_eval_tokens = 1024\n'
        f"set = {json.dumps(sets)}\n"
        + (f"seeds = {json.dumps(seeds)}\n" if seeds else "")
        + '[[rows]]\nname = "Learned"\npositions = { name = "learned" }\n'
        'eval = { interpolate_to = "window" }\n'
        '[[rows]]\nname = "CABLE"\npositions = { name = "cable" }\n'
    )
    return f


def _direct(run_dir, **options):
    """evaluate_mlm on the run itself, under another name so it is scored again, not read back."""
    req = EvalRequest(lengths=[1, 2, 4], max_tokens=1024, position_options=options)
    return evaluate_mlm(run_dir, req, name="direct", progress=False)


def test_an_mlm_sweep_reports_evaluate_mlm_numbers_with_intervals(tmp_path, many_docs):
    out = tmp_path / "out"
    report = compare(str(_sweep(tmp_path, many_docs)), out, progress=False)
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())}
    assert set(rows) == {"Learned", "CABLE"}
    learned = _direct(out / "runs" / "learned", interpolate_to="window")
    cable = _direct(out / "runs" / "cable")
    for name, direct in (("Learned", learned), ("CABLE", cable)):
        got = rows[name]
        assert got["objective"] == "mlm" and got["eval_name"].startswith("mlm-")
        for mine, ref in zip(got["results"], direct["results"], strict=True):
            for key in KEYS:
                assert mine[key] == ref[key], (name, key)
    assert rows["Learned"]["applied"] == {"interpolate_to": "window"}
    # the learned table (16 rows) read at 64 positions: only possible through the per-window interpolation
    assert math.isfinite(rows["Learned"]["results"][-1]["loss"])
    # every row masks the same tokens of the same documents: the counts pair
    assert rows["Learned"]["results"][0]["doc_tokens"] == rows["CABLE"]["results"][0]["doc_tokens"]
    assert sum(rows["CABLE"]["results"][0]["doc_tokens"]) == rows["CABLE"]["target_tokens"]

    text = report.read_text()
    assert "Mean masked-token loss (MLM, nats)" in text and "Top-1 accuracy on the masked tokens" in text
    assert "masked-LM loss on" in text  # the facts say what was scored
    # and what the training cost, summed from the runs' own summaries (a reused run keeps its cost)
    trained = sum(
        json.loads((out / "runs" / r / "summary.json").read_text())["wall_time"] for r in ("learned", "cable")
    )
    assert f"the 2 trained runs took {trained / 60:.1f} min of training in all" in text
    table = text.split("Mean masked-token loss")[1].split("Difference to the baseline")[0]
    cable_line = next(line for line in table.splitlines() if line.startswith("| CABLE |"))
    assert cable_line.count("[") == 3 and "(no interval)" not in text  # an interval per length
    documents = len(rows["CABLE"]["results"][0]["doc_index"])
    assert documents >= 4 and f"({documents} per cell;" in text
    diff = text.split("Difference to the baseline row (Learned)")[1].split("Perplexity")[0]
    assert next(line for line in diff.splitlines() if line.startswith("| CABLE |")).count("[") == 3
    with open(out / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 6 and all(r["loss_low"] and r["accuracy"] for r in csv_rows)
    cable_csv = [r for r in csv_rows if r["model"] == "CABLE"]
    assert [float(r["loss"]) for r in cable_csv] == pytest.approx(
        [r["loss"] for r in cable["results"]], abs=1e-6
    )
    assert all(r["diff_low"] for r in cable_csv) and (out / "plots" / "per_position.png").is_file()
    # `extrapos report` renders the same report from the saved results, byte for byte
    from extrapos.cli import main

    before = {f: (out / f).read_bytes() for f in ("report.md", "results.csv", "results.json")}
    assert main(["report", str(out)]) == 0
    assert {f: (out / f).read_bytes() for f in before} == before


def test_an_mlm_sweep_with_seeds_combines_them_like_the_loss_rows(tmp_path, many_docs, capsys, console):
    out = tmp_path / "out"
    report = compare(str(_sweep(tmp_path, many_docs, seeds=[0, 1])), out, progress=True)
    # the console shows each row as `extrapos eval` prints an encoder's result (its loss evaluator's format)
    shown = capsys.readouterr().out.split("CABLE:\n", 1)[1]
    assert "(masked LM, mask seed 0)" in shown.splitlines()[0] and "| ev | window | MLM loss |" in shown
    merged = json.loads((out / "merged" / "cable.json").read_text())
    per_seed = [_direct(out / "runs" / f"cable-seed{s}") for s in (0, 1)]
    assert per_seed[0]["results"][0]["loss"] != per_seed[1]["results"][0]["loss"]  # two trainings
    for i, row in enumerate(merged["results"]):
        parts = [p["results"][i] for p in per_seed]
        assert row["loss"] == pytest.approx((parts[0]["loss"] + parts[1]["loss"]) / 2, rel=1e-12)
        assert row["accuracy"] == pytest.approx((parts[0]["accuracy"] + parts[1]["accuracy"]) / 2, rel=1e-12)
        assert row["ppl"] == pytest.approx(math.exp(row["loss"]), rel=1e-12)
        assert row["tokens"] == parts[0]["tokens"] and "doc_tokens" not in row
    text = report.read_text()
    assert "crossed with the training seeds" in text and "Spread across seeds" in text
    assert "| CABLE | 2 |" in text and "(no interval)" not in text
