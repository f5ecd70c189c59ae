"""Masked language modelling: the BERT masking statistics, determinism, special tokens, config checks,
an encoder trained end to end and evaluated at 1..4 x L_t."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from extrapos.data.batch import Batch
from extrapos.data.mlm import (
    MLMSampler,
    SpecialTokens,
    encoder_special_tokens,
    mask_batch,
    mask_tokens,
    rng_for,
)
from extrapos.errors import UserError
from extrapos.run.config import load_config
from tests.conftest import tiny_overrides

SPECIALS = SpecialTokens(cls=3, sep=4, mask=2, pad=1, eot=0)
V = 1000


def test_masking_proportions_are_bert_s():
    tokens = np.random.default_rng(1).integers(5, V, size=(64, 4096))
    tokens[:, ::50] = 0  # end-of-text tokens are never selected
    out, selected = mask_tokens(tokens, rng_for((0, 0)), SPECIALS, V)
    eligible = tokens != 0
    assert not selected[~eligible].any()
    rate = selected.sum() / eligible.sum()
    assert abs(rate - 0.15) < 0.003
    masked = (out == SPECIALS.mask) & selected
    kept = (out == tokens) & selected
    changed = selected & ~masked & ~kept
    n = selected.sum()
    assert abs(masked.sum() / n - 0.8) < 0.01
    # a random replacement equal to the original counts as kept: expected 0.1 + 0.1 / (V - 5)
    assert abs(kept.sum() / n - 0.1) < 0.01 and abs(changed.sum() / n - 0.1) < 0.01
    assert (out[~selected] == tokens[~selected]).all()
    assert not np.isin(out[changed], SPECIALS.ids).any() and out.max() < V  # random ids: never special


def test_mask_rate_sets_the_selected_share_and_keeps_the_80_10_10_split(tiny_data):
    from extrapos.data import ContiguousSampler, open_split

    tokens = np.random.default_rng(3).integers(5, V, size=(64, 4096))
    out, selected = mask_tokens(tokens, rng_for((0, 0)), SPECIALS, V, rate=0.4)
    assert abs(selected.mean() - 0.4) < 0.003
    assert abs(((out == SPECIALS.mask) & selected).sum() / selected.sum() - 0.8) < 0.01
    # the trainer's sampler carries the rate into every batch
    split = open_split(tiny_data, "train")
    share = {
        rate: float(
            torch.stack(
                [
                    MLMSampler(ContiguousSampler(split, 64, 8, seed=0), SPECIALS, 512, rate)
                    .next_batch()
                    .loss_mask
                ]
            )
            .float()
            .mean()
        )
        for rate in (0.15, 0.4)
    }
    assert share[0.4] > share[0.15] + 0.15, share


def test_masking_is_a_pure_function_of_the_key():
    tokens = np.random.default_rng(2).integers(5, V, size=(4, 256))
    a = mask_tokens(tokens, rng_for((7, 0, 3)), SPECIALS, V)
    b = mask_tokens(tokens, rng_for((7, 0, 3)), SPECIALS, V)
    c = mask_tokens(tokens, rng_for((7, 0, 4)), SPECIALS, V)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    assert (a[1] != c[1]).any()


def test_mask_batch_targets_are_the_original_tokens():
    tokens = torch.randint(5, V, (2, 64))
    batch = Batch(
        tokens, torch.zeros_like(tokens), torch.arange(64).expand(2, -1), torch.ones(2, 64, dtype=torch.bool)
    )
    out = mask_batch(batch, (0, 0, 0), SPECIALS, V)
    assert torch.equal(out.targets, tokens) and torch.equal(out.positions, batch.positions)
    assert out.num_tokens == int(out.loss_mask.sum()) > 0
    assert (out.tokens[out.loss_mask] == SPECIALS.mask).any()


def test_mlm_sampler_resumes_exactly(tiny_data):
    from extrapos.data import ContiguousSampler, open_split

    split = open_split(tiny_data, "train")

    def sampler():
        return MLMSampler(ContiguousSampler(split, 32, 4, seed=3), SPECIALS, 512)

    a = sampler()
    first = [a.next_batch() for _ in range(3)]
    state = json.loads(json.dumps(a.state_dict()))
    later = [a.next_batch() for _ in range(2)]
    b = sampler()
    b.load_state_dict(state)
    again = [b.next_batch() for _ in range(2)]
    for x, y in zip(later, again):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.loss_mask, y.loss_mask)
    assert not torch.equal(first[0].loss_mask, first[1].loss_mask)


def test_special_tokens_are_found_or_added(tiny_data):
    from extrapos.data import load_tokenizer

    tok = load_tokenizer(tiny_data)
    before = tok.vocab_size
    sp = encoder_special_tokens(tok)
    assert sp.mask == tok.token_id("<|mask|>") == 2 and sp.pad == 1  # a trained bpe:N has them
    assert {sp.cls, sp.sep} == {before, before + 1} and tok.vocab_size == before + 2
    assert encoder_special_tokens(tok) == sp and tok.vocab_size == before + 2  # adding twice changes nothing


@pytest.mark.parametrize(
    "overrides, words",
    [
        (['model.size="cpu-encoder"'], "objective"),
        (['train.objective="mlm"'], "objective"),
        (['train.objective="clm"'], "train.objective"),
        (['model.size="cpu-encoder"', 'train.objective="mlm"', 'model.positions="cope"'], "cannot be"),
        (['model.size="cpu-encoder"', 'train.objective="mlm"', 'model.positions="xpos"'], "cannot be"),
        (['model.size="cpu-encoder"', 'train.objective="mlm"', "train.mask_rate=1.0"], "train.mask_rate"),
        (["train.mask_rate=0.4"], "objective mlm only"),
    ],
)
def test_user_mistakes_are_one_sentence(overrides, words):
    with pytest.raises(UserError, match=words):
        load_config("cpu/tiny", overrides)


def test_encoder_trains_end_to_end_and_evaluates_at_longer_lengths(tiny_data, tmp_path):
    from extrapos.evaluate import EvalRequest
    from extrapos.evaluate.mlm import evaluate_mlm, format_mlm_result
    from extrapos.training.trainer import train

    extra = {
        "model.size": '"cpu-encoder"',
        "model.n_layers": 2,
        "model.d_model": 64,
        "model.vocab_size": 520,
        "train.objective": '"mlm"',
        "model.positions": '"alibi"',
        "train.steps": 25,
    }
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **extra))
    result = train(cfg, tmp_path / "run", progress=False)
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    assert losses[-1] < losses[0] - 0.5, losses  # it learns
    assert result.val_loss is not None and np.isfinite(result.val_loss)
    res = evaluate_mlm(tmp_path / "run", EvalRequest(lengths=[1, 2, 4], max_tokens=1024), progress=False)
    rows = res["results"]
    assert [r["ev"] for r in rows] == [1, 2, 4]
    assert len({r["masked_tokens"] for r in rows}) == 1 and rows[0]["masked_tokens"] > 50  # the same targets
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert res["unigram_loss"] > 0 and "unigram" in format_mlm_result(res)
    # the library refuses the stream protocol as `extrapos eval` and a sweep do, before anything is written
    before = sorted((tmp_path / "run" / "eval").iterdir())
    with pytest.raises(UserError, match="protocol 'documents'"):
        evaluate_mlm(tmp_path / "run", EvalRequest(lengths=[1, 2], protocol="stream"), progress=False)
    assert sorted((tmp_path / "run" / "eval").iterdir()) == before


def test_unigram_reference_is_the_training_frequencies_cross_entropy(tiny_data):
    import math
    from collections import Counter
    from types import SimpleNamespace

    from extrapos.data import load_tokenizer, open_split
    from extrapos.evaluate.mlm import unigram_loss

    tok = load_tokenizer(tiny_data)
    specials = encoder_special_tokens(tok)
    train = [int(t) for t in open_split(tiny_data, "train").tokens]
    targets = np.array([t for t in train[:300] if t not in specials.ids] + [tok.vocab_size - 1])
    counts = Counter(t for t in train if t not in specials.ids)  # add-one over every id of the vocabulary
    total = sum(counts.values()) + tok.vocab_size
    expected = -sum(math.log((counts[t] + 1) / total) for t in targets.tolist()) / len(targets)
    run = SimpleNamespace(data_dir=tiny_data, tokenizer=tok)
    assert unigram_loss(run, targets, specials) == pytest.approx(expected, rel=1e-12)
    assert unigram_loss(SimpleNamespace(data_dir=None, tokenizer=tok), targets, specials) is None


def test_vocab_too_small_for_the_added_tokens_is_a_user_error(tiny_data, tmp_path):
    from extrapos.training.trainer import train

    extra = {
        "model.size": '"cpu-encoder"',
        "model.n_layers": 1,
        "model.d_model": 32,
        "train.objective": '"mlm"',
        "train.steps": 1,
    }
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **extra))  # vocab 512: no room for [CLS], [SEP]
    with pytest.raises(UserError, match="vocab_size=514"):
        train(cfg, tmp_path / "run", progress=False)
