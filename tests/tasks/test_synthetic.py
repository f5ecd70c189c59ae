"""Synthetic tasks: deterministic by seed, exact lengths and answer masks, a prepared directory that
trains through the ordinary loop with the loss on answers only, and an accuracy scorer that gives a
model told the answers 100% and a model told shuffled answers chance."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from extrapos.data import load_tokenizer, open_split, prepare_data
from extrapos.data.synthetic import (
    COPY,
    DIGIT_IDS,
    FILLER_IDS,
    KEY,
    KEY_IDS,
    PAD,
    QUERY,
    SEP,
    VALUE_IDS,
    VOCAB,
    SyntheticSampler,
    SyntheticTask,
    build_tokenizer,
)
from extrapos.errors import UserError
from extrapos.tasks.synthetic import format_synthetic, score_examples, score_synthetic

SPECS = [
    "synthetic:passkey:length=32",
    "synthetic:kv-recall:length=32,pairs=3,queries=2",
    "synthetic:copy:length=32",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [24, 25, 32, 128])
def test_examples_have_the_exact_length_and_answer_mask(spec, n):
    t = SyntheticTask.parse(spec)
    ids, ans = t.example(n, np.random.default_rng([5, n]))
    assert ids.shape == ans.shape == (n + 1,) and ids.dtype == np.int64 and ans.dtype == bool
    assert ans[-1] and not ans[0]  # the last token is always an answer; the first never
    if t.task == "passkey":
        assert ans.sum() == 5 and ans[-5:].all()
        k = int(np.flatnonzero(ids == KEY)[0])
        assert (ids == KEY).sum() == 1 and (ids == QUERY).sum() == 1 and ids[-6] == QUERY
        assert np.array_equal(ids[k + 1 : k + 6], ids[-5:]) and np.isin(ids[-5:], DIGIT_IDS).all()
        assert np.isin(np.delete(ids, list(range(k, k + 6)) + list(range(n - 5, n + 1))), FILLER_IDS).all()
    elif t.task == "kv-recall":
        assert ans.sum() == 2 and np.array_equal(np.flatnonzero(ans), [n - 3, n])
        store = {int(ids[i + 1]): int(ids[i + 2]) for i in np.flatnonzero(ids == KEY)}
        assert (
            len(store) == 3
            and set(store) <= set(KEY_IDS.tolist())
            and set(store.values()) <= set(VALUE_IDS.tolist())
        )
        queries = np.flatnonzero(ids == QUERY)
        assert np.array_equal(queries, [n - 5, n - 2]) and ids[queries[0] + 1] != ids[queries[1] + 1]
        for q in queries:
            assert store[int(ids[q + 1])] == int(ids[q + 2]) and ans[q + 2]
    else:
        m = (n - 1) // 2
        assert ans.sum() == m and ans[-m:].all()
        s = int(np.flatnonzero(ids == SEP)[0])
        assert ids[s - m - 1] == COPY and np.array_equal(ids[s - m : s], ids[s + 1 :]) and s + m == n
        assert (n + 1) % 2 == 0 or ids[0] in FILLER_IDS


@pytest.mark.parametrize("spec", SPECS)
def test_generation_is_deterministic_by_seed(spec):
    t = SyntheticTask.parse(spec)
    a, b = t.split_examples("val"), t.split_examples("val")
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert len(a) == 256 and all(len(x[0]) == 33 for x in a)
    other = SyntheticTask.parse(spec + ",seed=1").split_examples("val")
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, other))
    e1, m1 = t.eval_examples(64, 5)
    e2, _ = t.eval_examples(64, 8)
    assert e1.shape == (5, 65) and np.array_equal(e1, e2[:5]) and m1.shape == e1.shape  # independent of count
    assert not np.array_equal(t.eval_examples(64, 5, seed=9)[0], e1)


def test_training_lengths_are_drawn_up_to_the_training_length():
    t = SyntheticTask.parse("synthetic:copy:length=32,train=400,min_length=8")
    lengths = np.array([len(ids) - 1 for ids, _ in t.split_examples("train")])
    assert lengths.min() == 8 and lengths.max() == 32 and len(np.unique(lengths)) == 25


def test_bad_specs_are_user_errors():
    for spec, match in [
        ("synthetic:sorting", "unknown synthetic task"),
        ("synthetic:copy:len=3", "cannot read"),
        ("synthetic:kv-recall:pairs=2,queries=3", "queries"),
        ("synthetic:passkey:length=8", "at least 12"),
        ("synthetic:copy:train=x", "integer"),
    ]:
        with pytest.raises(UserError, match=match):
            SyntheticTask.parse(spec)
    with pytest.raises(UserError, match="tokenizer to 'synthetic'"):
        prepare_data("synthetic:copy", "bpe:512", None, progress=False)


def test_the_vocabulary_round_trips_through_its_tokenizer():
    tok = build_tokenizer()
    ids, _ = SyntheticTask.parse("synthetic:kv-recall").example(64, np.random.default_rng(0))
    assert tok.vocab_size == len(VOCAB) and tok.eot_id == 0
    assert tok.encode(tok.decode(ids.tolist())) == ids.tolist()


def test_prepared_directory_and_sampler(tmp_path):
    spec = "synthetic:kv-recall:length=32,train=50,val=4,test=4,pairs=2,queries=1"
    d = prepare_data(spec, "synthetic", tmp_path / "kv", progress=False)
    again = prepare_data(spec, "synthetic", tmp_path / "kv", progress=False)
    assert again == d and load_tokenizer(d).hash == build_tokenizer().hash
    split = open_split(d, "train")
    t = SyntheticTask.parse(spec)
    expected = t.split_examples("train")
    assert split.num_docs == 50 and all(np.array_equal(split.doc(i), e[0]) for i, e in enumerate(expected))
    s = SyntheticSampler(split, 32, batch_size=50, seed=3)
    b = s.next_batch()
    assert b.tokens.shape == (50, 32) and b.loss_mask.sum() == 50  # one query: one answer token per example
    for row in range(50):
        buffer = torch.cat([b.tokens[row], b.targets[row, -1:]])  # the row's 33 tokens
        assert torch.equal(b.targets[row, :-1], b.tokens[row, 1:])
        n1 = int((buffer != PAD).sum())  # the example (n + 1 tokens), then padding only
        assert (buffer[n1:] == PAD).all()
        match = [e for e in expected if np.array_equal(e[0], buffer[:n1].numpy())]
        assert match, "every row is one whole example"
        assert torch.equal(b.loss_mask[row, : n1 - 1], torch.from_numpy(match[0][1][1:]))
        assert not b.loss_mask[row, n1 - 1 :].any()
        assert torch.equal(b.positions[row], torch.arange(32))
    state = s.state_dict()
    nxt = s.next_batch()
    s2 = SyntheticSampler(split, 32, batch_size=50, seed=3)
    s2.load_state_dict(state)
    assert torch.equal(s2.next_batch().tokens, nxt.tokens)
    with pytest.raises(UserError, match="No example"):
        SyntheticSampler(split, 4, batch_size=1)


# ---- the scorer -------------------------------------------------------------------------------------


class AnswerStub(nn.Module):
    """Predicts, for a known example, its true next token (``told`` the examples); otherwise nothing.

    ``shuffle``: it is told the examples of other rows, so its answers are right only by chance.
    """

    def __init__(self, ids: np.ndarray, shuffle: bool = False):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1), requires_grad=False)
        order = np.random.default_rng(0).permutation(len(ids)) if shuffle else np.arange(len(ids))
        self.ids, self.told = ids, ids[order]

    def hidden_states(self, tokens, positions, cache=None):
        out = torch.zeros(*tokens.shape, len(VOCAB))
        for r in range(tokens.shape[0]):
            prefix = tokens[r].numpy().tobytes()
            row = next(i for i, e in enumerate(self.ids) if e[: tokens.shape[1]].tobytes() == prefix)
            out[
                r, torch.arange(tokens.shape[1]), torch.from_numpy(self.told[row, 1 : tokens.shape[1] + 1])
            ] = 10.0
        return out

    def logits(self, h):
        return h


@pytest.mark.parametrize("spec", SPECS)
def test_scorer_gives_a_told_model_100_and_a_shuffled_one_chance(spec):
    t = SyntheticTask.parse(spec)
    ids, ans = t.eval_examples(64, 200)
    r = score_examples(AnswerStub(ids), ids, ans, batch_tokens=640)
    assert r["token_accuracy"] == 1.0 and r["exact_match"] == 1.0 and r["examples"] == 200
    assert r["answer_tokens"] == int(ans[:, 1:].sum())
    assert r["answer_loss"] == pytest.approx(np.log1p((len(VOCAB) - 1) * np.exp(-10.0)), rel=1e-4)
    s = score_examples(AnswerStub(ids, shuffle=True), ids, ans, batch_tokens=640)
    chance = {"passkey": 1 / 10, "kv-recall": 1 / 16, "copy": 1 / 32}[t.task]
    assert abs(s["token_accuracy"] - chance) < 0.04 and s["exact_match"] < 0.02


def test_train_on_a_synthetic_corpus_and_score_beyond_the_training_length(tmp_path):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    spec = "synthetic:passkey:length=16,train=64,val=8,test=8,digits=2"
    cfg = load_config(
        "cpu/tiny",
        [
            f'data.corpus="{spec}"',
            'data.tokenizer="synthetic"',
            'data.sampler="synthetic"',
            f'data.dir="{prepare_data(spec, "synthetic", tmp_path / "d", progress=False)}"',
            "model.vocab_size=65",
            "model.train_length=16",
            "train.steps=3",
            "train.batch_size=8",
            "train.threads=1",
        ],
    )
    train(cfg, tmp_path / "run", progress=False)
    r = score_synthetic(tmp_path / "run", lengths=[1, 4], examples=16)
    assert (
        json.loads((tmp_path / "run" / "eval" / "synthetic-passkey.json").read_text())["results"]
        == r["results"]
    )
    assert [x["length"] for x in r["results"]] == [16, 64]
    assert all(x["answer_tokens"] == 32 and 0 <= x["token_accuracy"] <= 1 for x in r["results"])
    assert "| 4 | 64 |" in format_synthetic(r)


def test_validation_loss_of_a_synthetic_run_counts_the_answers_as_training_does(tmp_path, monkeypatch):
    """A run on a synthetic corpus trains on whole examples with the loss on their answers; its validation
    loss reads the validation split the same way. Windows across examples would score every token, the
    random haystack too: a RULER run then printed training loss 1.85 beside validation loss 8.75."""
    from extrapos.model import Decoder
    from extrapos.run.config import load_config
    from extrapos.training import trainer

    spec = "synthetic:kv-recall:length=32,train=50,val=12,test=4,pairs=2,queries=1"
    d = prepare_data(spec, "synthetic", tmp_path / "kv", progress=False)
    cfg = load_config(
        "cpu/tiny",
        [
            f'data.corpus="{spec}"',
            'data.tokenizer="synthetic"',  # data.sampler left "contiguous": the corpus says it is a task
            f'data.dir="{d}"',
            f"model.vocab_size={len(VOCAB)}",
            "model.train_length=32",
            "train.batch_size=4",
        ],
    )
    batches = []
    scored = trainer.masked_loss_sum
    monkeypatch.setattr(trainer, "masked_loss_sum", lambda logits, b: batches.append(b) or scored(logits, b))
    torch.manual_seed(0)
    loss = trainer.validation_loss(Decoder(cfg.model), cfg, open_split(d, "val"), torch.device("cpu"))
    assert batches and loss is not None and np.isfinite(loss)
    examples = [e[0] for e in SyntheticTask.parse(spec).split_examples("val")]
    for b in batches:
        assert b.loss_mask.sum(1).tolist() == [1] * b.tokens.shape[0]  # one query: one answer token a row
        for row in range(b.tokens.shape[0]):  # every row is one whole example, from its first token
            n = int((b.tokens[row] != PAD).sum())
            assert any(np.array_equal(b.tokens[row, :n].numpy(), e[:n]) for e in examples)
