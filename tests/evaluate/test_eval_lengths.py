"""Fractional lengths (0.5 x L_t), token lengths (--tokens) and the intervals `extrapos eval` prints."""

import json
import re

import pytest
import torch

from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, evaluate, score_windows
from extrapos.evaluate.lengths import EvalLength, ev_value, resolve_lengths, window_of
from extrapos.report.stats import MIN_DOCUMENTS, cell_samples, loss_interval
from extrapos.run.config import load_config
from extrapos.run.directory import load_run
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory):
    """A tiny RoPE run (L_t = 16)."""
    out = tmp_path_factory.mktemp("lengths") / "rope"
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 4}))
    train(cfg, out, progress=False)
    return out


def test_lengths_resolve_to_whole_windows_sorted_and_once():
    got = resolve_lengths([2, 0.5, 1], [15360, 32], 16)
    assert got == [
        EvalLength(0.5, 8),
        EvalLength(1, 16),
        EvalLength(2, 32),  # --tokens 32 is the same window as 2 x 16: evaluated once
        EvalLength(960, 15360),
    ]
    assert resolve_lengths([], [24], 16) == [EvalLength(1.5, 24)]
    assert isinstance(ev_value(2.0), int) and ev_value(0.25) == 0.25
    assert 1.1 * 50 != 55 and window_of(1.1, 50) == 55  # read as the decimal written, not its binary value


@pytest.mark.parametrize(
    ("k", "L", "message"),
    [
        (0.3, 64, "0.3 x L_t = 19.2 tokens is not a whole number .* nearest valid length is 0.296875 "),
        (0.01, 64, "nearest valid length is 0.03125 \\(2 tokens\\)"),
        (1.5, 3, "nearest valid length is --tokens 4"),
    ],
)
def test_a_length_that_is_not_whole_tokens_names_the_nearest_valid_one(k, L, message):
    with pytest.raises(UserError, match=message):
        window_of(k, L)


def test_fractional_and_token_lengths_end_to_end(run, capsys):
    from extrapos.cli import main

    args = ["eval", str(run), "--lengths", "0.5,1,2", "--tokens", "64", "--max-tokens", "640"]
    assert main([*args, "--split", "train", "--no-progress"]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "eval" / "train.json").read_text())
    rows = result["results"]
    assert [r["ev"] for r in rows] == [0.5, 1, 2, 4] and [r["window"] for r in rows] == [8, 16, 32, 64]
    assert result["request"]["lengths"] == [0.5, 1, 2] and result["request"]["tokens"] == [64]
    assert len({r["targets"] for r in rows}) == 1 and len({r["tokens"] for r in rows}) == 1
    # the 0.5 x L_t row is the loss of windows of 8 tokens over the same spans, scored directly
    model = load_run(run).model
    spans = _spans(result, run)
    direct = score_windows(model, spans, 8, batch_tokens=1024, precision="fp32")
    assert rows[0]["loss"] == pytest.approx(float(direct.mean()), rel=1e-6)
    assert rows[0]["tail_loss"] == pytest.approx(rows[0]["loss"])  # a window shorter than L_t is all tail
    # the console labels each length by its ev and window, with the interval report/stats.py computes
    for r in rows:
        samples = cell_samples(result, r["ev"])
        assert len(samples.doc_index) >= MIN_DOCUMENTS
        iv = loss_interval(samples.sums, samples.counts)
        line = f"| {r['ev']} | {r['window']} | {r['loss']:.4f} |"
        (printed,) = [x for x in out.splitlines() if x.startswith(line)]
        # the interval column, then the paired change to the shortest length
        assert f"| [{iv.low:.4f}, {iv.high:.4f}] | " in printed and iv.low < r["loss"] < iv.high


def _spans(result, run):
    """The spans the documents protocol scored for ``result`` (the same selection, cut again)."""
    from extrapos.data import open_split
    from extrapos.evaluate import collect_spans

    split = open_split(result["data_dir"], result["split"])
    spans = collect_spans(split, 64, result["request"]["max_tokens"])[0]
    return torch.from_numpy(spans)


def test_too_few_documents_for_an_interval_is_said(run, capsys):
    from extrapos.cli import main

    assert main(["eval", str(run), "--lengths", "1,2", "--max-tokens", "64", "--no-progress"]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "eval" / "test.json").read_text())
    n = result["documents_used"]
    assert n < MIN_DOCUMENTS
    assert out.count(f"too few documents for an interval ({n}; it needs {MIN_DOCUMENTS})") == 2


def test_integer_lengths_keep_their_request_and_key(run):
    req = EvalRequest(lengths=[1, 2], max_tokens=64)
    result = evaluate(run, req, name="ints", progress=False)
    assert "tokens" not in result["request"] and "tokens" not in req.key_fields()
    assert [r["ev"] for r in result["results"]] == [1, 2] and all(
        type(r["ev"]) is int for r in result["results"]
    )
    # the same windows named in tokens are another request (another key), with the same losses
    by_tokens = evaluate(
        run, EvalRequest(lengths=[], tokens=[16, 32], max_tokens=64), name="tok", progress=False
    )
    assert by_tokens["request_key"] != result["request_key"]
    assert [r["loss"] for r in by_tokens["results"]] == [r["loss"] for r in result["results"]]


def test_the_stream_protocol_takes_token_lengths_of_at_least_L_t(run):
    req = EvalRequest(lengths=[1], tokens=[24], protocol="stream", max_tokens=64)
    result = evaluate(run, req, name="stream-tokens", progress=False)
    rows = result["results"]
    assert [(r["ev"], r["window"]) for r in rows] == [(1, 16), (1.5, 24)]
    assert rows[0]["targets"] == rows[1]["targets"] and result["per_position"]["window"] == 24


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lengths", "0.3"], "nearest valid length is 0.3125 \\(5 tokens\\)"),
        (["--lengths", "1,2", "--tokens", "48"], "every window must divide the longest \\(48 tokens\\)"),
        (["--lengths", "0.5,1", "--protocol", "stream"], "windows must be at least 16 tokens"),
        (["--tokens", "1"], "--tokens must be whole numbers of at least 2 tokens"),
        (["--tokens", "x"], "--tokens must be whole numbers"),
        (["--lengths", "-1"], "--lengths must be positive numbers"),
    ],
)
def test_bad_lengths_are_one_sentence(run, capsys, argv, message):
    from extrapos.cli import main

    before = sorted(p.name for p in (run / "eval").glob("*")) if (run / "eval").is_dir() else []
    assert main(["eval", str(run), *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err
    after = sorted(p.name for p in (run / "eval").glob("*")) if (run / "eval").is_dir() else []
    assert after == before  # nothing written
