"""Packed windows on documents shorter than the window: every token once per epoch, document numbers,
restarted positions, the share of the split a sampler reaches, and resuming older packed streams."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from data_helpers import numbered_docs

from extrapos.data import ContiguousSampler
from extrapos.errors import UserError

# web-like: most documents are shorter than the window of 16
SHORT = [5, 3, 11, 7, 2, 9, 4, 13, 6, 8, 1, 10, 3, 7, 5]


def one_epoch(sampler) -> list:
    batches, seen = [], 0
    while seen < sampler.num_items:
        batches.append(sampler.next_batch())
        seen += len(batches[-1].tokens)
    assert seen == sampler.num_items  # batch size divides the epoch in these tests
    return batches


@pytest.mark.parametrize("batch_size", [1, 7])
@pytest.mark.parametrize("mask, positions", [(False, "continue"), (True, "restart"), (True, "continue")])
def test_packed_epoch_predicts_every_token_exactly_once(synthetic_split, batch_size, mask, positions):
    docs = numbered_docs(SHORT, start=10)  # every token id is unique; the end-of-text is 0
    split = synthetic_split(docs, eot_id=0)
    stream_length = sum(SHORT) + len(SHORT)
    sampler = ContiguousSampler(
        split, 16, batch_size, seed=3, packed=True, document_mask=mask, document_positions=positions
    )
    assert sampler.num_items == -(-(stream_length - 1) // 16) == 7
    counted = Counter()
    for batch in one_epoch(sampler):
        counted.update(batch.targets[batch.loss_mask].tolist())
        # a padded (masked) target is the end-of-text filler, never text
        assert (batch.targets[~batch.loss_mask] == 0).all()
    text = [t for d in docs for t in d.tolist()]
    assert counted.pop(0) == len(SHORT)  # every document's end is predicted once
    assert sorted(counted) == text[1:] and set(counted.values()) == {1}  # the stream's first is context
    assert sampler.coverage() == (len(text) - 1, len(text))


def test_unpacked_windows_on_short_documents_reach_little(synthetic_split):
    split = synthetic_split(numbered_docs(SHORT, start=10))
    sampler = ContiguousSampler(split, 8, 1, packed=False)
    reached, total = sampler.coverage()
    # only documents of at least 9 tokens hold a window: 11, 9, 13 and 10 tokens, one window of 8 each
    assert (reached, total) == (4 * 8, sum(SHORT))


def test_document_numbers_and_restarted_positions(synthetic_split):
    docs = numbered_docs([3, 5, 2], start=10)  # stream: 10 11 12 E 13 14 15 16 17 E 18 19 E
    split = synthetic_split(docs, eot_id=0)
    sampler = ContiguousSampler(split, 12, 1, packed=True, document_mask=True, document_positions="restart")
    assert sampler.num_items == 1
    batch = sampler.next_batch()
    assert batch.tokens[0].tolist() == [10, 11, 12, 0, 13, 14, 15, 16, 17, 0, 18, 19]
    # the end-of-text that ends a document opens the next one's segment, as a beginning-of-text token
    assert batch.documents[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    assert batch.positions[0].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert batch.loss_mask.all()

    continuing = ContiguousSampler(split, 12, 1, packed=True, document_mask=True).next_batch()
    assert continuing.documents[0].tolist() == batch.documents[0].tolist()
    assert continuing.positions[0].tolist() == list(range(12))
    unmasked = ContiguousSampler(split, 12, 1, packed=True, document_positions="restart").next_batch()
    assert unmasked.documents is None and unmasked.positions[0].tolist() == batch.positions[0].tolist()


def test_padded_last_window(synthetic_split):
    docs = numbered_docs([3, 5, 2], start=10)  # 13 stream tokens: 12 targets, windows of 5 -> 5, 5, 2
    split = synthetic_split(docs, eot_id=0)
    sampler = ContiguousSampler(split, 5, 3, packed=True, document_mask=True, document_positions="restart")
    batch = sampler.next_batch()
    last = int(torch.argmin(batch.loss_mask.sum(1)))
    assert batch.loss_mask[last].tolist() == [True, True, False, False, False]
    assert batch.tokens[last].tolist() == [18, 19, 0, 0, 0]
    # every padding token is a document of its own: real tokens never see it, it sees nothing real
    assert batch.documents[last].tolist() == [0, 0, 1, 2, 3]


def test_rows_are_the_same_windows_whatever_the_masking(synthetic_split):
    split = synthetic_split(numbered_docs(SHORT, start=10), eot_id=0)
    plain = ContiguousSampler(split, 16, 2, seed=1, packed=True)
    masked = ContiguousSampler(
        split, 16, 2, seed=1, packed=True, document_mask=True, document_positions="restart"
    )
    for _ in range(3):
        a, b = plain.next_batch(), masked.next_batch()
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
        assert torch.equal(a.loss_mask, b.loss_mask)


def test_resume_of_a_stream_saved_before_padded_windows(synthetic_split):
    docs = numbered_docs(SHORT, start=10)
    split = synthetic_split(docs, eot_id=0)
    stream_length = sum(SHORT) + len(SHORT)
    sampler = ContiguousSampler(split, 16, 1, seed=2, packed=True)
    legacy = {
        k: v
        for k, v in sampler.state_dict().items()
        if k not in ("tail", "document_mask", "document_positions")
    }
    legacy["num_items"] = (stream_length - 1) // 16  # what the older sampler counted
    resumed = ContiguousSampler(split, 16, 1, seed=2, packed=True)
    resumed.load_state_dict(legacy)
    assert resumed.num_items == legacy["num_items"] == 6
    # the older stream's order: a permutation of 6 windows drawn with (seed, epoch)
    expected = np.random.default_rng([2, 0]).permutation(6)[0] * 16
    assert resumed.next_batch().tokens[0, 0].item() == _stream(docs)[expected]


def test_resume_refuses_other_document_settings(synthetic_split):
    split = synthetic_split(numbered_docs(SHORT, start=10), eot_id=0)
    state = ContiguousSampler(split, 16, 1, packed=True, document_mask=True).state_dict()
    with pytest.raises(UserError, match="document_mask"):
        ContiguousSampler(split, 16, 1, packed=True).load_state_dict(state)


def test_document_options_need_packed_windows(synthetic_split):
    split = synthetic_split(numbered_docs(SHORT, start=10), eot_id=0)
    with pytest.raises(UserError, match="packed"):
        ContiguousSampler(split, 8, 1, document_mask=True)
    with pytest.raises(UserError, match="restart"):
        ContiguousSampler(split, 8, 1, packed=True, document_positions="reset")


def _stream(docs) -> list[int]:
    return [t for d in docs for t in [*d.tolist(), 0]]
