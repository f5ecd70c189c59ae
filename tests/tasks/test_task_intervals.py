"""Intervals on task accuracies: per-example results recorded by the scorers, a bootstrap over the
examples in the report, and paired differences only between rows that scored the same examples."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from extrapos.compare import compare
from extrapos.data.synthetic import SyntheticTask
from extrapos.model import Decoder, model_config
from extrapos.report import task_tables
from extrapos.tasks.synthetic import score_examples
from tests.compare.test_compare_tasks import _synthetic_sweep


@dataclass
class FakeRow:
    name: str
    tasks: dict = field(default_factory=dict)


def _result(correct: list[int], digest: str = "d0") -> dict:
    n = len(correct)
    return {
        "results": [
            {
                "ev": 1,
                "exact_match": float(np.mean(correct)),
                "per_example": {"exact_match": [correct, [1] * n]},
                "examples_digest": digest,
            }
        ]
    }


def test_score_examples_per_example_counts_add_up_to_the_aggregates():
    torch.manual_seed(0)
    task = SyntheticTask.parse("synthetic:passkey:length=16,train=40,val=4,test=4")
    ids, answer = task.eval_examples(32, 9, 0)
    model = Decoder(model_config("cpu-tiny", vocab_size=int(ids.max()) + 1, positions={"name": "rope"}))
    out = score_examples(model, ids, answer, batch_tokens=64)  # several batches
    num, den = out["per_example"]["token_accuracy"]
    assert len(num) == len(den) == 9 and sum(den) == out["answer_tokens"]
    assert sum(num) / sum(den) == out["token_accuracy"]
    exact, ones = out["per_example"]["exact_match"]
    assert ones == [1] * 9 and np.mean(exact) == out["exact_match"]
    assert exact == [int(c == t) for c, t in zip(num, den)]
    # the digest names the examples: the same examples give the same digest, others another
    again = score_examples(model, ids, answer)
    assert again["examples_digest"] == out["examples_digest"]
    assert score_examples(model, ids[:8], answer[:8])["examples_digest"] != out["examples_digest"]


def test_paired_difference_only_between_rows_on_the_same_examples_and_tighter_than_unpaired():
    rng = np.random.default_rng(0)
    base = (rng.random(200) < 0.6).astype(int)
    flip = rng.random(200) < 0.05  # the other row agrees with the baseline on 95% of examples
    other = np.where(flip, 1 - base, base)
    rows = [
        FakeRow("A", {"passkey": _result(base.tolist())}),
        FakeRow("B", {"passkey": _result(other.tolist())}),
    ]
    cells = task_tables.accuracy_cells("passkey", rows, "exact_match", "A")
    iv_a, diff_a = cells[("A", 1)]
    iv_b, diff_b = cells[("B", 1)]
    assert diff_a is None and diff_b is not None
    assert iv_a.low < base.mean() < iv_a.high
    assert abs(diff_b.estimate - (other.mean() - base.mean())) < 1e-12
    # pairing removes the example-to-example variation both rows share
    paired_width = diff_b.high - diff_b.low
    unpaired_width = (iv_a.high - iv_a.low) + (iv_b.high - iv_b.low)
    assert paired_width < 0.5 * unpaired_width
    # other examples (another digest): no paired difference, but still an interval
    rows[1].tasks["passkey"] = _result(other.tolist(), digest="other")
    cells = task_tables.accuracy_cells("passkey", rows, "exact_match", "A")
    assert cells[("B", 1)][1] is None and cells[("B", 1)][0] is not None
    # a result saved before per-example data: no interval at all, and the table still renders
    del rows[1].tasks["passkey"]["results"][0]["per_example"]
    cells = task_tables.accuracy_cells("passkey", rows, "exact_match", "A")
    assert ("B", 1) not in cells
    table = task_tables.length_table("passkey", rows, "exact_match", cells)
    assert "| B | " in table and "[" not in table.splitlines()[-1]


def test_accuracy_interval_covers_the_true_rate_at_about_the_nominal_rate():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(200):
        x = (rng.random(150) < 0.3).astype(int).tolist()
        iv, _ = task_tables.accuracy_cells("passkey", [FakeRow("A", {"passkey": _result(x)})], "exact_match")[
            ("A", 1)
        ]
        hits += iv.low <= 0.3 <= iv.high
    assert 0.89 <= hits / 200 <= 0.99  # 95% nominal; percentile bootstrap of a proportion, n = 150


def test_compare_report_carries_task_intervals_and_differences(tmp_path):
    out = tmp_path / "out"
    text = compare(str(_synthetic_sweep(tmp_path)), out, progress=False).read_text()
    assert "interval from a bootstrap over the examples" in text
    rope_line = next(line for line in text.splitlines() if line.startswith("| RoPE |"))
    assert rope_line.count("[") == 3  # three lengths, each with its interval
    entries = json.loads((out / "rows.json").read_text())
    rope = json.loads((out / entries[0]["tasks"]["synthetic"]).read_text())
    alibi = json.loads((out / entries[1]["tasks"]["synthetic"]).read_text())
    # every row scored the same examples, so the differences are paired
    assert [c["examples_digest"] for c in rope["results"]] == [c["examples_digest"] for c in alibi["results"]]
    assert "Difference to RoPE" in text and "| RoPE yarn |" in text
