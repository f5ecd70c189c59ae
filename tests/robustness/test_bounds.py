"""Unbounded work is refused up front (issue 24, item 13): a passkey or synthetic length, a trial count or a
prompt that cannot fit in memory is one sentence naming the limit and the flag to change, said before the
model is loaded; nothing is allocated by these tests (the estimates are integer arithmetic).
"""

from __future__ import annotations

import resource

import pytest
from harness import assert_user_error

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A finished 8-step decoder run on the tiny data (L_t = 32)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    out = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data)), out, progress=False)
    return out


def refused_quickly(args, trained, cache, fragments, seconds=60):
    """The command's sentence, said within ``seconds`` of the child's CPU time: refused from the estimate,
    not after trying. CPU time, not the wall clock (issue 48, item 8): two busy loops beside the suite at a
    load of 11-15 stretched this child's import and refusal to 31-38 s of wall-clock time, past a 30 s bound
    its work stays far within; a hang that waits is still caught by the harness's timeout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sentence = assert_user_error([str(a) for a in args], cache=cache, watch=[trained], fragments=fragments)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert cpu < seconds, f"{cpu:.1f} s of CPU time"
    assert not (trained / "eval").exists() or not any((trained / "eval").iterdir())
    return sentence


def test_passkey_length_beyond_memory(trained, cache):
    sentence = refused_quickly(
        ["passkey", trained, "--lengths", "100000000", "--no-progress"],
        trained,
        cache,
        ["100000000 x 32 = 3200000000 tokens", "of memory", "available", "--lengths"],
    )
    assert "TB" in sentence or "PB" in sentence or "GB" in sentence


def test_passkey_the_issue_case(trained, cache):
    """`passkey R --lengths 1000000` was killed for memory after 100 s; refused at once wherever its
    estimate exceeds the memory there is."""
    from extrapos.run.config import load_run_config
    from extrapos.run.memory import available_bytes, forward_bytes

    need = forward_bytes(load_run_config(trained).model, 32 * 10**6)
    if available_bytes("cpu") > need:
        pytest.skip("this machine has the memory for it")
    refused_quickly(["passkey", trained, "--lengths", "1000000"], trained, cache, ["of memory", "--lengths"])


def test_passkey_trials_beyond_memory(trained, cache):
    refused_quickly(
        ["passkey", trained, "--lengths", "4", "--trials", "100000000000"],
        trained,
        cache,
        ["100000000000 per cell", "of memory", "--trials"],
    )


def test_passkey_trials_not_an_integer(trained, cache):
    assert_user_error(
        ["passkey", str(trained), "--trials", "1e11"], cache=cache, watch=[trained], fragments=["invalid int"]
    )


@pytest.mark.parametrize("candidates", ["1000000", "10001"])
def test_passkey_candidates_are_bounded_before_any_draw(candidates, trained, cache):
    refused_quickly(
        ["passkey", trained, "--lengths", "4", "--candidates", candidates],
        trained,
        cache,
        ["--candidates must be between 2 and 10000", candidates],
        seconds=30,
    )


def test_synthetic_length_beyond_memory(trained, cache):
    refused_quickly(
        ["synthetic-eval", trained, "--lengths", "10000000", "--task", "synthetic:copy"],
        trained,
        cache,
        ["synthetic examples", "of memory", "--lengths", "--examples"],
    )


def test_generate_prompt_file_beyond_its_limit(trained, scratch, cache):
    from extrapos.cli.generate import MAX_PROMPT_BYTES

    big = scratch / "big.txt"
    with open(big, "wb") as f:
        f.truncate(MAX_PROMPT_BYTES + 1)  # sparse: nothing is written
    refused_quickly(
        ["generate", trained, "--prompt-file", big], trained, cache, ["big.txt", "at most", "shorter prompt"]
    )


def test_generate_refuses_a_cache_that_cannot_fit():
    from extrapos.errors import UserError
    from extrapos.inference.generate import check_prompt_memory
    from extrapos.model import ModelConfig

    with pytest.raises(UserError, match="fewer --max-new-tokens"):
        check_prompt_memory(ModelConfig(), 10**12, True, "cpu")
    check_prompt_memory(ModelConfig(), 1000, True, "cpu")  # an ordinary prompt passes


def test_estimates_are_exact_integers_that_grow_with_the_request():
    from extrapos.model import ModelConfig
    from extrapos.run.memory import forward_bytes

    cfg = ModelConfig()
    one = forward_bytes(cfg, 1000)
    assert isinstance(one, int) and one > 1000 * cfg.d_model * 4
    assert forward_bytes(cfg, 2000) == 2 * one
    assert forward_bytes(cfg, 1000, rows=3) == 3 * one
    # the KV cache: tokens x layers x heads x head_dim x 2 (keys, values) x 4 bytes
    cache = forward_bytes(cfg, 1000, cache=True) - one
    assert cache == 1000 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * 2 * 4
    assert forward_bytes(cfg, 10**15) == 10**12 * one  # Python integers: no overflow


def test_feasible_work_still_runs(trained, tmp_path, cache):
    """What fits is scored: a synthetic run through the command line (the bar on stderr unless
    --no-progress), and passkey at 4 x L_t."""
    import json
    import shutil

    from harness import run

    from extrapos.data import prepare_data
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    spec = "synthetic:passkey:length=16,train=64,val=8,test=8,digits=2"
    data = prepare_data(spec, "synthetic", tmp_path / "d", progress=False)
    overrides = [f'data.corpus="{spec}"', 'data.tokenizer="synthetic"', 'data.sampler="synthetic"']
    overrides += [f'data.dir="{data}"', "model.vocab_size=65", "model.train_length=16", "train.steps=2"]
    overrides += ["train.batch_size=8", "train.threads=1"]
    train(load_config("cpu/tiny", overrides), tmp_path / "syn", progress=False)
    done = run(["synthetic-eval", tmp_path / "syn", "--lengths", "1,4", "--examples", "4"], cache=cache)
    assert done.returncode == 0, done.stderr
    assert "synthetic-eval syn" in done.stderr  # the progress bar
    saved = json.loads((tmp_path / "syn" / "eval" / "synthetic-passkey.json").read_text())
    assert [r["length"] for r in saved["results"]] == [16, 64]
    again = run(
        ["synthetic-eval", tmp_path / "syn", "--lengths", "1,4", "--examples", "4", "--no-progress"],
        cache=cache,
    )
    assert again.returncode == 0 and "synthetic-eval syn" not in again.stderr

    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    pk = run(
        ["passkey", copy, "--lengths", "4", "--depths", "0.5", "--trials", "2", "--no-progress"], cache=cache
    )
    assert pk.returncode == 0, pk.stderr
    assert len(list((copy / "eval").glob("passkey-rank-filler-ev4-*.json"))) == 1


def test_eval_length_beyond_memory(trained, cache):
    """`extrapos eval` estimates its longest window like passkey does, before the model is loaded."""
    refused_quickly(
        ["eval", trained, "--lengths", "1,100000000", "--no-progress"],
        trained,
        cache,
        ["evaluation windows of 100000000 x 32 = 3200000000 tokens", "of memory", "--lengths"],
    )


def test_ruler_names_its_own_prompts_when_refused_for_memory(trained, cache):
    """`ruler R --lengths 1000000` was refused as "passkey prompts of ..." (issue 37, item 10): the
    sentence names RULER's prompts and the flag to change, before the model is loaded."""
    refused_quickly(
        ["ruler", trained, "--tasks", "niah_single_1", "--lengths", "1000000", "--no-progress"],
        trained,
        cache,
        ["RULER prompts of 1000000 x", "of memory", "--lengths"],
    )


def test_ruler_estimates_its_time_and_refuses_past_a_day(trained, monkeypatch):
    """RULER's cells are timed before they run, like passkey's: work estimated past a day is refused
    (naming --force), with the machine's measured FLOP/s replaced by a slow one."""
    import extrapos.run.perf as perf
    from extrapos.errors import UserError
    from extrapos.run import timing
    from extrapos.run.handle import Run
    from extrapos.tasks.ruler import RulerOptions, check_ruler_time

    monkeypatch.setattr(timing, "CEILING_FLOPS", {"cpu": 0.0})  # too small to time otherwise
    monkeypatch.setattr(perf, "matmul_peak_flops", lambda device, precision: 1e3)  # a very slow machine
    opts = RulerOptions(tasks=["niah_single_1"], lengths=[4], trials=5).checked()
    with pytest.raises(UserError, match="--force"):
        check_ruler_time(Run.open(trained), opts, "cpu", force=False)
    check_ruler_time(Run.open(trained), opts, "cpu", force=True)  # --force goes on
