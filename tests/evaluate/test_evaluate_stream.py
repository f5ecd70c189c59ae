"""The stream protocol (documents joined with end-of-text): the same targets at every length, equal to a
direct per-target recomputation with context crossing documents and with document-masked scoring (then
equal to each document scored alone), the result naming its protocol, and clear refusals."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from extrapos.data import open_split
from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, evaluate, format_result
from extrapos.evaluate.stream import TokenStream, score_blocks, select_blocks
from extrapos.run.config import load_config
from extrapos.run.directory import load_run
from extrapos.training.trainer import train
from tests.conftest import tiny_overrides

L = 16


@pytest.fixture(scope="module")
def short_data(tmp_path_factory):
    """Web-length documents (sotu-short) under a small BPE, a test split of ~36 documents."""
    from extrapos.data import prepare_data

    out = tmp_path_factory.mktemp("short") / "sotu-short"
    return prepare_data(
        "sotu-short", "bpe:512", out, max_docs=120, split_fractions=(0.6, 0.1, 0.3), progress=False
    )


@pytest.fixture(scope="module")
def runs(short_data, tmp_path_factory):
    """Tiny packed runs (L_t = 16) of a relative (RoPE) and an absolute (sinusoidal) encoding."""
    root = tmp_path_factory.mktemp("stream-runs")
    out = {}
    for name in ("rope", "sinusoidal"):
        overrides = tiny_overrides(
            short_data,
            **{
                "model.train_length": L,
                "train.steps": 4,
                "model.positions.name": name,
                "data.packed": "true",
            },
        )
        train(load_config("cpu/tiny", overrides), root / name, progress=False)
        out[name] = root / name
    return out


def joined(split) -> tuple[np.ndarray, np.ndarray]:
    """The stream built the plain way, and the document each stream token's segment belongs to:
    [EOT] d0 [EOT] d1 ... [EOT], an end-of-text opening every document."""
    tokens, segment = [], []
    for d in range(split.num_docs):
        tokens += [split.eot_id, *np.asarray(split.doc(d)).tolist()]
        segment += [d] * (1 + len(split.doc(d)))
    return np.asarray(tokens + [split.eot_id]), np.asarray(segment + [split.num_docs - 1])


def loss_of(model, context: list[int], positions: list[int], target: int) -> float:
    """The model's loss on one target after exactly this context, one plain forward."""
    logits = model(torch.tensor([context]), torch.tensor([positions]))[0, -1]
    return float(F.cross_entropy(logits[None].float(), torch.tensor([target])))


def direct_losses(model, split, ends, window: int, boundary: str) -> np.ndarray:
    """Every block target's loss recomputed alone: crossing, the window's inputs up to the target at
    positions 0..; masked, the target's own document scored alone ([EOT] + its tokens), cut where the
    window starts, at positions from 0."""
    stream, segment = joined(split)
    opens = {d: int(np.flatnonzero(segment == d)[0]) for d in np.unique(segment)}
    out = np.empty((len(ends), L))
    with torch.no_grad():
        for b, end in enumerate(ends.tolist()):
            start = end - 1 - window  # the window's first input
            for i, t in enumerate(range(end - L, end)):
                if boundary == "mask":
                    start = max(end - 1 - window, opens[int(segment[t - 1])])
                context = stream[start:t].tolist()
                out[b, i] = loss_of(model, context, list(range(len(context))), int(stream[t]))
    return out


def test_stream_is_the_documents_joined_as_packed_training_joins_them(short_data):
    split = open_split(short_data, "test")
    stream = TokenStream(split)
    plain, segment = joined(split)
    assert stream.length == len(plain) == split.num_tokens + split.num_docs + 1
    index = np.arange(stream.length)
    tokens, eot = stream.gather(index)
    assert np.array_equal(tokens, plain) and np.array_equal(stream.segment(index), segment)
    assert eot.sum() == split.num_docs + 1 and np.all(tokens[eot] == split.eot_id)
    # a document's targets: its own tokens and the end-of-text closing it (predicted from its last token)
    owners = stream.owner(index[1:])
    assert np.array_equal(np.bincount(owners), split.doc_lengths + 1)


def test_blocks_are_evenly_spread_and_leave_room_for_the_longest_window():
    ends = select_blocks(10_000, 16, 256, 16 * 10)
    assert len(ends) == 10 and ends[0] == 257 and np.all(np.diff(ends) % 16 == 0)
    assert ends[-1] > 10_000 - 1_000  # spread over the whole stream, not its start
    every = select_blocks(1_000, 16, 256, 1_000_000)  # a budget past the stream: every block, once
    assert np.array_equal(every, np.arange(257, 1_001, 16))
    with pytest.raises(UserError, match="fewer than the 257 that the longest window"):
        select_blocks(256, 16, 256, 160)


@pytest.mark.parametrize("boundary", ["cross", "mask"])
@pytest.mark.parametrize("encoding", ["rope", "sinusoidal"])
def test_blocks_crossing_documents_equal_a_direct_recomputation(runs, short_data, boundary, encoding):
    run = load_run(runs[encoding])
    split = open_split(short_data, "test")
    stream = TokenStream(split)
    # blocks chosen so that their windows hold the end of one document and the start of the next
    ends = stream.opens[[3, 7, 11]] + np.array([2, 9, L])
    for k in (1, 4):
        got = score_blocks(run.model, stream, ends, L, k * L, batch_tokens=96, mask=boundary == "mask")
        want = direct_losses(run.model, split, ends, k * L, boundary)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    crossed = score_blocks(run.model, stream, ends, L, 4 * L, batch_tokens=96, mask=False)
    masked = score_blocks(run.model, stream, ends, L, 4 * L, batch_tokens=96, mask=True)
    assert not torch.allclose(crossed, masked)  # the mask changes what a target sees past a boundary


@pytest.mark.parametrize("boundary", ["cross", "mask"])
def test_stream_evaluation_scores_the_same_targets_at_every_length(runs, short_data, boundary):
    req = EvalRequest(lengths=[1, 4, 16], max_tokens=8 * L, protocol="stream", boundary=boundary)
    r = evaluate(runs["rope"], req, progress=False)
    assert r["name"] == f"test-stream-{boundary}"
    assert (r["protocol"], r["boundary"], r["request"]["boundary"]) == ("stream", boundary, boundary)
    rows = r["results"]
    assert [x["window"] for x in rows] == [L, 4 * L, 16 * L] and r["blocks"] == 8 and r["block"] == L
    assert {x["tokens"] for x in rows} == {r["target_tokens"]} == {8 * L}
    assert (
        len({tuple(x["doc_index"]) for x in rows}) == 1 and len({tuple(x["doc_tokens"]) for x in rows}) == 1
    )
    assert len({x["targets"] for x in rows}) == 1  # one digest of the scored targets for every length
    # the direct recomputation of every target, and of each document's share
    split = open_split(short_data, "test")
    stream = TokenStream(split)
    ends = select_blocks(stream.length, L, 16 * L, 8 * L)
    owners = stream.owner(ends[:, None] - L + np.arange(L))
    model = load_run(runs["rope"]).model
    for x in rows:
        want = direct_losses(model, split, ends, x["window"], boundary)
        if x["ev"] == 16:  # 16 targets, 32 buckets asked: one bucket per position of the block
            np.testing.assert_allclose(r["per_position"]["loss"], want.mean(0), rtol=1e-5)
        assert x["loss"] == pytest.approx(want.mean(), rel=1e-5)
        assert x["doc_index"] == sorted(set(owners.ravel().tolist())) and sum(x["doc_tokens"]) == x["tokens"]
        sums = [want[owners == d].sum() for d in x["doc_index"]]
        np.testing.assert_allclose(x["doc_loss_sums"], sums, rtol=1e-5)
        assert x["tail_loss"] == pytest.approx(x["loss"]) and x["seq_ppl"] is None
    assert r["documents_used"] == len(rows[0]["doc_index"]) >= 8  # eight blocks spread over the stream
    assert r["per_position"]["window"] == 16 * L and r["per_position"]["starts"][0] == 15 * L
    text = format_result(r)
    assert "protocol: stream" in text and f"{r['documents_in_split']} documents joined" in text


def test_the_two_boundaries_are_different_evaluations(runs):
    run = runs["rope"]
    cross = EvalRequest(lengths=[1, 4], max_tokens=64, protocol="stream")
    masked = EvalRequest(lengths=[1, 4], max_tokens=64, protocol="stream", boundary="mask")
    spelled = EvalRequest(lengths=[1, 4], max_tokens=64, protocol="stream", boundary="cross")
    a = evaluate(run, cross, name="b", progress=False)
    assert evaluate(run, spelled, name="b", progress=False) == a  # None means cross: one evaluation
    with pytest.raises(UserError, match="holds a different evaluation"):
        evaluate(run, masked, name="b", progress=False)
    assert len({cross.key(), masked.key(), EvalRequest(lengths=[1, 4], max_tokens=64).key()}) == 3


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"boundary": "mask"}, "applies to the stream protocol only"),
        ({"protocol": "stream", "stride": 8}, "drop --stride"),
        ({"protocol": "stream", "selection": "first"}, "documents protocol only"),
        ({"protocol": "streams"}, "--protocol must be documents or stream"),
        ({"protocol": "stream", "boundary": "soft"}, "--boundary must be cross or mask"),
        ({"protocol": "stream", "lengths": [1, 100_000]}, "held-out stream has [\\d,]+ tokens"),
    ],
)
def test_bad_requests_are_one_sentence(runs, fields, match):
    with pytest.raises(UserError, match=match):
        evaluate(runs["rope"], EvalRequest(max_tokens=64, **fields), name="bad", progress=False)


def test_an_encoder_evaluation_refuses_the_stream_before_loading_anything(tmp_path):
    from extrapos.evaluate import load_eval_inputs

    with pytest.raises(UserError, match="documents protocol only"):
        load_eval_inputs(tmp_path / "nothing", EvalRequest(protocol="stream"), None, "cpu", False)


def test_eval_cli_takes_the_protocol_and_the_boundary(runs, capsys):
    from extrapos.cli import main

    args = ["eval", str(runs["sinusoidal"]), "--lengths", "1,2", "--max-tokens", "64", "--no-progress"]
    assert main([*args, "--protocol", "stream", "--boundary", "mask"]) == 0
    out = capsys.readouterr().out
    assert "protocol: stream, document-masked" in out and "| 2 | 32 |" in out
    assert (runs["sinusoidal"] / "eval" / "test-stream-mask.json").is_file()
    assert main([*args, "--boundary", "mask"]) == 2  # a documents evaluation has no boundary to cross
    assert "applies to the stream protocol only" in capsys.readouterr().err


def _sweep(tmp_path, runs, extra: str) -> str:
    """A sweep of copies of the two runs (nothing to train, no results yet), under ``extra``'s protocol."""
    import shutil

    for name in runs:
        shutil.copytree(runs[name], tmp_path / name, ignore=shutil.ignore_patterns("eval"))
    path = tmp_path / "stream.toml"
    path.write_text(
        f'title = "stream"\nlengths = [1, 4]\nmax_eval_tokens = 128\n{extra}\n'
        f'[[rows]]\nname = "RoPE"\nrun = "{tmp_path / "rope"}"\n'
        f'[[rows]]\nname = "Sinusoidal"\nrun = "{tmp_path / "sinusoidal"}"\n'
    )
    return str(path)


def test_a_sweep_says_protocol_stream_and_its_report_names_it(runs, tmp_path):
    import json

    from extrapos.compare import compare

    out = tmp_path / "out"
    compare(_sweep(tmp_path, runs, 'protocol = "stream"\nboundary = "mask"'), out, progress=False)
    rows = {
        e["name"]: json.loads((out / e["eval"]).read_text())
        for e in json.loads((out / "rows.json").read_text())
    }
    assert {(r["protocol"], r["boundary"], r["blocks"]) for r in rows.values()} == {("stream", "mask", 8)}
    text = (out / "report.md").read_text()
    assert "Protocol: stream, document-masked" in text and "evaluation protocols" not in text
    facts = json.loads((out / "facts.json").read_text())
    assert any("protocol stream, document-masked" in f and "blocks of 16" in f for f in facts)
    # the two rows score the same targets, so their difference is paired
    diff = text.split("Difference to the baseline row (RoPE)")[1].split("Perplexity")[0]
    assert next(line for line in diff.splitlines() if line.startswith("| Sinusoidal |")).count("[") == 2


@pytest.mark.parametrize(
    "extra, match",
    [
        ('protocol = "streams"', "protocol must be 'documents' or 'stream'"),
        ('boundary = "mask"', 'goes with protocol = "stream" only'),
        ('protocol = "stream"\nboundary = "soft"', 'goes with protocol = "stream" only'),
    ],
)
def test_a_sweep_with_a_bad_protocol_is_one_sentence(runs, tmp_path, extra, match):
    from extrapos.compare import load_sweep

    with pytest.raises(UserError, match=match):
        load_sweep(_sweep(tmp_path, runs, extra))


def test_reports_never_put_two_protocols_in_one_table(runs, tmp_path):
    import csv

    from extrapos.report.render import Row, cell_intervals, markdown_table, write_report

    documents = evaluate(runs["rope"], EvalRequest(lengths=[1, 4], max_tokens=128), name="d", progress=False)
    stream = evaluate(
        runs["rope"], EvalRequest(lengths=[1, 4], max_tokens=128, protocol="stream"), name="s", progress=False
    )
    other = evaluate(
        runs["sinusoidal"],
        EvalRequest(lengths=[1, 4], max_tokens=128, protocol="stream"),
        name="s",
        progress=False,
    )
    rows = [Row("rope docs", documents), Row("rope stream", stream), Row("sin stream", other)]
    table = markdown_table(rows)
    assert table.startswith("These results were scored under 2 evaluation protocols")
    first, second = table.split("Protocol: ")[1:]
    assert "| rope docs |" in first and "stream" not in first.split("\n", 1)[1]
    assert "| rope stream |" in second and "| sin stream |" in second and "| rope docs |" not in second
    report = write_report(rows, tmp_path / "report", "mixed", baseline="rope docs").read_text()
    assert report.count("These results were scored under 2 evaluation protocols") == 1
    docs_part, stream_part = report.split("## Protocol: ")[1:]
    assert docs_part.startswith("documents") and stream_part.startswith("stream, context crossing documents")
    assert "| rope stream |" not in docs_part and "| rope docs |" not in stream_part
    assert "baseline row (rope docs)" in docs_part and "baseline row (rope stream)" in stream_part
    assert (tmp_path / "report" / "plots" / "stream-cross" / "loss_vs_length.png").is_file()
    with open(tmp_path / "report" / "results.csv") as f:
        protocols = {r["model"]: r["protocol"] for r in csv.DictReader(f)}
    assert protocols == {
        "rope docs": "documents",
        "rope stream": "stream-cross",
        "sin stream": "stream-cross",
    }
    # rows of one protocol pair; across protocols they never do
    cells = cell_intervals(rows, "rope stream")
    assert cells[("sin stream", 4)].difference is not None and cells[("rope docs", 4)].difference is None


SHARDED = """
import sys
import torch
from extrapos.evaluate import EvalRequest, evaluate
from extrapos.run.runtime import init_distributed

init_distributed(torch.device("cpu"))
req = EvalRequest(lengths=[1, 4], max_tokens=160, protocol="stream", boundary=sys.argv[2])
evaluate(sys.argv[1], req, name="sharded-" + sys.argv[2], batch_tokens=64, progress=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("boundary", ["cross", "mask"])
def test_sharded_stream_evaluation_equals_one_process(runs, tmp_path, boundary):
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29571"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*cmd, str(script), str(runs["rope"]), boundary], check=True, timeout=300, env=env)
    req = EvalRequest(lengths=[1, 4], max_tokens=160, protocol="stream", boundary=boundary)
    one = evaluate(runs["rope"], req, name=f"one-{boundary}", batch_tokens=64, progress=False)
    sharded = json.loads((runs["rope"] / "eval" / f"sharded-{boundary}.json").read_text())
    assert [r["doc_loss_sums"] for r in sharded["results"]] == [r["doc_loss_sums"] for r in one["results"]]


def _cells(targets: dict[int, str]) -> dict:
    """A result whose lengths scored two documents with equal counts, the targets' digests as given."""
    rows = [
        {"ev": ev, "window": 16 * ev, "tokens": 4, "loss": 1 + ev / 8, "ppl": 1.0, "tail_loss": 1.0}
        | {"doc_index": [0, 1], "doc_loss_sums": [2.0 + ev, 2.5], "doc_tokens": [2, 2], "targets": t}
        for ev, t in targets.items()
    ]
    return {"request": {"protocol": "stream", "boundary": "cross"}, "results": rows}


def test_lengths_pair_only_over_the_same_targets():
    from extrapos.report.render import Row, length_change_table

    same = length_change_table([Row("same", _cells({1: "a", 4: "a"}))])
    assert same is not None and "| same | +" in same
    # documents and counts alike, targets not (a sweep that scores each length alone): never paired
    assert length_change_table([Row("apart", _cells({1: "a", 4: "b"}))]) is None


def test_a_stream_sweep_checks_the_stream_before_training(short_data, tmp_path):
    import json

    from extrapos.compare import compare

    sets = tiny_overrides(short_data, **{"model.train_length": L, "train.steps": 2})
    path = tmp_path / "long.toml"
    path.write_text(
        f'title = "too long"\ntrain = "cpu/tiny"\nlengths = [1, 100_000]\nprotocol = "stream"\n'
        f'set = {json.dumps(sets)}\n[[rows]]\nname = "RoPE"\npositions = {{ name = "rope" }}\n'
    )
    with pytest.raises(UserError, match="held-out stream has [\\d,]+ tokens"):
        compare(str(path), tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "runs").exists()  # refused before any row trained
