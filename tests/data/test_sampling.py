"""ContiguousSampler: windows inside documents, shuffling, sharding, packing and mid-epoch resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from data_helpers import numbered_docs

from extrapos.data import ContiguousSampler, open_split
from extrapos.data.sampling import gather, windows_in_documents
from extrapos.errors import UserError

LENGTHS = [5, 9, 17, 3, 40]  # with seq_len 4: 1 + 2 + 4 + 0 + 9 = 16 windows


def epoch_of_windows(sampler):
    """The first token of every window of one epoch (unique with numbered documents).

    Batches must divide the epoch: a batch running across the epoch end would mix two epochs."""
    firsts = []
    while len(firsts) < sampler.windows_per_epoch:
        firsts += sampler.next_batch().tokens[:, 0].tolist()
    return firsts[: sampler.windows_per_epoch]


def test_windows_in_documents_helper():
    doc, start = windows_in_documents(np.array([5, 9, 17, 3]), span=5, stride=4)
    assert doc.tolist() == [0, 1, 1, 2, 2, 2, 2] and start.tolist() == [0, 0, 4, 0, 4, 8, 12]
    doc, start = windows_in_documents(np.array([8, 7, 16]), span=8)  # L_e windows for segmented training
    assert doc.tolist() == [0, 2, 2] and start.tolist() == [0, 0, 8]
    assert gather(np.arange(100), np.array([3, 50]), 4).tolist() == [[3, 4, 5, 6], [50, 51, 52, 53]]


def test_windows_stay_inside_one_document(synthetic_split):
    docs = numbered_docs(LENGTHS)
    split = synthetic_split(docs)
    sampler = ContiguousSampler(split, seq_len=4, batch_size=3, seed=0)
    assert sampler.windows_per_epoch == sum((n - 1) // 4 for n in LENGTHS) == 16
    doc_of_token = {int(t): d for d, doc in enumerate(docs) for t in doc}
    for _ in range(6):
        batch = sampler.next_batch()
        assert batch.tokens.shape == batch.targets.shape == batch.positions.shape == (3, 4)
        assert batch.tokens.dtype == batch.targets.dtype == batch.positions.dtype == torch.int64
        assert batch.loss_mask.dtype == torch.bool and bool(batch.loss_mask.all())
        assert torch.equal(batch.positions, torch.arange(4).expand(3, 4))
        for tokens, targets in zip(batch.tokens.tolist(), batch.targets.tolist()):
            window = tokens + targets[-1:]
            assert window == list(range(window[0], window[0] + 5))  # contiguous
            assert len({doc_of_token[t] for t in window}) == 1  # one document
            assert targets == window[1:]
            start_in_doc = window[0] - int(docs[doc_of_token[window[0]]][0])
            assert start_in_doc % 4 == 0  # non-overlapping windows from the document start


def test_one_epoch_visits_every_window_once_and_reshuffles(synthetic_split):
    sampler = ContiguousSampler(synthetic_split(numbered_docs(LENGTHS)), seq_len=4, batch_size=4, seed=3)
    first = epoch_of_windows(sampler)
    assert sorted(first) == sorted(set(first)) and len(first) == 16
    second = epoch_of_windows(sampler)
    assert sorted(second) == sorted(first) and second != first
    assert sampler.epoch == 2
    sampler.batch_size = 5  # a batch that runs across the epoch end takes the next epoch's first windows
    stream = sampler.next_batch().tokens[:, 0].tolist() + sampler.next_batch().tokens[:, 0].tolist()
    assert sampler.epoch == 2 and len(stream) == 10
    for _ in range(2):
        sampler.next_batch()
    assert sampler.epoch == 3


def test_same_seed_same_stream_other_seed_other_stream(synthetic_split):
    split = synthetic_split(numbered_docs(LENGTHS))
    a, b, c = (ContiguousSampler(split, 4, 8, seed=s) for s in (7, 7, 8))
    for _ in range(5):
        batch_a, batch_b = a.next_batch(), b.next_batch()
        assert torch.equal(batch_a.tokens, batch_b.tokens)
    assert epoch_of_windows(ContiguousSampler(split, 4, 8, seed=7)) != epoch_of_windows(c)


def test_ranks_get_disjoint_equal_shares(synthetic_split):
    split = synthetic_split(numbered_docs(LENGTHS))
    shares = [
        epoch_of_windows(ContiguousSampler(split, 4, 2, seed=1, rank=r, world_size=3)) for r in range(3)
    ]
    assert [len(s) for s in shares] == [5, 5, 5]  # 16 windows: 5 per rank from the first 15 of the stream
    flat = [t for s in shares for t in s]
    assert len(set(flat)) == 15 and set(flat) <= set(epoch_of_windows(ContiguousSampler(split, 4, 2, seed=1)))
    with pytest.raises(UserError, match="outside the world size"):
        ContiguousSampler(split, 4, 2, rank=3, world_size=3)


ODD = [*LENGTHS, 5]  # 17 windows: an epoch that 2 ranks cannot split evenly


def global_batches(samplers, n):
    """First tokens of ``n`` global batches of these rank samplers, ranks interleaved as they take them."""
    out = []
    for _ in range(n):
        per_rank = [s.next_batch().tokens[:, 0].tolist() for s in samplers]
        out.append([t for row in zip(*per_rank) for t in row])
    return out


def test_two_ranks_of_b_read_the_batches_of_one_rank_of_2b(synthetic_split):
    split = synthetic_split(numbered_docs(ODD))
    one = ContiguousSampler(split, 4, 6, seed=3)
    want = [one.next_batch().tokens[:, 0].tolist() for _ in range(9)]  # 54 windows: across 3 epoch ends
    two = [ContiguousSampler(split, 4, 3, seed=3, rank=r, world_size=2) for r in range(2)]
    assert global_batches(two, 9) == want
    assert one.epoch == two[0].epoch == two[1].epoch == 3


def test_a_stream_position_resumes_on_another_world_size(synthetic_split):
    """2 ranks -> 1 -> 2 ranks, a global batch of 2 windows throughout: the windows of one unbroken stream."""
    split = synthetic_split(numbered_docs(ODD))
    reference = ContiguousSampler(split, 4, 2, seed=4)
    want = [reference.next_batch().tokens[:, 0].tolist() for _ in range(14)]
    two = [ContiguousSampler(split, 4, 1, seed=4, rank=r, world_size=2) for r in range(2)]
    got = global_batches(two, 5)
    state = json.loads(json.dumps(two[0].state_dict()))
    assert state == two[1].state_dict() and state["position"] == 10  # every rank holds the global position
    one = ContiguousSampler(split, 4, 2, seed=4)
    one.load_state_dict(state)
    got += [one.next_batch().tokens[:, 0].tolist() for _ in range(5)]  # runs across the epoch end
    two = [ContiguousSampler(split, 4, 1, seed=4, rank=r, world_size=2) for r in range(2)]
    for s in two:
        s.load_state_dict(one.state_dict())
    got += global_batches(two, 4)
    assert got == want


def test_a_state_saved_with_per_rank_positions_continues_its_epoch(synthetic_split):
    split = synthetic_split(numbered_docs(LENGTHS))
    ranks = [ContiguousSampler(split, 4, 2, seed=5, rank=r, world_size=2) for r in range(2)]
    for s in ranks:
        s.next_batch()
        s.next_batch()
    old = {k: v for k, v in ranks[1].state_dict().items() if k != "stream"}
    old["position"] = 4  # what each rank had taken, as states recorded it before positions were global
    resumed = ContiguousSampler(split, 4, 2, seed=5, rank=1, world_size=2)
    resumed.load_state_dict(old)
    assert torch.equal(resumed.next_batch().tokens, ranks[1].next_batch().tokens)


def test_resume_mid_epoch_continues_the_same_stream(synthetic_split):
    split = synthetic_split(numbered_docs(LENGTHS))
    uninterrupted = ContiguousSampler(split, 4, 3, seed=5)
    expected = [uninterrupted.next_batch().tokens for _ in range(15)]  # crosses two epoch ends
    first = ContiguousSampler(split, 4, 3, seed=5)
    for _ in range(4):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    assert state["position"] == 12 and state["epoch"] == 0
    resumed = ContiguousSampler(split, 4, 3, seed=5)
    resumed.load_state_dict(state)
    for want in expected[4:]:
        assert torch.equal(resumed.next_batch().tokens, want)


def test_resume_with_other_settings_is_refused(synthetic_split):
    split = synthetic_split(numbered_docs(LENGTHS))
    state = ContiguousSampler(split, 4, 3, seed=5).state_dict()
    with pytest.raises(UserError, match="seq_len"):
        ContiguousSampler(split, 8, 3, seed=5).load_state_dict(state)
    with pytest.raises(UserError, match="seed"):
        ContiguousSampler(split, 4, 3, seed=6).load_state_dict(state)
    with pytest.raises(UserError, match="packed"):
        ContiguousSampler(split, 4, 3, seed=5, packed=True).load_state_dict(state)


def test_packed_windows_cross_documents_with_end_of_text(synthetic_split):
    docs = numbered_docs([3, 5, 2], start=10)  # packed stream: 10 11 12 EOT 13 ... 17 EOT 18 19 EOT
    split = synthetic_split(docs, eot_id=0)
    stream = [t for d in docs for t in [*d.tolist(), 0]]
    sampler = ContiguousSampler(split, seq_len=4, batch_size=1, packed=True)
    assert sampler.windows_per_epoch == (len(stream) - 1) // 4 == 3
    windows = set()
    for _ in range(3):
        batch = sampler.next_batch()
        window = batch.tokens[0].tolist() + batch.targets[0, -1:].tolist()
        windows.add(tuple(window))
        assert batch.targets[0].tolist() == window[1:]
    assert windows == {tuple(stream[i : i + 5]) for i in (0, 4, 8)}


def test_sequence_longer_than_every_document_is_a_user_error(synthetic_split):
    with pytest.raises(UserError, match="No window of 41 tokens fits"):
        ContiguousSampler(synthetic_split(numbered_docs(LENGTHS)), seq_len=40, batch_size=2)


def test_real_prepared_split(sotu_data):
    split = open_split(sotu_data, "train")
    sampler = ContiguousSampler(split, seq_len=64, batch_size=4, seed=0)
    batch = sampler.next_batch()
    assert batch.tokens.shape == (4, 64) and int(batch.tokens.max()) < split.vocab_size
    assert sampler.windows_per_epoch == int(((split.doc_lengths - 1) // 64).sum())
