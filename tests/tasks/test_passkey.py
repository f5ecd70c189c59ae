"""Passkey retrieval: token-exact prompts, a scorer that gives an in-context copier 100% and a random
model chance, batched greedy decoding equal to the reference generator, and the end-to-end grid."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from extrapos.data import load_tokenizer, open_split
from extrapos.errors import UserError
from extrapos.inference.generate import generate_tokens
from extrapos.model import Decoder, model_config
from extrapos.tasks.common import greedy_batch
from extrapos.tasks.passkey import (
    FILLER,
    NEEDLE,
    QUESTION,
    PasskeyBuilder,
    computed_metrics,
    first_number,
    format_all,
    format_grid,
    passkey,
    plot_heatmap,
    score_prompts,
)


@pytest.fixture(scope="module")
def tok(tiny_data):
    return load_tokenizer(tiny_data)


# ---- stub models -----------------------------------------------------------------------------------


class _StubCache:
    def __init__(self):
        self.tokens: list[list[int]] = []


class StubLM(nn.Module):
    """Logits from a rule over the token history; "hidden states" are the logits themselves.

    ``copier``: an induction-head oracle (Olsson et al. 2022): it predicts the token that followed the
    latest earlier occurrence of the longest suffix of the context, so it reads the key from the needle
    and repeats it after "The pass key is". Otherwise a fixed random bigram table. Only the last
    ``tail`` positions of each call get predictions (the scorers read no others), to keep it fast.
    """

    def __init__(self, vocab: int, copier: bool, tail: int = 12, seed: int = 0):
        super().__init__()
        self.vocab, self.copier, self.tail = vocab, copier, tail
        g = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=g), requires_grad=False)

    def new_cache(self):
        return _StubCache()

    def _predict(self, seq: list[int], t: int) -> int | None:
        best, best_len = None, 0
        for j in range(t - 1, -1, -1):
            n = 0
            while n <= j and seq[j - n] == seq[t - n] and n < 16:
                n += 1
            if n > best_len:
                best, best_len = seq[j + 1], n
        return best

    def hidden_states(self, tokens, positions, cache=None):
        B, T = tokens.shape
        out = torch.zeros(B, T, self.vocab)
        for b in range(B):
            past = cache.tokens[b] if cache is not None and len(cache.tokens) > b else []
            seq = past + tokens[b].tolist()
            for t in range(max(0, T - self.tail), T):
                i = len(past) + t
                if self.copier:
                    nxt = self._predict(seq, i)
                    if nxt is not None:
                        out[b, t, nxt] = 10.0
                else:
                    out[b, t] = self.table[seq[i]]
            if cache is not None:
                if len(cache.tokens) <= b:
                    cache.tokens.append([])
                cache.tokens[b] = seq
        return out

    def logits(self, h):
        return h

    def forward(self, tokens, positions, cache=None):
        return self.hidden_states(tokens, positions, cache)


# ---- the generator ---------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("length", [96, 257])
def test_prompt_has_the_exact_length_and_the_needle_at_the_asked_depth(tok, depth, length):
    b = PasskeyBuilder(tok)
    p = b.build(length, depth, np.random.default_rng(3))
    assert len(p.tokens) == length
    hay = length - p.needle_len - len(b.question)
    # the needle goes between sentences: at the sentence boundary nearest to the asked depth
    assert abs(p.needle_start - round(depth * hay)) <= len(b.filler)
    assert p.needle_start in (0, hay) or tok.decode(p.tokens[: p.needle_start]).rstrip().endswith(".")
    assert p.tokens[p.needle_start : p.needle_start + p.needle_len] == b.needle(p.key)
    assert p.tokens[-len(b.question) :] == b.question
    assert len(p.key) == 5 and p.answer == tok.encode(" " + p.key)
    text = tok.decode(p.tokens)
    assert NEEDLE.format(key=p.key) in text and text.endswith(QUESTION)
    assert text.count(p.key) == 2
    if depth == 0.0:
        assert tok.decode(p.tokens[: p.needle_len]).strip().startswith("The pass key is")
    if depth == 1.0:
        assert p.needle_start + p.needle_len == length - len(b.question)
    # around the needle: the filler, repeated and cut to the haystack length, without a gap
    hay_tokens = p.tokens[: p.needle_start] + p.tokens[p.needle_start + p.needle_len : -len(b.question)]
    assert hay_tokens == (b.filler * (length // len(b.filler) + 1))[:hay]
    assert tok.decode(b.filler).strip() == FILLER


def test_prompts_are_deterministic_by_seed_and_alternatives_match_the_key_length(tok):
    b = PasskeyBuilder(tok)
    p1, p2 = (b.build(128, 0.5, np.random.default_rng([7, 1])) for _ in range(2))
    assert p1 == p2
    assert b.build(128, 0.5, np.random.default_rng([8, 1])).key != p1.key
    alts = b.alternatives(p1.key, 9, np.random.default_rng(0))
    assert len(set(alts)) == 9 and p1.key not in alts
    assert all(len(b.answer(k)) == len(p1.answer) for k in alts)


def test_corpus_haystack_is_a_window_of_the_split(tok, tiny_data):
    split = open_split(tiny_data, "test")
    hay = np.asarray(split.tokens)
    b = PasskeyBuilder(tok, haystack=hay)
    p = b.build(200, 0.25, np.random.default_rng(1))
    assert len(p.tokens) == 200
    before = np.asarray(p.tokens[: p.needle_start])
    after = np.asarray(p.tokens[p.needle_start + p.needle_len : -len(b.question)])
    joined = np.concatenate([before, after])  # the haystack around the needle is contiguous corpus text
    starts = np.flatnonzero(hay[: len(hay) - len(joined)] == joined[0])
    assert any(np.array_equal(hay[s : s + len(joined)], joined) for s in starts)
    assert FILLER not in tok.decode(p.tokens)


@pytest.mark.parametrize("depth", [0.1, 0.33, 0.5, 0.77, 0.9])
def test_needle_never_cuts_a_word_of_the_filler(tok, depth):
    """Issue 26: "...The sky is blue. T The pass key is 86556. ... he sun is yellow." never again."""
    b = PasskeyBuilder(tok)
    for length in range(90, 130, 7):
        p = b.build(length, depth, np.random.default_rng(length))
        before = tok.decode(p.tokens[: p.needle_start]).rstrip()
        after = tok.decode(p.tokens[p.needle_start + p.needle_len : -len(b.question)]).lstrip()
        assert before == "" or before.endswith("."), before[-30:]
        assert after == "" or FILLER.startswith(after[:5]) or after.split()[0] in FILLER.split(), after[:30]
        assert after == "" or after.split()[0] in {"The", "Here", "There"}


def test_needle_and_window_of_a_corpus_haystack_start_at_words(tok, tiny_data):
    hay = np.asarray(open_split(tiny_data, "test").tokens)
    b = PasskeyBuilder(tok, haystack=hay)
    for seed in range(12):
        p = b.build(160, seed / 11, np.random.default_rng(seed))
        end = p.needle_start + p.needle_len
        assert p.needle_start == 0 or b.starts_word(p.tokens[0])  # the window starts at a word
        if end < len(p.tokens) - len(b.question):
            assert b.starts_word(p.tokens[end])  # the needle is followed by a whole word
        assert tok.decode([p.tokens[p.needle_start]]).startswith(" The")


def test_too_short_prompt_and_bad_depth_are_user_errors(tok):
    b = PasskeyBuilder(tok)
    with pytest.raises(UserError, match="cannot hold"):
        b.build(10, 0.5, np.random.default_rng(0))
    with pytest.raises(UserError, match="depth"):
        b.build(100, 1.5, np.random.default_rng(0))


def test_first_number():
    assert first_number(" 71432. Remember") == "71432"
    assert first_number(" 714325") == "714325" and first_number(" the") is None


# ---- the scorers -----------------------------------------------------------------------------------


def _prompts(b, n, length=96, seed=0):
    rng = np.random.default_rng(seed)
    return [b.build(length, float(d), rng) for d in np.linspace(0, 1, n)]


def test_copier_stub_retrieves_every_key_in_both_modes(tok):
    b = PasskeyBuilder(tok)
    model = StubLM(tok.vocab_size, copier=True)
    r = score_prompts(model, tok, b, _prompts(b, 6), "both", candidates=5, rng=np.random.default_rng(0))
    assert r["n"] == 6 and r["rank_accuracy"] == 1.0 and r["mean_rank"] == 1.0 and r["exact_match"] == 1.0


def test_random_stub_is_at_chance(tok):
    b = PasskeyBuilder(tok)
    model = StubLM(tok.vocab_size, copier=False)
    prompts = _prompts(b, 120, length=64)
    r = score_prompts(model, tok, b, prompts, "both", candidates=5, rng=np.random.default_rng(0))
    assert 0.08 <= r["rank_accuracy"] <= 0.35  # chance 0.2; 120 trials: std 0.037
    assert 2.4 <= r["mean_rank"] <= 3.6 and r["exact_match"] == 0.0


def test_copier_fails_when_the_needle_holds_another_key(tok):
    """The scorer checks the key of the question, not whatever number the model copies."""
    b = PasskeyBuilder(tok)
    model = StubLM(tok.vocab_size, copier=True)
    rng = np.random.default_rng(0)
    prompts = []
    for p in _prompts(b, 4):
        other = b.alternatives(p.key, 1, rng)[0]
        p.key, p.answer = other, b.answer(other)  # the needle still says the old key
        prompts.append(p)
    r = score_prompts(model, tok, b, prompts, "both", candidates=5, rng=rng)
    # an asked key may share its first token with the needle's and so outscore the others: not all ranks drop
    assert r["rank_accuracy"] <= 0.5 and r["exact_match"] == 0.0


def test_batched_greedy_equals_the_reference_generator():
    torch.manual_seed(0)
    for name in ("rope", "alibi"):
        model = Decoder(
            model_config("cpu-tiny", vocab_size=61, train_length=8, positions={"name": name})
        ).eval()
        prompts = torch.randint(0, 61, (3, 21))
        got = greedy_batch(model, prompts, 6, prefill_chunk=8)
        for row in range(3):
            ref = list(generate_tokens(model, prompts[row].tolist(), 6, temperature=0, prefill_chunk=8))
            assert got[row].tolist() == ref


# ---- end to end on a trained run ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    out = tmp_path_factory.mktemp("pk") / "rope"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 4})), out, progress=False)
    return out


def test_passkey_grid_on_a_trained_run(tiny_run, tmp_path):
    r = passkey(tiny_run, lengths=[4, 8], depths=[0, 0.5, 1], trials=2, mode="both", candidates=4)
    (path,) = (tiny_run / "eval").glob("passkey-both-filler-ev4_8-*.json")  # the request's digest ends it
    assert json.loads(path.read_text()) == json.loads(json.dumps(r))
    assert [(c["ev"], c["length"], c["depth"]) for c in r["results"]] == [
        (k, 32 * k, d) for k in (4, 8) for d in (0.0, 0.5, 1.0)
    ]
    for c in r["results"]:
        assert c["n"] == 2 and 0 <= c["rank_accuracy"] <= 1 and 1 <= c["mean_rank"] <= 4
        assert c["exact_match"] in (0.0, 0.5, 1.0)
    grid = format_grid(r)
    assert grid.count("\n| 4 | 128 |") == 1 and "depth 0.5" in grid
    # --mode both: the console shows every metric computed, the run's description once
    assert computed_metrics(r) == ["rank_accuracy", "mean_rank", "mrr", "exact_match"]
    shown = format_all(r)
    assert shown.count("passkey both (") == 1 and shown.count("\n| 8 | 256 |") == 4
    for label in ("mean rank (the same cells)", "mrr (the same cells)", "exact match (the same cells)"):
        assert label in shown
    assert plot_heatmap(r, tmp_path / "hm.png").stat().st_size > 1000
    # the same request is reused; a different one under the same name is refused, and the file is kept
    assert passkey(tiny_run, lengths=[4, 8], depths=[0, 0.5, 1], trials=2, mode="both", candidates=4) == r
    with pytest.raises(UserError, match="different evaluation"):
        passkey(tiny_run, lengths=[4], depths=[0], trials=1, mode="both", candidates=4, name=path.stem)
    assert json.loads(path.read_text()) == json.loads(json.dumps(r))


def test_different_requests_on_one_run_get_their_own_default_names(tiny_run):
    """A default name of the mode and haystack alone made a second, different request (other lengths, seed,
    depths, ...) collide with the first and be refused; an equal request keeps its name and is reused."""
    ask = {"depths": [0.5], "trials": 1, "candidates": 2}
    eval_dir = tiny_run / "eval"
    before = set(eval_dir.glob("passkey-*.json")) if eval_dir.is_dir() else set()
    first = passkey(tiny_run, lengths=[8, 4], **ask)
    second = passkey(tiny_run, lengths=[5], **ask)
    third = passkey(tiny_run, lengths=[4, 8], **{**ask, "seed": 1})
    names = [first["name"], second["name"], third["name"]]
    assert len(set(names)) == 3, names
    assert names[0].startswith("passkey-rank-filler-ev4_8-") and names[1].startswith(
        "passkey-rank-filler-ev5-"
    )
    made = set(eval_dir.glob("passkey-*.json")) - before
    assert {p.stem for p in made} == set(names)
    written = (eval_dir / f"{first['name']}.json").stat().st_mtime_ns
    # the same request (lengths in any order) keeps its name, and its result is reused, not written again
    assert passkey(tiny_run, lengths=[4, 8], **ask) == first
    assert (eval_dir / f"{first['name']}.json").stat().st_mtime_ns == written
    assert set(eval_dir.glob("passkey-*.json")) - before == made
    # the command line, as `extrapos passkey RUN --lengths 6` then `--lengths 6 --seed 2`: both succeed
    from extrapos.cli import main

    flags = ["passkey", str(tiny_run), "--lengths", "6", "--depths", "0.5", "--trials", "1"]
    flags += ["--candidates", "2", "--no-progress"]
    assert main(flags) == 0 and main([*flags, "--seed", "2"]) == 0
    assert len(set(eval_dir.glob("passkey-rank-filler-ev6-*.json"))) == 2


def test_default_names_tell_requests_apart():
    from extrapos.evaluate import check_result_name
    from extrapos.tasks.passkey import PasskeyOptions, default_name

    base = PasskeyOptions(lengths=[1, 2]).checked()
    others = [
        replace(base, lengths=[1, 4]),
        replace(base, seed=1),
        replace(base, depths=[0.5]),
        replace(base, trials=5),
        replace(base, key_digits=4),
        replace(base, candidates=4),
        replace(base, mode="generate"),
        replace(base, haystack="corpus"),
        replace(base, haystack="corpus", split="val"),
        replace(base, position_options={"scale": 0.5}),
        replace(base, base_length=64),
        replace(base, step=4),
    ]
    names = [default_name(o) for o in [base, *others]]
    assert len(set(names)) == len(names), names
    assert default_name(replace(base)) == names[0]  # an equal request keeps its name (it is reused)
    assert names[0].startswith("passkey-rank-filler-ev1_2-")
    assert default_name(replace(base, haystack="/data/My Corpus")).startswith("passkey-rank-My_Corpus-ev1_2-")
    many = replace(base, lengths=list(range(1, 200)), position_options={f"k{i}": "v" * 50 for i in range(9)})
    assert check_result_name(default_name(many)) and len(default_name(many)) <= 120


def test_corpus_haystack_and_position_options_on_a_trained_run(tiny_run):
    r = passkey(
        tiny_run,
        lengths=[4],
        depths=[0.5],
        trials=2,
        mode="rank",
        haystack="corpus",
        candidates=3,
        position_options={"scaling": "linear", "factor": 2.0},
    )
    assert r["name"].startswith("passkey-rank-corpus-ev4-factor2.0-scalinglinear-")
    assert re.fullmatch("[0-9a-f]{8}", r["name"].rsplit("-", 1)[1])  # the digest of the whole request
    assert r["applied"] == {"scaling": "linear", "factor": 2.0} and r["haystack_source"] != "filler"
    with pytest.raises(UserError, match="mode"):
        passkey(tiny_run, mode="guess")
    with pytest.raises(UserError, match="cannot hold"):
        passkey(tiny_run, lengths=[1], depths=[0], trials=1)


def test_prompts_dealt_to_two_ranks_score_like_one_process(tok):
    """Under torchrun (runtime.Shard) each rank scores its jobs (a prompt in rank mode, a batch of
    prompts in generate mode) and the shares summed over the ranks give one process's numbers; both
    ranks draw every prompt's alternatives, so the rng moves as in one process. The all-reduce is
    stood in for: rank 1's shares are recorded and added to rank 0's."""
    from extrapos.run.runtime import Shard

    b = PasskeyBuilder(tok)
    model = StubLM(tok.vocab_size, copier=True)
    prompts = _prompts(b, 7)
    rng = np.random.default_rng(5)
    for p in prompts[::2]:  # the needle holds another key: misses and lower ranks on these
        other = b.alternatives(p.key, 1, rng)[0]
        p.key, p.answer = other, b.answer(other)

    def score(shard):
        return score_prompts(model, tok, b, prompts, "both", 5, np.random.default_rng(0), 250, shard)

    class Recorded(Shard):
        def __init__(self):
            super().__init__(rank=1, world=2)
            self.shares = []

        def sum(self, t):
            self.shares.append(t.clone())
            return t

    class PlusRecorded(Shard):
        def __init__(self, others):
            super().__init__(rank=0, world=2)
            self.others, self.own = iter(others), []

        def sum(self, t):
            self.own.append(t.clone())
            return t + next(self.others)

    one = score(None)
    assert 0 < one["exact_match"] < 1 and one["mean_rank"] > 1  # mixed outcomes, so the sums are tested
    rank1 = Recorded()
    with np.errstate(divide="ignore"):  # rank 1's own numbers (zeros for rank 0's jobs) are never used
        score(rank1)
    rank0 = PlusRecorded(rank1.shares)
    assert score(rank0) == one
    for mine, theirs in zip(rank0.own, rank1.shares):  # each job scored by exactly one rank, both busy
        assert bool((mine != 0).any()) and bool((theirs != 0).any())
        assert not bool(((mine != 0) & (theirs != 0)).any())
