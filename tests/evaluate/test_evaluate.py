"""Evaluation protocol: equal targets across lengths, tail loss, per-position curve, inference-time
changes, clear errors, no silent overwrite."""

import json

import numpy as np
import pytest
import torch

from extrapos.errors import UserError
from extrapos.evaluate import EvalRequest, collect_spans, evaluate, score_windows, token_losses
from extrapos.run.config import load_config
from extrapos.run.directory import load_run
from extrapos.training.trainer import train
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
    assert len({x["targets"] for x in rows}) == 1  # one digest of the scored targets for every length
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


class _Split:
    """What ``collect_spans`` reads of a split: document lengths and documents (token = its document)."""

    def __init__(self, lengths):
        self.doc_lengths = np.asarray(lengths)

    def doc(self, d):
        return np.full(self.doc_lengths[d], d)


def _first_documents(split, span_len, max_tokens):
    """Spans as every evaluation chose them before the spread: from the first documents, in order."""
    owners, budget = [], max(1, max_tokens // span_len)
    for d in np.flatnonzero(split.doc_lengths >= span_len + 1):
        for _ in range((split.doc_lengths[d] - 1) // span_len):
            if len(owners) < budget:
                owners.append(int(d))
    return owners


def test_spread_selection_reaches_as_many_documents_as_the_budget_allows():
    lengths = [10 + (d * 389) % 700 for d in range(60)]  # 60 documents, some shorter than a span
    split = _Split(lengths)
    holds = (np.asarray(lengths) - 1) // 64
    long_docs = np.flatnonzero(holds > 0)
    # a budget smaller than the documents: one span from each of evenly spaced documents
    spans, used, skipped, owners = collect_spans(split, 64, 20 * 64, with_documents=True)
    assert len(spans) == 20 == used == len(set(owners.tolist())) and skipped == 60 - len(long_docs)
    assert owners[0] == long_docs[0] and owners[-1] >= long_docs[-3]  # the whole split, not its start
    assert np.all(spans[:, 0] == owners)  # each span comes from its own document
    # a larger budget: every document's first span before any document's second, and so on
    budget = len(long_docs) + 30
    _, used, _, owners = collect_spans(split, 64, budget * 64, with_documents=True)
    taken = np.bincount(owners, minlength=60)[long_docs]
    assert used == len(long_docs) and taken.sum() == budget and np.all(taken >= 1)
    assert taken.max() - taken[holds[long_docs] >= taken.max()].min() <= 1  # rounds: never two ahead
    # "first" is the selection of every evaluation saved before: the first documents filled the budget
    for tokens in (64, 20 * 64, budget * 64):
        first = collect_spans(split, 64, tokens, with_documents=True, selection="first")[3]
        assert first.tolist() == _first_documents(split, 64, tokens)
    assert len(set(_first_documents(split, 64, 20 * 64))) < 20 // 2


def test_the_default_spans_reach_more_documents_than_the_first_ones(runs):
    from dataclasses import replace

    req = EvalRequest(lengths=[1, 4], max_tokens=512, split="val")  # two documents of thousands of tokens
    spread = evaluate(runs["rope"], req, name="sp", progress=False)
    first = evaluate(runs["rope"], replace(req, selection="first"), name="f", progress=False)
    assert spread["target_tokens"] == first["target_tokens"] and spread["selection"] == "spread"
    assert first["documents_used"] == 1 < spread["documents_used"]
    assert first["name"] == "f" and EvalRequest(selection="first").key() != EvalRequest().key()


def test_keys_change_exactly_where_the_targets_changed():
    import hashlib
    from dataclasses import asdict, replace

    from extrapos.evaluate import LEGACY_FIELDS, UNSET_FIELDS, result_key

    later = {*LEGACY_FIELDS, *UNSET_FIELDS}  # fields the requests of that time did not have

    def old_key(req):  # every request's key before protocols and selections existed
        fields = {k: v for k, v in asdict(req).items() if k not in later}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    new = EvalRequest(lengths=[1, 2], max_tokens=128)
    old = replace(new, selection="first")
    assert old.key() == old_key(new) and new.key() != old_key(new)  # the spread changed the targets
    fields = {k: v for k, v in asdict(old).items() if k not in later}
    text = json.dumps({"request": fields, "step": 3, "weights": "ab"}, sort_keys=True)
    assert (
        result_key(old, 3, "ab") == hashlib.sha256(text.encode()).hexdigest()[:16] != result_key(new, 3, "ab")
    )
    assert EvalRequest.from_saved(fields) == old and EvalRequest.from_saved(asdict(new)) == new
    stream = replace(new, protocol="stream", boundary="cross")
    assert len({new.key(), old.key(), stream.key(), replace(stream, boundary="mask").key()}) == 4


def test_results_saved_before_the_spread_are_scored_again_never_reused(runs, capsys, console):
    from dataclasses import replace

    from extrapos.evaluate import LEGACY_FIELDS
    from extrapos.report.stats import same_targets

    run, req = runs["rope"], EvalRequest(lengths=[1, 2], max_tokens=512, split="val")
    # a result as an older extrapos wrote it: the first documents' spans, no protocol fields
    saved = evaluate(run, replace(req, selection="first"), name="older", progress=False)
    for k in LEGACY_FIELDS:
        del saved["request"][k], saved[k]
    (run / "eval" / "older.json").write_text(json.dumps(saved, indent=1))
    # still readable, and reused by the request that scores those targets
    assert evaluate(run, replace(req, selection="first"), name="older", progress=False) == saved
    capsys.readouterr()
    again = evaluate(run, req, name="older", progress=True)
    assert "scored spans from the first held-out documents" in capsys.readouterr().out
    assert again["selection"] == "spread" and again["documents_used"] > saved["documents_used"]
    assert json.loads((run / "eval" / "older.json").read_text())["result_key"] == again["result_key"]
    assert not same_targets(saved, again)  # a report never pairs the two


def test_lengths_that_do_not_split_the_span_are_refused(runs):
    with pytest.raises(UserError, match="every length must divide the longest \\(6\\)"):
        evaluate(runs["rope"], EvalRequest(lengths=[1, 4, 6], max_tokens=128), name="uneven", progress=False)
    # the stream scores each block with its own window: any lengths do
    r = evaluate(
        runs["rope"],
        EvalRequest(lengths=[1, 4, 6], max_tokens=32, protocol="stream"),
        name="u",
        progress=False,
    )
    assert [x["window"] for x in r["results"]] == [16, 64, 96]
