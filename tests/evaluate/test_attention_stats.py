"""Attention diagnostics: the probabilities are the model's attention, the statistics are what their
definitions say (checked against a direct fp64 computation), and `extrapos attention` end to end."""

import json
import math

import numpy as np
import pytest
import torch

from extrapos.attention import attention
from extrapos.evaluate.attention_stats import (
    SINKS,
    STATISTICS,
    Accumulator,
    attention_probabilities,
    block_statistics,
    layer_statistics,
    model_statistics,
)
from extrapos.model import Decoder, model_config
from extrapos.positions.base import FoldedBias
from extrapos.positions.bias import alibi_slopes

T = 20
DOCUMENTS = torch.tensor([[0] * 6 + [1] * 9 + [2] * 5, [3] * 11 + [4] * 9])


def tiny_model(name: str, n_layers: int = 2) -> Decoder:
    torch.manual_seed(0)
    cfg = model_config(
        "cpu-tiny",
        n_layers=n_layers,
        d_model=32,
        n_heads=4,
        vocab_size=64,
        train_length=32,
        positions={"name": name},
    )
    model = Decoder(cfg).double().eval()
    for p in model.parameters():  # weights larger than the init's, so that heads attend unevenly
        p.data.normal_(0, 0.3)
    return model


def captured(model: Decoder, documents=None) -> list[tuple]:
    """Every layer's (q, k, v, bias, documents) of one forward, through the model's capture hook."""
    torch.manual_seed(1)
    tokens = torch.randint(0, 64, (2, T))
    layers = []
    for block in model.blocks:
        block.attn.capture = lambda *a: layers.append(a)
    with torch.no_grad():
        model.hidden_states(tokens, torch.arange(T).expand(2, T), documents=documents)
    for block in model.blocks:
        block.attn.capture = None
    return layers


def direct_weights(q, k, bias_of_pair, documents) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) written out pair by pair in fp64, masks from their definitions."""
    B, H, n, d = q.shape
    p = torch.zeros(B, H, n, n, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(n):
                keys = [j for j in range(i + 1) if documents is None or documents[b, j] == documents[b, i]]
                logits = torch.stack(
                    [q[b, h, i] @ k[b, h, j] / math.sqrt(d) + bias_of_pair(b, h, i, j) for j in keys]
                )
                p[b, h, i, keys] = torch.softmax(logits, 0)
    return p


def pair_bias(name: str, bias):
    """The logit bias of the pair (b, h, i, j), written from the encoding's definition."""
    if name == "rope":  # q and k arrive rotated: the rotation is the whole encoding
        return lambda b, h, i, j: 0.0
    if name == "alibi":  # -m_h (i - j), Press et al.'s slopes
        slopes = alibi_slopes(4)
        return lambda b, h, i, j: -slopes[h] * (i - j)
    # CABLE: -g_i (S_i - S_j) = q_feat_i * (k_feat_j - k_feat_i), g and S read from its description
    assert isinstance(bias, FoldedBias)
    qf, kf = bias.q_feat.expand(2, 4, T), bias.k_feat.expand(2, 4, T)
    return lambda b, h, i, j: qf[b, h, i] * (kf[b, h, j] - kf[b, h, i])


def direct_statistics(p: torch.Tensor, visible: torch.Tensor, first: int = 0) -> dict[str, np.ndarray]:
    """Every statistic's mean over the queries from ``first`` on, per head, from the weights by the
    definitions, in numpy."""
    p, visible = p.numpy(), visible.numpy()
    B, H, n, _ = p.shape
    out = {s: np.zeros(H) for s in STATISTICS}
    norm_count = np.zeros(H)
    for b in range(B):
        for h in range(H):
            for i in range(first, n):
                keys = np.flatnonzero(visible[b, i])
                w = p[b, h, i, keys]
                entropy = -sum(x * math.log(x) for x in w if x > 0)
                out["entropy"][h] += entropy
                if len(keys) >= 2:
                    out["entropy_norm"][h] += entropy / math.log(len(keys))
                    norm_count[h] += 1
                for s in SINKS:
                    out[f"sink{s}"][h] += w[:s].sum()
                dist = np.abs(i - keys)
                out["mean_distance"][h] += (w * dist).sum()
                order = np.argsort(dist, kind="stable")
                cum = np.cumsum(w[order])
                out["median_distance"][h] += dist[order][np.argmax(cum >= 0.5)]
                out["median_weight"][h] += np.sort(w)[(len(w) - 1) // 2] * len(w)  # the lower median
    for s in STATISTICS:
        out[s] /= norm_count if s == "entropy_norm" else B * (n - first)
    return out


def means(acc: Accumulator) -> dict[str, np.ndarray]:
    return {s: np.array(v, dtype=float) for s, v in acc.means().items()}


@pytest.mark.parametrize(
    "name, masked", [("rope", False), ("alibi", False), ("cable", False), ("rope", True), ("alibi", True)]
)
def test_diagnostics_equal_a_direct_computation_from_the_weights(name, masked):
    documents = DOCUMENTS if masked else None
    model = tiny_model(name)
    for layer, (q, k, v, bias, docs) in enumerate(captured(model, documents)):
        weights = direct_weights(q, k, pair_bias(name, bias), documents)
        # the direct weights are the model's attention: they give its output (the fused kernels)
        model_out = attention(q, k, v, bias, causal=True, documents=docs)
        assert torch.allclose(weights @ v, model_out, atol=1e-10)
        probs, visible = attention_probabilities(q, k, bias, causal=True, documents=docs)
        assert torch.allclose(probs, weights, atol=1e-12)
        # blocks of three queries; the second accumulator takes the queries past L_t = 8 only
        every, beyond = layer_statistics(
            q,
            k,
            bias,
            causal=True,
            documents=docs,
            accumulators=[Accumulator(), Accumulator(first_query=8)],
            block_elements=2 * 4 * T * 3,
        )
        visible = visible.expand(2, 1, T, T)[:, 0]
        for acc, first in ((every, 0), (beyond, 8)):
            got, want = means(acc), direct_statistics(weights, visible, first)
            for s in STATISTICS:
                assert np.allclose(got[s], want[s], atol=1e-9), (layer, first, s, got[s], want[s])
        if masked:  # the mask is applied: the first token of the second document attends to itself only
            assert torch.allclose(probs[0, :, 6, 6], torch.ones(4, dtype=torch.float64))


def test_every_encoding_s_weights_give_the_model_s_attention_output():
    """Whatever the bias description (folded, pairwise, logit-reading) or the q/k transform."""
    from extrapos.positions.registry import names

    for name in names():
        for q, k, v, bias, docs in captured(tiny_model(name, n_layers=1), DOCUMENTS):
            probs, _ = attention_probabilities(q, k, bias, causal=True, documents=docs)
            out = attention(q, k, v, bias, causal=True, documents=docs)
            assert torch.allclose(probs @ v.repeat_interleave(4 // v.shape[1], 1), out, atol=1e-10), name


def test_uniform_attention_has_entropy_log_n():
    q = torch.zeros(1, 2, 9, 4, dtype=torch.float64)  # equal logits: uniform over the visible keys
    k = torch.randn(1, 2, 9, 4, dtype=torch.float64)
    probs, visible = attention_probabilities(q, k, causal=True)
    stats = block_statistics(probs, visible, 0, 0)
    n = torch.arange(1, 10, dtype=torch.float64)
    assert torch.allclose(stats["entropy"][0, 0], n.log())
    assert torch.allclose(stats["entropy_norm"][0, 0, 1:], torch.ones(8, dtype=torch.float64))
    assert not stats["valid_norm"][0, 0, 0]  # one visible key: no normalised entropy
    assert torch.allclose(stats["sink1"][0, 0], 1 / n)
    assert torch.allclose(stats["mean_distance"][0, 0], (n - 1) / 2)
    assert torch.allclose(stats["median_weight"][0, 0], torch.ones(9, dtype=torch.float64))
    bidirectional, visible = attention_probabilities(q, k, causal=False)
    entropy = block_statistics(bidirectional, visible, 0, 0)["entropy"]
    assert torch.allclose(entropy, torch.full_like(entropy, math.log(9)))


def test_distance_statistics_on_a_hand_built_matrix():
    # causal: the last of four queries puts 0.1, 0.2, 0.3, 0.4 on keys 0..3, at distances 3, 2, 1, 0
    probs = torch.tensor([[1, 0, 0, 0], [0.6, 0.4, 0, 0], [0.2, 0.2, 0.6, 0], [0.1, 0.2, 0.3, 0.4]])
    visible = torch.ones(4, 4).tril().bool()
    stats = block_statistics(probs[None, None].double(), visible[None, None], 0, 0)
    assert stats["mean_distance"][0, 0].tolist() == pytest.approx(
        [0, 0.6, 0.2 * 2 + 0.2, 3 * 0.1 + 2 * 0.2 + 0.3]
    )
    # cumulative mass from distance 0: query 1 0.4, 1.0 -> 1; query 2 0.6 -> 0; query 3 0.4, 0.7 -> 1
    assert stats["median_distance"][0, 0].tolist() == [0, 1, 0, 1]
    assert stats["sink1"][0, 0].tolist() == pytest.approx([1, 0.6, 0.2, 0.1])
    assert stats["sink4"][0, 0].tolist() == pytest.approx([1, 1, 1, 1])
    # the lower median weight of each row's visible keys, times their number
    assert stats["median_weight"][0, 0].tolist() == pytest.approx([1, 0.4 * 2, 0.2 * 3, 0.2 * 4])
    # bidirectional: query 1 sees keys 0..3 at distances 1, 0, 1, 2: mass 0.1 at 0, 0.5 at 1, 0.4 at 2
    row = torch.tensor([[[[0.3, 0.1, 0.2, 0.4]]]], dtype=torch.float64)
    stats = block_statistics(row, torch.ones(1, 1, 1, 4, dtype=torch.bool), 1, 0)
    assert stats["mean_distance"].item() == pytest.approx(0.3 + 0.2 + 0.8)
    assert stats["median_distance"].item() == 1
    # a document mask: the first visible keys are the document's (keys 2 and 3), not the window's
    visible = torch.tensor([[[[False, False, True, True]]]])
    stats = block_statistics(torch.tensor([[[[0.0, 0.0, 0.25, 0.75]]]]), visible, 3, 0)
    assert stats["sink1"].item() == pytest.approx(0.25) and stats["median_distance"].item() == 0


def test_the_forward_is_unchanged_by_the_capture():
    model = tiny_model("alibi").float()
    tokens, positions = torch.randint(0, 64, (2, T)), torch.arange(T).expand(2, T)
    with torch.no_grad():
        plain = model(tokens, positions)
        accumulators = [[Accumulator(), Accumulator(first_query=T - 4)] for _ in model.blocks]
        model_statistics(model, tokens, positions, accumulators)
        assert all(every.queries == 2 * T and beyond.queries == 2 * 4 for every, beyond in accumulators)
        assert all(b.attn.capture is None for b in model.blocks)  # the hooks are removed afterwards
        assert torch.equal(model(tokens, positions), plain)


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    out = tmp_path_factory.mktemp("attention") / "rope"
    overrides = tiny_overrides(tiny_data, **{"model.train_length": 16, "train.steps": 3})
    train(load_config("cpu/tiny", overrides), out, progress=False)
    return out


def test_attention_cli_end_to_end(tiny_run, capsys):
    from extrapos.cli import main
    from extrapos.evaluate import EvalRequest, evaluate

    args = ["attention", str(tiny_run), "--lengths", "1,2,4", "--max-tokens", "128", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| 4 | 1 |" in out and "median distance" in out
    path = tiny_run / "attention" / "test.json"
    result = json.loads(path.read_text())
    assert path.with_suffix(".png").stat().st_size > 0
    # the evaluator's windows: the same count per length, each query read once
    scored = evaluate(tiny_run, EvalRequest(lengths=[1, 2, 4], max_tokens=128), progress=False)
    for row, ev in zip(result["results"], scored["results"]):
        assert row["windows"] == ev["windows"] and row["queries"] == ev["tokens"]
        # per document: the evaluator's documents, and sums that make the means
        assert row["doc_index"] == ev["doc_index"]
        for layer, docs in zip(row["layers"], row["per_document"]):
            sums, counts = np.array(docs["every"]["median_distance"]), np.array(docs["every"]["queries"])
            assert counts.tolist() == ev["doc_tokens"]
            assert np.allclose(sums.sum(0) / counts.sum(), layer["median_distance"])
        # past L_t = 16: none at ev = 1, the rest of every window beyond
        assert row["queries_beyond"] == row["windows"] * (row["window"] - 16)
        assert all((layer["beyond"] is None) == (row["ev"] == 1) for layer in row["layers"])
        assert len(row["layers"]) == result["n_layers"]
        assert all(len(layer[s]) == result["n_heads"] for layer in row["layers"] for s in STATISTICS)
        # causal windows of k x 16 tokens: a query at position i has a median distance of at most i
        assert all(0 <= d <= row["window"] - 1 for layer in row["layers"] for d in layer["median_distance"])
    before = path.stat().st_mtime_ns
    path.with_suffix(".png").unlink()
    assert main(args) == 0 and path.stat().st_mtime_ns == before  # the same request: reused, not redone
    assert path.with_suffix(".png").is_file()  # ... and its plot drawn again from the saved result
    capsys.readouterr()
    assert main([*args[:-2], "256", "--no-progress"]) == 2  # another request under the same name
    assert "holds different attention diagnostics" in capsys.readouterr().err
    assert json.loads(path.read_text()) == result  # the saved result is untouched


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lengths", "1,x"], "--lengths must be positive numbers"),
        (["--lengths", "0"], "--lengths must be positive numbers"),
        (["--lengths", "0.3"], "0.3"),
        (["--tokens", "1"], "--tokens must be whole numbers"),
        (["--name", "../elsewhere"], "plain file name"),
    ],
)
def test_bad_input_is_one_sentence(tiny_run, capsys, extra, message):
    from extrapos.cli import main

    assert main(["attention", str(tiny_run), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_fractional_and_token_lengths_as_in_eval(tiny_run, capsys):
    from extrapos.cli import main

    args = ["attention", str(tiny_run), "--lengths", "0.5,1", "--tokens", "32", "--max-tokens", "64"]
    assert main([*args, "--name", "fractional", "--no-progress"]) == 0
    result = json.loads((tiny_run / "attention" / "fractional.json").read_text())
    assert [(r["ev"], r["window"]) for r in result["results"]] == [(0.5, 8), (1, 16), (2, 32)]
    assert "| 0.5 | 0 |" in capsys.readouterr().out


def test_a_result_of_older_definitions_is_read_again(tiny_run, monkeypatch, capsys):
    import extrapos.evaluate.attention_stats as attention_stats
    from extrapos.cli import main

    args = [
        "attention",
        str(tiny_run),
        "--lengths",
        "1",
        "--max-tokens",
        "32",
        "--name",
        "older",
        "--no-progress",
    ]
    assert main(args) == 0
    path = tiny_run / "attention" / "older.json"
    monkeypatch.setattr(attention_stats, "VERSION", attention_stats.VERSION + 1)
    assert main(args) == 0  # the same request: neither refused nor reused, but read again
    assert json.loads(path.read_text())["version"] == attention_stats.VERSION


def test_intervals_resample_the_documents_sums():
    from extrapos.evaluate.attention_stats import statistic_interval

    rng = np.random.default_rng(0)
    layers = []
    for _ in range(2):  # two layers, two heads, six documents
        queries = rng.integers(10, 50, size=6).astype(float)
        sums = {s: (rng.random((6, 2)) * queries[:, None]).tolist() for s in STATISTICS}
        layers.append(
            {"every": {"queries": queries.tolist(), "queries_norm": [[q, q] for q in queries], **sums}}
        )
    row = {"doc_index": list(range(6)), "per_document": layers}
    interval, text = statistic_interval(row, "median_distance")
    total = sum(np.sum(layer["every"]["median_distance"]) for layer in layers)
    queries = sum(2 * np.sum(layer["every"]["queries"]) for layer in layers)
    assert (
        interval.estimate == pytest.approx(total / queries)
        and interval.low <= interval.estimate <= interval.high
    )
    assert interval.documents == 6 and f"{interval.estimate:.3f} [" in text
    few = {
        "doc_index": [0, 1],
        "per_document": [{"every": {k: v[:2] for k, v in layers[0]["every"].items()}}],
    }
    assert statistic_interval(few, "median_distance") == (
        None,
        "too few documents for an interval (2; it needs 5)",
    )


def test_a_missing_run_is_one_sentence(tmp_path, capsys):
    from extrapos.cli import main

    assert main(["attention", str(tmp_path / "nothing"), "--no-progress"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_figure_3_histograms_every_query_past_the_base_length_and_pairs_runs(tiny_run, tmp_path, capsys):
    """`extrapos attention PARENT CHILD --base-length L --figure DIR` (the segmented-sequences paper's
    Figure 3): every query past L is counted once per layer and head in the median-weight histogram, whose
    mean matches the recorded mean to within half a bin; a run paired with itself differs by exactly 0;
    --base-length moves 'past L_t'."""
    from extrapos.cli import main

    base = ["--lengths", "1,2", "--max-tokens", "64", "--no-progress", "--base-length", "8"]
    figure = tmp_path / "figure"
    args = [
        "attention",
        str(tiny_run),
        str(tiny_run),
        *base,
        "--labels",
        "parent,same",
        "--figure",
        str(figure),
    ]
    assert main(args) == 0
    result = json.loads((tiny_run / "attention" / "test-base8.json").read_text())
    assert result["train_length"] == 8  # the base length, not the run's 16
    for row in result["results"]:
        hist = row["median_weight_histogram"]
        if row["ev"] == 1:
            assert hist is None and row["queries_beyond"] == 0
            continue
        assert row["queries_beyond"] == row["windows"] * (row["window"] - 8)
        counts = np.asarray(hist["counts"])  # (layers, heads, bins)
        assert counts.shape == (result["n_layers"], result["n_heads"], len(hist["edges"]) - 1)
        assert (counts.sum(-1) == row["queries_beyond"]).all()
        centres = (np.asarray(hist["edges"][:-1]) + np.asarray(hist["edges"][1:])) / 2
        for layer, layer_counts in zip(row["layers"], counts):
            from_hist = (layer_counts * centres).sum(-1) / layer_counts.sum(-1)
            np.testing.assert_allclose(from_hist, layer["beyond"]["median_weight"], atol=0.025 + 1e-9)
    text = (figure / "median-weight.md").read_text()
    assert "| parent |" in text and "| same |" in text and "baseline" in text
    assert "too few documents: 1" in text  # the tiny corpus holds out one document: no interval
    assert (figure / "median-weight.png").stat().st_size > 0
    capsys.readouterr()
    # several runs need a figure; labels must match; a figure folder inside a run is refused
    assert main(["attention", str(tiny_run), str(tiny_run), *base]) == 2
    assert "--figure" in capsys.readouterr().err
    assert main(["attention", str(tiny_run), *base, "--labels", "a,b", "--figure", str(figure)]) == 2
    assert "--labels names 2 runs" in capsys.readouterr().err
    assert main(["attention", str(tiny_run), *base, "--figure", str(tiny_run / "fig")]) == 2
    assert "inside the run" in capsys.readouterr().err
    assert not (tiny_run / "fig").exists()


def test_figure_3_table_pairs_runs_over_the_same_documents():
    """The figure's table: the mean median weight past L_t with its document interval, and each run minus
    the first paired over the same documents (a shift of 0.1 on every document is exactly +0.100)."""
    from extrapos.report.attention_figure import check_comparable, summary_table

    rng = np.random.default_rng(2)
    queries = rng.integers(20, 60, size=6).astype(float)
    base_sums = queries * rng.uniform(0.3, 0.7, size=6)

    def result(shift, docs=range(6)):
        beyond = {"queries": queries.tolist(), "median_weight": [[x] for x in (base_sums + shift * queries)]}
        row = {
            "ev": 2,
            "doc_index": list(docs),
            "per_document": [{"layer": 0, "every": None, "beyond": beyond}],
            "median_weight_histogram": {"edges": [0.0, 1.0, 2.0], "counts": [[[3.0, 1.0]]]},
        }
        return {"train_length": 8, "results": [row]}

    runs = [("parent", result(0.0)), ("chunk", result(0.1)), ("other", result(0.1, docs=range(1, 7)))]
    assert check_comparable(runs) == [2]
    lines = {line.split(" | ")[0][2:]: line for line in summary_table(runs, [2]).splitlines()[2:]}
    assert lines["parent"].endswith("| baseline |")
    assert "+0.100 [+0.100, +0.100]" in lines["chunk"] and "within noise" not in lines["chunk"]
    assert "other documents" in lines["other"]
    with pytest.raises(Exception, match="same --base-length"):
        check_comparable([runs[0], ("x", {**result(0.0), "train_length": 16})])


def test_pictures_and_the_figure_sweep_what_a_killed_writer_abandoned(tiny_run, tmp_path):
    """A result's plot and the Figure 3 folder's picture and table are written whole (``files.save_png``,
    ``atomic_write``); no lock guards them, so the temporaries a killed writer left beside them are swept
    by the next write once a minute old (``files.ABANDONED_SECONDS``), a fresh one (another writer's, still
    writing) kept. Before, the two attention pictures wrote their bytes themselves and swept nothing."""
    import os
    import time

    from extrapos.cli import main
    from extrapos.files import ABANDONED_SECONDS

    figure = tmp_path / "figure"
    figure.mkdir()
    # base length 4: a result of its own, so its plot is drawn by this call
    names = {
        tiny_run / "attention" / "test-base4.png",
        figure / "median-weight.png",
        figure / "median-weight.md",
    }
    old = time.time() - ABANDONED_SECONDS - 5
    abandoned, fresh = [], figure / ".median-weight.png.fresh123.tmp"
    for path in names:
        path.parent.mkdir(parents=True, exist_ok=True)
        left = path.parent / f".{path.name}.killed12.tmp"
        left.write_bytes(b"half a file")
        os.utime(left, (old, old))
        abandoned.append(left)
    fresh.write_bytes(b"being written")
    args = ["attention", str(tiny_run), "--lengths", "1,2", "--max-tokens", "64", "--no-progress"]
    assert main([*args, "--base-length", "4", "--figure", str(figure)]) == 0
    assert all(path.stat().st_size > 0 for path in names)
    assert [p for p in abandoned if p.exists()] == []
    assert fresh.is_file()
