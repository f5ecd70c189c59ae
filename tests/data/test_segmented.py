"""Segmented-sequence samplers (chunk / prefix / full / randompos / pose): the invariants of segmented
sequences §3.3."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_helpers import numbered_docs

from extrapos.data.segmented import SegmentedSampler, compute_equivalent_tokens, pose_positions
from extrapos.errors import UserError
from extrapos.run.config import load_config

L_T, L_E = 8, 32
# numbered documents: token value - first token of its document = index in the document
LENGTHS = [100, 20, 65, 33, 200]  # windows of L_E + 1 = 33: 3 + 0 + 2 + 1 + 6 = 12


@pytest.fixture
def split(synthetic_split):
    return synthetic_split(numbered_docs(LENGTHS))


def doc_firsts():
    docs = numbered_docs(LENGTHS)
    return {int(t): int(d[0]) for d in docs for t in d}


def batches(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def check_original(batch, firsts, extended=L_E):
    """Every token sits at its original position in an L_e window of one document, with its next token as
    target."""
    for toks, tgts, pos in zip(batch.tokens.tolist(), batch.targets.tolist(), batch.positions.tolist()):
        assert all(b > a for a, b in zip(pos, pos[1:]))  # strictly increasing
        assert all(0 <= p < extended for p in pos)
        assert tgts == [t + 1 for t in toks]  # the original next token
        docs = {firsts[t] for t in toks + tgts}
        assert len(docs) == 1  # one document
        in_doc = [t - firsts[t] for t in toks]
        window_start = in_doc[0] - pos[0]
        assert window_start % extended == 0  # non-overlapping L_e windows from the document start
        assert [i - window_start for i in in_doc] == pos  # original positions


def test_windows_are_non_overlapping_L_e_windows_of_single_documents(split):
    s = SegmentedSampler(split, "full", L_T, L_E, batch_size=12, seed=0)
    assert s.num_items == s.windows_per_epoch == 12
    b = s.next_batch()
    assert b.tokens.shape == (12, L_E) and bool(b.loss_mask.all())
    assert torch.equal(b.positions, torch.arange(L_E).expand(12, L_E))
    check_original(b, doc_firsts())
    assert len(set(b.tokens[:, 0].tolist())) == 12  # one item per window per epoch


@pytest.mark.parametrize("alpha", [0.125, 0.25, 0.5])
def test_chunk_segments(split, alpha):
    s = SegmentedSampler(split, "chunk", L_T, L_E, batch_size=4, alpha=alpha, seed=1)
    seg, n = int(alpha * L_T), int(1 / alpha)
    firsts = doc_firsts()
    starts, ends = [], []
    for b in batches(s, 30):
        assert b.tokens.shape == (4, L_T) and bool(b.loss_mask.all())
        check_original(b, firsts)
        for pos in b.positions.tolist():
            segments = [pos[i * seg : (i + 1) * seg] for i in range(n)]
            for sgm in segments:
                assert sgm == list(range(sgm[0], sgm[0] + seg))  # contiguous segments of alpha * L_t
            starts.append(pos[0])
            ends.append(pos[-1])
    # stars and bars: the first segment can start at 0 and the last end on the window's last position
    assert min(starts) == 0 and max(ends) == L_E - 1


@pytest.mark.parametrize("alpha", [0.25, 0.5])
def test_prefix_before_suffix_and_loss_on_suffix_only(split, alpha):
    s = SegmentedSampler(split, "prefix", L_T, L_E, batch_size=4, alpha=alpha, seed=2)
    suffix = int(alpha * L_T)
    prefix = L_T - suffix
    firsts = doc_firsts()
    cut_points = []
    for b in batches(s, 60):
        check_original(b, firsts)
        assert b.loss_mask.tolist() == [[False] * prefix + [True] * suffix] * 4
        assert b.num_tokens == 4 * suffix
        for pos in b.positions.tolist():
            i = pos[prefix]
            assert pos[prefix:] == list(range(i, i + suffix))  # contiguous suffix from i
            assert all(p < i for p in pos[:prefix])  # the prefix lies before the suffix
            assert prefix <= i <= L_E - suffix
            cut_points.append(i)
    # both ends of the (inclusive) range of i occur
    assert min(cut_points) == prefix and max(cut_points) == L_E - suffix


def test_randompos_contiguous_tokens_with_spread_positions(split):
    s = SegmentedSampler(split, "randompos", L_T, L_E, batch_size=4, seed=3)
    firsts = doc_firsts()
    top = 0
    for b in batches(s, 20):
        assert b.tokens.shape == (4, L_T) and bool(b.loss_mask.all())
        for toks, tgts, pos in zip(b.tokens.tolist(), b.targets.tolist(), b.positions.tolist()):
            assert toks == list(range(toks[0], toks[0] + L_T)) and tgts == [t + 1 for t in toks]
            assert len({firsts[t] for t in toks + tgts}) == 1
            start = toks[0] - firsts[toks[0]]
            assert start + L_T <= start // L_E * L_E + L_E  # tokens and targets inside one L_e window
            assert all(b_ > a for a, b_ in zip(pos, pos[1:])) and 0 <= pos[0] and pos[-1] < L_E
            top = max(top, pos[-1])
    assert top >= L_T  # positions beyond L_t occur


def test_pose_contiguous_tokens_in_chunks_with_skipped_positions(split):
    s = SegmentedSampler(split, "pose", L_T, L_E, batch_size=4, seed=3)
    firsts = doc_firsts()
    skips, cuts = set(), set()
    for b in batches(s, 40):
        assert b.tokens.shape == (4, L_T) and bool(b.loss_mask.all())
        for toks, tgts, pos in zip(b.tokens.tolist(), b.targets.tolist(), b.positions.tolist()):
            assert toks == list(range(toks[0], toks[0] + L_T)) and tgts == [
                t + 1 for t in toks
            ]  # contiguous text
            assert len({firsts[t] for t in toks + tgts}) == 1
            start = toks[0] - firsts[toks[0]]
            assert start + L_T <= start // L_E * L_E + L_E  # tokens and targets inside one L_e window
            assert pos[0] == 0 and pos[-1] < L_E  # chunk 0 is not skipped; positions within [0, L_e)
            assert all(b_ > a for a, b_ in zip(pos, pos[1:]))  # sorted
            jumps = [i for i in range(1, L_T) if pos[i] - pos[i - 1] != 1]
            assert len(jumps) <= 1  # two chunks, each with consecutive positions
            if jumps:
                cuts.add(jumps[0])
            skips.add(pos[-1] - (L_T - 1))
    assert max(skips) == L_E - L_T and 0 in skips  # the skip covers [0, L_e - L_t]: positions reach L_e - 1
    assert cuts == set(range(1, L_T))  # every split point of the two chunks occurs


def test_pose_positions_with_more_chunks_follow_the_skip_recursion():
    rng = np.random.default_rng(0)
    for _ in range(200):
        pos = pose_positions(rng, 16, 100, chunks=4)
        steps = np.diff(pos)
        assert pos[0] == 0 and pos[-1] < 100 and (steps >= 1).all()
        assert (steps > 1).sum() <= 3  # at most N - 1 skips (u_i = u_{i-1} is allowed)
    with pytest.raises(UserError, match="chunks"):
        pose_positions(rng, 4, 16, chunks=5)


def test_equal_token_budgets(split):
    """L_e / L_t epochs of an L_t sampler and one epoch of full feed the same number of tokens."""
    per_epoch = {}
    for method in ("chunk", "prefix", "randompos", "pose", "full"):
        s = SegmentedSampler(split, method, L_T, L_E, batch_size=1, alpha=0.25)
        per_epoch[method] = s.windows_per_epoch * s.seq_len
    epochs = L_E // L_T
    assert (
        per_epoch["chunk"] * epochs
        == per_epoch["prefix"] * epochs
        == per_epoch["randompos"] * epochs
        == per_epoch["pose"] * epochs
        == per_epoch["full"]
        == compute_equivalent_tokens(split, L_T, L_E)
        == 12 * L_E
    )


@pytest.mark.parametrize("method", ["chunk", "prefix", "randompos", "pose"])
def test_deterministic_resumable_and_independent_of_batching(split, method):
    a = SegmentedSampler(split, method, L_T, L_E, batch_size=3, seed=5)
    b = SegmentedSampler(split, method, L_T, L_E, batch_size=3, seed=5)
    first = batches(a, 5)
    assert all(
        torch.equal(x.positions, y.positions) and torch.equal(x.tokens, y.tokens)
        for x, y in zip(first, batches(b, 5))
    )
    # resume mid-epoch (12 windows per epoch: 15 items = epoch 1, position 3) from the JSON state
    state = a.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3 and state["method"] == method
    resumed = SegmentedSampler(split, method, L_T, L_E, batch_size=3, seed=5)
    resumed.load_state_dict(state)
    for x, y in zip(batches(a, 6), batches(resumed, 6)):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.positions, y.positions)
        assert torch.equal(x.loss_mask, y.loss_mask)
    # an item's cut depends on (seed, epoch, item) only, not on the batch size
    one = SegmentedSampler(split, method, L_T, L_E, batch_size=1, seed=5)
    stream = torch.cat([x.positions for x in batches(one, 15)])
    assert torch.equal(stream, torch.cat([x.positions for x in first]))
    other = SegmentedSampler(split, method, L_T, L_E, batch_size=15, seed=6).next_batch()
    assert not torch.equal(other.positions, stream)
    with pytest.raises(UserError, match="method"):
        SegmentedSampler(
            split, "chunk" if method != "chunk" else "prefix", L_T, L_E, 3, seed=5
        ).load_state_dict(state)


def test_rank_shards_are_disjoint(split):
    r0 = SegmentedSampler(split, "chunk", L_T, L_E, batch_size=5, seed=0, rank=0, world_size=2).next_batch()
    r1 = SegmentedSampler(split, "chunk", L_T, L_E, batch_size=5, seed=0, rank=1, world_size=2).next_batch()
    assert not set(r0.tokens[:, 0].tolist()) & set(r1.tokens[:, 0].tolist())


def test_factory_and_errors(split):
    from extrapos.run.runtime import build_sampler as runtime_sampler

    def cfg(*sets):
        return load_config(None, ["model.train_length=8", *sets])

    def build_sampler(name, split, cfg, batch_size):  # the sampler data.sampler = name asks for
        cfg.data.sampler = name
        return runtime_sampler(cfg, split, batch_size, seed=0)

    s = build_sampler("chunk", split, cfg("data.extended_length=32", "data.alpha=0.5"), 2)
    assert isinstance(s, SegmentedSampler) and s.seq_len == L_T and s.alpha == 0.5
    assert build_sampler("full", split, cfg("data.extended_length=32", "train.seq_len=32"), 2).seq_len == 32
    with pytest.raises(UserError, match="train.seq_len=32"):
        build_sampler("full", split, cfg("data.extended_length=32"), 2)
    with pytest.raises(UserError, match="extended_length"):
        build_sampler("prefix", split, cfg(), 2)
    with pytest.raises(UserError, match="unknown data.sampler"):
        build_sampler("zigzag", split, cfg("data.extended_length=32"), 2)
    with pytest.raises(UserError, match="whole number"):
        SegmentedSampler(split, "chunk", L_T, L_E, 2, alpha=0.3)
    with pytest.raises(UserError, match="1/alpha segments"):
        SegmentedSampler(split, "chunk", 12, 48, 2, alpha=0.75)
    with pytest.raises(UserError, match="No window"):
        SegmentedSampler(split, "chunk", L_T, 400, 2)
    with pytest.raises(UserError, match="at least L_t"):
        SegmentedSampler(split, "randompos", L_T, 4, 2)


def test_training_from_scratch_with_a_segmented_sampler(tiny_data_small):
    """Plain training can use a segmented sampler (e.g. ExPE + chunk from scratch)."""
    from extrapos.run.config import load_config as lc
    from extrapos.training.trainer import train

    data, tmp = tiny_data_small
    cfg = lc(
        "cpu/tiny",
        [
            f'data.dir="{data}"',
            "model.vocab_size=400",
            "model.train_length=16",
            "model.positions.name=expe",
            "data.sampler=chunk",
            "data.extended_length=64",
            "train.batch_size=2",
            "train.steps=2",
            "train.threads=1",
            "train.eval_every=0",
            "train.checkpoint_every=0",
        ],
    )
    result = train(cfg, tmp / "run", progress=False)
    assert result.steps == 2 and np.isfinite(result.final_loss)


@pytest.fixture
def tiny_data_small(sotu_data, tmp_path):
    return sotu_data, tmp_path


def test_pose_chunks_option(split):
    """data.pose_chunks = 4: up to 3 skips per example, with the invariants of the 2-chunk sampler."""
    s = SegmentedSampler(split, "pose", L_T, L_E, batch_size=4, seed=3, pose_chunks=4)
    firsts, jump_counts, skips = doc_firsts(), set(), set()
    for b in batches(s, 40):
        for toks, tgts, pos in zip(b.tokens.tolist(), b.targets.tolist(), b.positions.tolist()):
            assert toks == list(range(toks[0], toks[0] + L_T)) and tgts == [t + 1 for t in toks]
            assert len({firsts[t] for t in toks + tgts}) == 1
            assert pos[0] == 0 and pos[-1] < L_E and all(b_ > a for a, b_ in zip(pos, pos[1:]))
            jump_counts.add(sum(pos[i] - pos[i - 1] != 1 for i in range(1, L_T)))
            skips.add(pos[-1] - (L_T - 1))
    assert max(jump_counts) == 3 and jump_counts <= {0, 1, 2, 3}  # 4 chunks, u_i = u_{i-1} allowed
    assert max(skips) == L_E - L_T
    two = SegmentedSampler(split, "pose", L_T, L_E, batch_size=1, seed=3)
    assert s.windows_per_epoch * s.seq_len == two.windows_per_epoch * two.seq_len  # the same budget
    # the default leaves the sampler state as it was; another number of chunks cannot resume it
    assert "pose_chunks" not in two.state_dict() and s.state_dict()["pose_chunks"] == 4
    with pytest.raises(UserError, match="pose_chunks"):
        two.load_state_dict(s.state_dict())
    with pytest.raises(UserError, match="chunks"):
        SegmentedSampler(split, "pose", L_T, L_E, batch_size=1, pose_chunks=L_T + 1)


def test_pose_chunks_config(split):
    from extrapos.run.runtime import build_sampler

    sets = ["model.train_length=8", 'data.sampler="pose"', "data.extended_length=32"]
    cfg = load_config(None, [*sets, "data.pose_chunks=4"])
    assert build_sampler(cfg, split, 2, seed=0).pose_chunks == 4
    assert "pose_chunks = 4" in cfg.to_toml() and "pose_chunks" not in load_config(None, sets).to_toml()
    for extra, match in [
        (["data.pose_chunks=0"], "data.pose_chunks must be a positive integer"),
        (["data.pose_chunks=9"], "data.pose_chunks must be at most the example length 8"),
        (['data.sampler="randompos"', "data.pose_chunks=3"], "left unset unless data.sampler = pose"),
    ]:
        with pytest.raises(UserError, match=match):
            load_config(None, [*sets, *extra])
