"""Evaluation protocol: equal targets across lengths, tail loss, per-position curve, inference-time
changes, clear errors, no silent overwrite."""

import json

import numpy as np
import pytest
import torch

from extrapos.config import load_config
from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, collect_spans, evaluate, score_windows, token_losses
from extrapos.runs import load_run
from extrapos.train import train
from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    """Tiny trained runs (L_t = 16) of the encodings whose inference-time changes we test."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name in ("rope", "expe", "learned"):
        cfg = load_config(
            "cpu/tiny",
            tiny_overrides(
                tiny_data, **{"model.train_length": 16, "train.steps": 6, "model.positions.name": name}
            ),
        )
        train(cfg, root / name, progress=False)
        out[name] = root / name
    return out


def test_every_length_scores_the_same_targets(runs):
    r = evaluate(runs["rope"], EvalRequest(lengths=[1, 2, 4], max_tokens=512), progress=False)
    rows = r["results"]
    assert [x["ev"] for x in rows] == [1, 2, 4] and [x["window"] for x in rows] == [16, 32, 64]
    assert (
        len({x["tokens"] for x in rows}) == 1 and rows[0]["tokens"] == r["target_tokens"] == r["spans"] * 64
    )
    assert [x["windows"] for x in rows] == [r["spans"] * 4, r["spans"] * 2, r["spans"]]
    for x in rows:
        assert x["ppl"] == pytest.approx(np.exp(x["loss"]))
        assert x["bpb"] == pytest.approx(x["loss"] * x["tokens"] / (np.log(2) * r["target_bytes"]))
    assert rows[0]["tail_loss"] == pytest.approx(rows[0]["loss"])  # ev=1: the whole window is the tail
    assert len(r["per_position"]["loss"]) == r["request"]["buckets"] and r["per_position"]["window"] == 64


def test_windows_start_at_position_zero_and_tail_is_the_last_L_t(runs):
    run = load_run(runs["rope"])
    split_spans = torch.from_numpy(collect_spans(_test_split(run), 64, 128)[0])
    losses = score_windows(run.model, split_spans, 32, batch_tokens=1024, precision="fp32")
    # recompute the second window of the first span by hand: tokens 32..63 at positions 0..31
    toks, tgts = split_spans[:1, 32:64], split_spans[:1, 33:65]
    manual = token_losses(run.model, toks, torch.arange(32).unsqueeze(0), tgts)
    torch.testing.assert_close(losses[:1, 32:64], manual)
    # sliding mode scores every target once, the first window as a whole
    sliding = score_windows(run.model, split_spans, 32, batch_tokens=1024, precision="fp32", stride=8)
    torch.testing.assert_close(sliding[:, :32], losses[:, :32])
    assert not torch.equal(sliding[:, 32:], losses[:, 32:])  # later targets see more context


def _test_split(run):
    from extrapos.data import open_split

    return open_split(run.data_dir, "test")


@pytest.mark.parametrize(
    "encoding, options",
    [
        ("expe", {"scale": 0.5}),
        ("rope", {"scaling": "yarn", "factor": 4.0}),
        ("rope", {"scaling": "linear", "factor": 4.0}),
        ("rope", {"scaling": "ntk", "factor": 4.0}),
        ("rope", {"scaling": "dynamic", "factor": 4.0}),
        ("learned", {"interpolate_to": "max"}),
        ("learned", {"interpolate_to": "window"}),
    ],
)
def test_inference_time_changes_are_applied_and_recorded(runs, encoding, options):
    changed = evaluate(
        runs[encoding],
        EvalRequest(lengths=[1, 4], max_tokens=256, position_options=options),
        name="changed",
        progress=False,
        overwrite=True,
    )
    assert changed["applied"] == options
    expected = {k: (64 if v in ("max", "window") else v) for k, v in options.items()}
    for k, v in expected.items():
        assert changed["encoding_options"][k] == v
    if encoding == "learned":  # without interpolation ev=4 is an error (tested below)
        assert np.isfinite(changed["results"][1]["loss"])
        return
    plain = evaluate(
        runs[encoding],
        EvalRequest(lengths=[1, 4], max_tokens=256),
        name="plain",
        progress=False,
        overwrite=True,
    )
    assert changed["results"][1]["loss"] != pytest.approx(plain["results"][1]["loss"], abs=1e-6)


def test_per_window_interpolation_leaves_the_training_length_untouched(runs):
    plain = evaluate(runs["learned"], EvalRequest(lengths=[1], max_tokens=256), name="p1", progress=False)
    stretched = evaluate(
        runs["learned"],
        EvalRequest(lengths=[1], max_tokens=256, position_options={"interpolate_to": "window"}),
        name="w1",
        progress=False,
    )
    assert stretched["results"][0]["loss"] == plain["results"][0]["loss"]


def test_learned_table_beyond_its_length_is_a_clear_error(runs):
    with pytest.raises(UserError, match="interpolat"):
        evaluate(runs["learned"], EvalRequest(lengths=[4], max_tokens=128), name="too-long", progress=False)


def test_too_short_corpus_names_the_supported_lengths(runs):
    with pytest.raises(UserError, match="the longest has \\d+"):
        evaluate(runs["rope"], EvalRequest(lengths=[1, 100_000]), name="huge", progress=False)


def test_results_are_reused_and_never_silently_overwritten(runs):
    run = runs["rope"]
    first = evaluate(run, EvalRequest(lengths=[1, 2], max_tokens=128), name="keep", progress=False)
    again = evaluate(run, EvalRequest(lengths=[1, 2], max_tokens=128), name="keep", progress=False)
    assert again == first
    with pytest.raises(UserError, match="holds a different evaluation"):
        evaluate(run, EvalRequest(lengths=[1, 2], max_tokens=256), name="keep", progress=False)
    saved = json.loads((run / "eval" / "keep.json").read_text())
    assert saved["request"]["max_tokens"] == 128


def test_eval_cli_prints_the_table(runs, capsys):
    from extrapos.cli import main

    assert (
        main(
            [
                "eval",
                str(runs["expe"]),
                "--lengths",
                "1,2",
                "--scale",
                "0.5",
                "--max-tokens",
                "128",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| 2 | 32 |" in out and (runs["expe"] / "eval" / "test-scale0.5.json").is_file()
    assert main(["eval", str(runs["expe"]), "--lengths", "1,x"]) == 2


def test_results_record_per_document_losses_for_the_bootstrap(runs):
    r = evaluate(runs["rope"], EvalRequest(lengths=[1, 4], max_tokens=512), name="docs", progress=False)
    _, _, _, owners = collect_spans(_test_split(load_run(runs["rope"])), 64, 512, with_documents=True)
    for row in r["results"]:
        assert (
            row["doc_index"] == sorted(set(owners.tolist())) and len(row["doc_index"]) == r["documents_used"]
        )
        assert sum(row["doc_tokens"]) == row["tokens"]
        assert [row["doc_tokens"][row["doc_index"].index(d)] for d in owners[:1]] == [
            64 * (owners == owners[0]).sum()
        ]
        assert sum(row["doc_loss_sums"]) / row["tokens"] == pytest.approx(row["loss"], rel=1e-6)
        # the mean of per-window perplexities is at least exp(mean loss) (Jensen), and equal only if flat
        assert row["seq_ppl"] >= row["ppl"] * (1 - 1e-9)
    sliding = evaluate(
        runs["rope"], EvalRequest(lengths=[2], max_tokens=256, stride=8), name="s", progress=False
    )
    assert sliding["results"][0]["seq_ppl"] is None and sum(sliding["results"][0]["doc_tokens"]) == 256
