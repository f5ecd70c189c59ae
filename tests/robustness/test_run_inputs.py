"""Bad input to every run-side command (train, resume, eval, extend, compare, report, generate, passkey,
export, and their encoder forms): exit status 2, one sentence naming the fix, no traceback, every
existing file unchanged.

One trained run is shared by the tests (module scope); each test watches it and the data it read.
"""

from __future__ import annotations

import json
import shutil

import pytest
from harness import assert_user_error

from tests.conftest import encoder_overrides, tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A finished 8-step run on the tiny data (library call: seconds)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data)), run, progress=False)
    return run


def sets(data_dir, **extra):
    out = []
    for s in tiny_overrides(data_dir, **extra):
        out += ["--set", s]
    return out


def train_args(data_dir, out, **extra):
    return ["train", "--config", "cpu/tiny", "--out", str(out), "--no-progress", *sets(data_dir, **extra)]


# ---- train: every value is checked before the run directory is written ------------------------

BAD_TRAIN = [
    ({"train.log_every": 0}, "train.log_every"),
    ({"train.lr": -1}, "train.lr"),
    ({"train.threads": -1}, "train.threads"),
    ({"train.device": '"foo"'}, "train.device"),
    ({"data.sampler": '"zigzag"'}, "data.sampler"),
    ({"data.split_fractions": "[0.5, 0.6, 0.1]"}, "data.split_fractions"),
    ({"train.steps": 0}, "train.steps"),
    ({"train.tokens": -5}, "train.tokens"),
    ({"train.seq_len": 0}, "train.seq_len"),
    ({"train.batch_size": 100000}, "fewer than one batch"),
    ({"train.precision": '"fp8"'}, "train.precision"),
    ({"train.schedule": '"wavy"'}, "train.schedule"),
    ({"model.positions.name": '"nosuch"'}, "unknown positional encoding"),
    ({"model.d_model": 30}, "not divisible"),
    ({"train.beta2": 1.5}, "train.beta2"),
    ({"train.weight_decay": 1e30}, "train.weight_decay"),  # lr x decay >= 1: every weight zeroed at step 1
    ({"train.weight_decay": -0.1}, "train.weight_decay"),
]


@pytest.mark.parametrize("extra,fragment", BAD_TRAIN, ids=[f[1] for f in BAD_TRAIN])
def test_bad_training_config_leaves_no_run_behind(extra, fragment, tiny_data, scratch, cache):
    args = train_args(tiny_data, scratch / "run", **extra)  # a budget on the command line replaces the others
    assert_user_error(args, cache=cache, watch=[tiny_data], fragments=[fragment])
    assert not (scratch / "run" / "config.toml").exists()  # the rerun is not told "already holds a run"


def test_rerun_after_a_late_error_just_works(tiny_data, scratch, cache):
    assert_user_error(
        train_args(tiny_data, scratch / "run", **{"train.batch_size": 100000}),
        cache=cache,
        watch=[tiny_data],
        fragments=["batch"],
    )
    from harness import run

    ok = run(train_args(tiny_data, scratch / "run", **{"train.steps": 2}), cache=cache)
    assert ok.returncode == 0, ok.stderr


def test_unknown_key_and_unknown_preset(tiny_data, scratch, cache):
    assert_user_error(
        train_args(tiny_data, scratch / "r", **{"train.lrr": 1}),
        cache=cache,
        fragments=["unknown config key 'train.lrr'"],
    )
    assert_user_error(
        ["train", "--config", "cpu/nosuch", "--out", str(scratch / "r")],
        cache=cache,
        fragments=["no config file or preset"],
    )


def test_resume_refuses_a_change_that_would_mix_two_runs(trained, cache):
    sentence = assert_user_error(
        ["train", "--out", str(trained), "--resume", "--set", "train.lr=0.5"],
        cache=cache,
        watch=[trained],
        fragments=["train.lr", "--resume cannot change"],
    )
    assert "0.003" in sentence


def test_resume_of_nothing(scratch, cache):
    assert_user_error(
        ["train", "--out", str(scratch / "none"), "--resume"],
        cache=cache,
        fragments=["holds no run to resume"],
    )


def test_a_second_fresh_run_into_a_finished_one(trained, tiny_data, cache):
    assert_user_error(train_args(tiny_data, trained), cache=cache, watch=[trained], fragments=["--resume"])


# ---- eval --------------------------------------------------------------------------------------

BAD_EVAL = [
    (["--stride", "0"], "--stride"),
    (["--stride", "-1"], "--stride"),
    (["--lengths", "1,x"], "--lengths"),
    (["--lengths", "0"], "positive"),
    (["--name", "../../../x"], "plain file name"),
    (["--name", ".hidden"], "plain file name"),
    (["--step", "999"], "no checkpoint at step 999"),
    (["--factor", "2"], "--factor needs --rope-scaling"),
    (["--position-option", "scale"], "key=value"),
    (["--position-option", "nosuch=1"], "no option"),
    (["--lengths", "1000"], "no held-out document"),
    (["--split", "holdout"], "--split"),
    (["--max-tokens", "0"], "--max-tokens"),
]


@pytest.mark.parametrize("extra,fragment", BAD_EVAL, ids=[f"{e[0]}={e[-1]}" for e, _ in BAD_EVAL])
def test_bad_eval_arguments(extra, fragment, trained, tiny_data, cache):
    assert_user_error(
        ["eval", str(trained), "--no-progress", *extra],
        cache=cache,
        watch=[trained, tiny_data],
        fragments=[fragment],
    )


def test_eval_of_a_directory_that_is_not_a_run(scratch, cache):
    (scratch / "empty").mkdir()
    assert_user_error(["eval", str(scratch / "empty")], cache=cache, fragments=["not a run directory"])


def test_eval_refuses_a_symlinked_results_dir(trained, scratch, cache):
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir()
    copy = scratch / "copy"
    shutil.copytree(trained, copy)
    shutil.rmtree(copy / "eval", ignore_errors=True)  # other tests may have evaluated the shared run
    (copy / "eval").symlink_to(elsewhere, target_is_directory=True)
    assert_user_error(
        ["eval", str(copy), "--lengths", "1", "--no-progress"],
        cache=cache,
        watch=[copy, elsewhere],
        fragments=["symlink"],
    )
    assert list(elsewhere.iterdir()) == []


# ---- generate, extend, compare, report, export, passkey ---------------------------------------

BAD_GENERATE = [
    (["--temperature", "-1"], "--temperature"),
    (["--top-k", "-5"], "--top-k"),
    (["--top-p", "7"], "--top-p"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
]


@pytest.mark.parametrize("extra,fragment", BAD_GENERATE, ids=[f[1] for f in BAD_GENERATE])
def test_bad_sampling_settings(extra, fragment, trained, cache):
    assert_user_error(
        ["generate", str(trained), "--prompt", "Fellow", *extra],
        cache=cache,
        watch=[trained],
        fragments=[fragment],
    )


def test_generate_needs_exactly_one_prompt(trained, cache):
    assert_user_error(["generate", str(trained)], cache=cache, watch=[trained], fragments=["exactly one"])


BAD_EXTEND = [
    (["--method", "zigzag"], "unknown extension method"),
    (["--method", "chunk", "--factor", "0"], "--factor"),
    (["--method", "chunk", "--alpha", "0.3"], "whole number"),
    (["--method", "full", "--alpha", "0.5"], "alpha applies"),
    (["--method", "chunk", "--set", "train.lr=-1"], "train.lr"),
]


@pytest.mark.parametrize("extra,fragment", BAD_EXTEND, ids=[f[1] for f in BAD_EXTEND])
def test_bad_extension(extra, fragment, trained, scratch, cache):
    assert_user_error(
        ["extend", str(trained), "--out", str(scratch / "ext"), "--no-progress", *extra],
        cache=cache,
        watch=[trained],
        fragments=[fragment],
    )
    assert not (scratch / "ext" / "config.toml").exists()


def test_extension_of_a_missing_run(scratch, cache):
    assert_user_error(
        ["extend", str(scratch / "missing"), "--method", "chunk"],
        cache=cache,
        fragments=["not a run directory"],
    )


def test_bad_sweep_files(scratch, cache):
    bad = scratch / "bad.toml"
    bad.write_text('[[rows]]\nname = "A"\nposition = { name = "rope" }\n')
    assert_user_error(
        ["compare", str(bad), "--out", str(scratch / "cmp")],
        cache=cache,
        watch=[bad],
        fragments=["unknown key 'position'"],
    )
    bad.write_text('lengths = "all"\n[[rows]]\nname = "A"\n')
    assert_user_error(
        ["compare", str(bad), "--out", str(scratch / "cmp")], cache=cache, watch=[bad], fragments=["lengths"]
    )
    bad.write_text("title = \n")
    assert_user_error(
        ["compare", str(bad), "--out", str(scratch / "cmp")],
        cache=cache,
        watch=[bad],
        fragments=["not valid TOML"],
    )


def test_report_never_reads_outside_the_sweep(scratch, cache):
    sweep = scratch / "sweep"
    sweep.mkdir()
    secret = scratch / "secret.json"
    secret.write_text(json.dumps({"results": []}))
    (sweep / "rows.json").write_text(json.dumps([{"name": "x", "eval": "../secret.json"}]))
    assert_user_error(["report", str(sweep)], cache=cache, watch=[sweep, secret], fragments=["outside"])
    (sweep / "rows.json").write_text("[{")
    assert_user_error(["report", str(sweep)], cache=cache, watch=[sweep], fragments=["damaged"])


def test_export_of_an_encoding_hugging_face_lacks(tiny_data, scratch, cache):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run = scratch / "expe"
    train(
        load_config(
            "cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 1, "model.positions.name": "expe"})
        ),
        run,
        progress=False,
    )
    assert_user_error(
        ["export", str(run), "--out", str(scratch / "hf"), "--format", "hf"],
        cache=cache,
        watch=[run],
        fragments=["expe"],
    )
    assert not (scratch / "hf").exists()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, tiny_data):
    """A finished 3-step masked-LM run of a one-layer encoder."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run = tmp_path_factory.mktemp("runs") / "encoder"
    train(load_config("cpu/tiny", encoder_overrides(tiny_data)), run, progress=False)
    return run


ENCODER_MISTAKES = [
    (["eval", "{encoder}", "--stride", "8"], ["drop --stride"]),
    (
        ["export", "{encoder}", "--out", "{out}", "--format", "hf"],
        ["encoder run", "--format sentence-transformers"],
    ),
    (["export", "{trained}", "--out", "{out}", "--format", "sentence-transformers"], ["decoder run"]),
    (["export", "{trained}", "--out", "{out}", "--pooling", "cls"], ["--pooling applies to --format"]),
    (["export", "{encoder}", "--out", "{encoder}", "--format", "sentence-transformers"], ["already exists"]),
]


@pytest.mark.parametrize(
    "args,fragments", ENCODER_MISTAKES, ids=[" ".join(a[:1] + a[3:]) for a, _ in ENCODER_MISTAKES]
)
def test_encoder_commands_refuse_what_does_not_apply(
    args, fragments, encoder, trained, tiny_data, scratch, cache
):
    paths = {"encoder": encoder, "trained": trained, "out": scratch / "exported"}
    assert_user_error(
        [a.format(**paths) for a in args],
        cache=cache,
        watch=[encoder, trained, tiny_data],
        fragments=fragments,
    )
    assert not (scratch / "exported").exists()


def test_passkey_with_bad_depths_and_modes(trained, cache):
    assert_user_error(
        ["passkey", str(trained), "--depths", "0,2"], cache=cache, watch=[trained], fragments=["depths"]
    )
    assert_user_error(
        ["passkey", str(trained), "--mode", "guess"], cache=cache, watch=[trained], fragments=["mode"]
    )


def test_compare_checks_the_held_out_split_before_training(tiny_data, scratch, cache):
    sweep = scratch / "long.toml"
    sweep.write_text(
        'train = "cpu/tiny"\nlengths = [1, 1000]\n'
        f'set = ["data.dir=\\"{tiny_data}\\"", "model.vocab_size=512", "model.train_length=32"]\n'
        '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'
    )
    assert_user_error(
        ["compare", str(sweep), "--out", str(scratch / "cmp")],
        cache=cache,
        watch=[tiny_data],
        fragments=["No test document", "32,001 tokens"],
    )
    assert not (scratch / "cmp" / "runs").exists()  # nothing was trained


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["eval"], "the following arguments are required: run"),
        (["train", "--nosuch"], "unrecognized arguments: --nosuch"),
        (["data", "prepare", "--max-docs", "abc"], "invalid int value"),
    ],
)
def test_argument_errors_are_one_sentence(args, fragment, cache):
    assert_user_error(args, cache=cache, fragments=[fragment])


def test_a_missing_device_is_named_as_the_caller_spelled_it(monkeypatch):
    """resolve_device names the config key or the command-line flag it was given, never another."""
    import torch

    from extrapos.errors import UserError
    from extrapos.run.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", "--device").type == "cpu"
    with pytest.raises(UserError, match=r"^train\.device is 'cuda' .*set train\.device=cpu \(or auto\)\.$"):
        resolve_device("cuda")
    with pytest.raises(UserError, match=r"^--device is 'cuda:1' .*pass --device cpu \(or auto\)\.$"):
        resolve_device("cuda:1", "--device")
    with pytest.raises(UserError, match=r"^--device 'gpu0' is not a device; pass --device cpu"):
        resolve_device("gpu0", "--device")


@pytest.mark.parametrize(
    "command",
    [["eval"], ["passkey"], ["synthetic-eval"], ["generate", "--prompt", "The"]],
    ids=lambda c: c[0],
)
def test_commands_name_their_device_flag(trained, cache, command):
    """eval, passkey, synthetic-eval and generate say --device (not train.device) when CUDA is absent."""
    args = [command[0], str(trained), *command[1:], "--device", "cuda"]
    sentence = assert_user_error(
        args,
        cache=cache,
        watch=[trained],
        fragments=["--device", "no CUDA device"],
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert "train.device" not in sentence


def test_bf16_on_a_cpu_without_native_bf16_is_said_once(monkeypatch, capsys, console):
    import torch

    from extrapos.run import runtime

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not runtime.cpu_has_fast_bf16()
    runtime.warn_slow_bf16(torch.device("cpu"), "bf16")
    out = capsys.readouterr().out
    assert "no native bf16" in out and "AVX2" in out and "train.precision=fp32" in out
    runtime.warn_slow_bf16(torch.device("cpu"), "fp32")
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512_BF16")
    assert runtime.cpu_has_fast_bf16()


def test_bench_report_skips_bf16_columns_with_a_note():
    from extrapos.bench import format_bench
    from extrapos.bench.resolution import position_resolution

    row = {"step_ms": 10.0, "ratio": 1.0, "mfu": 0.5}
    r = {
        "settings": {
            "size": "cpu-tiny",
            "vocab": 64,
            "train_length": 32,
            "batch": 2,
            "threads": 1,
            "torch": "x",
            "eval_lengths": [1],
        },
        "machine": {
            "cpu_capability": "AVX2",
            "matmul_peak_gflops_fp32": 100.0,
            "matmul_peak_gflops_bf16": None,
        },
        "train_fp32": {"nope": row},
        "train_bf16": None,
        "eval_time": {"nope": {"time_ms_1x": 1.0}},
        "eval_memory": {"nope": {"peak_mb_1x": 1.0}},
        "generation": {
            "nope": {"decode_ms": 1.0, "cached_tok_s": 1.0, "recompute_tok_s": 1.0, "cache_speedup": 1.0}
        },
        "resolution": position_resolution(train_length=32, multiples=(1,)),
        "wall_time_s": 1.0,
    }
    text = format_bench(r)
    assert "bf16 columns are skipped" in text and "| nope | 10.0 (1.00) | 50.0% | skipped | - |" in text
