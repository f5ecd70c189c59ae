"""chunk_targets: a chunk segment's last token predicts its original next token (default) or the next
segment's first token ("concatenated"); the default batches are the ones the sampler always produced."""

from __future__ import annotations

import pytest
import torch
from data_helpers import numbered_docs

from extrapos.data.segmented import SegmentedSampler
from extrapos.errors import UserError
from extrapos.run.config import load_config

L_T, L_E = 8, 32
LENGTHS = [100, 20, 65, 33, 200]


@pytest.fixture
def split(synthetic_split):
    return synthetic_split(numbered_docs(LENGTHS))


def test_default_targets_are_the_original_next_tokens(split):
    default = SegmentedSampler(split, "chunk", L_T, L_E, batch_size=12, alpha=0.25, seed=3)
    explicit = SegmentedSampler(
        split, "chunk", L_T, L_E, batch_size=12, alpha=0.25, seed=3, chunk_targets="original"
    )
    a, b = default.next_batch(), explicit.next_batch()
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert torch.equal(a.targets, a.tokens + 1)  # numbered documents: the next token is token + 1
    assert "chunk_targets" not in default.state_dict()  # checkpoints of default runs are unchanged


def test_concatenated_targets_continue_the_concatenated_example(split):
    orig = SegmentedSampler(split, "chunk", L_T, L_E, batch_size=12, alpha=0.25, seed=3)
    cat = SegmentedSampler(
        split, "chunk", L_T, L_E, batch_size=12, alpha=0.25, seed=3, chunk_targets="concatenated"
    )
    a, b = orig.next_batch(), cat.next_batch()
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.positions, b.positions)
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:]) and torch.equal(b.targets[:, -1], a.targets[:, -1])
    gaps = b.positions[:, 1:] - b.positions[:, :-1] > 1  # segment ends whose next segment does not touch
    assert gaps.any()
    assert torch.equal(a.targets[:, :-1] != b.targets[:, :-1], gaps)  # exactly those targets differ
    with pytest.raises(UserError, match="chunk_targets"):
        orig.load_state_dict(cat.state_dict())


def test_chunk_targets_is_checked(split):
    with pytest.raises(UserError, match="chunk only"):
        SegmentedSampler(split, "prefix", L_T, L_E, batch_size=4, alpha=0.5, chunk_targets="concatenated")
    with pytest.raises(UserError, match="chunk_targets"):
        SegmentedSampler(split, "chunk", L_T, L_E, batch_size=4, chunk_targets="next")
    with pytest.raises(UserError, match="data.chunk_targets"):
        load_config("cpu/tiny", ["data.chunk_targets=shuffled"])
    with pytest.raises(UserError, match="unless data.sampler = chunk"):
        load_config("cpu/tiny", ["data.chunk_targets=concatenated"])
    wired = load_config(
        "cpu/tiny", ["data.chunk_targets=concatenated", "data.sampler=chunk", "data.extended_length=128"]
    )
    assert wired.data.chunk_targets == "concatenated"
    assert "chunk_targets" not in load_config("cpu/tiny").to_toml()  # saved configs of older runs still match
    assert load_config("cpu/tiny", ["data.chunk_targets=original"]).data.chunk_targets == "original"


def test_training_builds_the_sampler_the_config_asks_for(split):
    from extrapos.run.runtime import build_sampler

    cfg = load_config(
        None,
        [
            "model.train_length=8",
            "data.sampler=chunk",
            "data.extended_length=32",
            "data.chunk_targets=concatenated",
        ],
    )
    assert build_sampler(cfg, split, 2, seed=0).chunk_targets == "concatenated"
    cfg.data.chunk_targets = None
    assert build_sampler(cfg, split, 2, seed=0).chunk_targets == "original"
