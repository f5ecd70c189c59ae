"""Bad input to the task commands, eval's encoding options, generate's prompt, report and compare (issue 24,
items 10, 12 and the tracebacks and messages that could not be followed): exit status 2, one sentence that
names what to change, no traceback, every file that existed keeps its bytes, nothing new in the run.

One trained decoder run and one encoder run are shared by the tests (module scope); each test watches the
run it uses and the data it read.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from harness import assert_user_error, run

from tests.conftest import encoder_overrides, tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A finished 8-step decoder run on the tiny data (library call: seconds)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    out = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data)), out, progress=False)
    return out


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, tiny_data):
    """A finished 3-step masked-LM run of a one-layer encoder."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    out = tmp_path_factory.mktemp("runs") / "encoder"
    train(load_config("cpu/tiny", encoder_overrides(tiny_data)), out, progress=False)
    return out


def files_under(root):
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def refused(args, run_dir, cache, fragments, watch=()):
    """The contract, and no file appears in (or vanishes from) the run."""
    before = files_under(run_dir)
    sentence = assert_user_error(
        [str(a) for a in args], cache=cache, watch=[run_dir, *watch], fragments=fragments
    )
    assert files_under(run_dir) == before
    return sentence


# ---- item 10: an encoder is not scored as a decoder ------------------------------------------------------


def test_passkey_refuses_an_encoder_run(encoder, cache):
    refused(
        ["passkey", encoder, "--lengths", "1", "--trials", "1"],
        encoder,
        cache,
        ["encoder run", "objective mlm", "extrapos eval"],
    )


def test_lm_eval_refuses_an_encoder_run(encoder, cache):
    pytest.importorskip("lm_eval")
    refused(
        ["lm-eval", encoder, "--tasks", "arc_easy"],
        encoder,
        cache,
        ["encoder run", "objective mlm", "lm-eval"],
    )


def test_synthetic_eval_refuses_an_encoder_run(encoder, cache):
    refused(["synthetic-eval", encoder, "--lengths", "1"], encoder, cache, ["encoder run", "objective mlm"])


# ---- item 12: values that would save NaN results or be replaced silently --------------------------------


@pytest.mark.parametrize(
    "option,fragments",
    [
        ("base=0", ["base=0", "greater than 1"]),
        ("base=-1", ["base=-1", "greater than 1"]),
        ("base=abc", ["base=abc", "must be float"]),
        ("nosuch=1", ["nosuch=1", "no option nosuch"]),
    ],
)
def test_eval_refuses_an_encoding_option_before_scoring(option, fragments, trained, cache):
    sentence = refused(
        ["eval", trained, "--lengths", "1", "--position-option", option], trained, cache, fragments
    )
    assert "refused" in sentence


def test_passkey_refuses_a_nan_making_option(trained, cache):
    refused(
        ["passkey", trained, "--lengths", "1", "--trials", "1", "--position-option", "base=0"],
        trained,
        cache,
        ["base=0", "greater than 1"],
    )


def test_eval_of_a_binary_config(trained, scratch, cache):
    copy = scratch / "run"
    shutil.copytree(trained, copy)
    (copy / "config.toml").write_bytes(bytes(range(256)) * 4)
    refused(["eval", copy, "--lengths", "1"], copy, cache, ["config.toml", "not UTF-8"])


# ---- tracebacks: lm-eval's numbers, seeds, --plot, report, generate's prompt ------------------------------


# one value per flag by default (each case starts lm-eval: ~10 s); the other values in the slow tail
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--limit", "0"], "--limit must be a positive"),
        pytest.param(["--limit", "-3"], "--limit must be a positive", marks=SLOW),
        pytest.param(["--limit", "nan"], "--limit must be a positive", marks=SLOW),
        (["--batch-size", "0"], "--batch-size must be a positive integer"),
        pytest.param(["--batch-size", "-2"], "--batch-size must be a positive integer", marks=SLOW),
        (["--num-fewshot", "100"], "--num-fewshot must be between 0 and 64"),
        pytest.param(["--num-fewshot", "-1"], "--num-fewshot must be between 0 and 64", marks=SLOW),
        (["--metadata", "[1]"], "--metadata must be a JSON object"),
        pytest.param(["--metadata", "1"], "--metadata must be a JSON object", marks=SLOW),
        (["--max-length", "1"], "--max-length must be at least 2"),
    ],
)
def test_lm_eval_numbers_are_checked_before_any_work(extra, fragment, trained, cache):
    pytest.importorskip("lm_eval")
    refused(["lm-eval", trained, "--tasks", "arc_easy", *extra], trained, cache, [fragment])


@pytest.mark.parametrize(
    "command",
    [
        ["passkey", "--lengths", "1", "--trials", "1"],
        ["synthetic-eval", "--lengths", "1", "--task", "synthetic:copy"],
    ],
    ids=["passkey", "synthetic-eval"],
)
def test_a_negative_seed(command, trained, cache):
    refused([command[0], trained, *command[1:], "--seed", "-1"], trained, cache, ["--seed", "non-negative"])


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--key-digits", "30"], "--key-digits must be between 1 and 18"),
        (["--key-digits", "0"], "--key-digits must be between 1 and 18"),
        (["--candidates", "1"], "--candidates must be between 2 and"),
        (["--key-digits", "1", "--candidates", "6"], "--candidates must be between 2 and 4"),
    ],
)
def test_passkey_key_settings(extra, fragment, trained, cache):
    refused(["passkey", trained, "--lengths", "1", "--trials", "1", *extra], trained, cache, [fragment])


@pytest.mark.parametrize("target", ["config.toml", "summary.json", "plot.png", "eval/x.png"])
def test_passkey_plot_never_replaces_a_run_file(target, trained, cache):
    refused(
        ["passkey", trained, "--lengths", "1", "--trials", "1", "--plot", trained / target],
        trained,
        cache,
        ["--plot"],
    )


def test_passkey_plot_must_be_a_png_file(trained, scratch, cache):
    refused(
        ["passkey", trained, "--lengths", "1", "--trials", "1", "--plot", scratch / "heat.txt"],
        trained,
        cache,
        ["--plot", ".png"],
    )
    (scratch / "dir.png").mkdir()
    refused(
        ["passkey", trained, "--lengths", "1", "--trials", "1", "--plot", scratch / "dir.png"],
        trained,
        cache,
        ["--plot", "directory"],
    )


def test_passkey_validates_its_arguments_before_the_saved_result(trained, scratch, cache):
    """A name holding an earlier result: a bad argument is named first; a different request is refused with
    the command line's flags (--name, --overwrite)."""
    copy = scratch / "run"
    shutil.copytree(trained, copy)
    base = ["passkey", copy, "--lengths", "4", "--depths", "0.5", "--name", "pk"]
    first = run([*base, "--trials", "1", "--no-progress"], cache=cache)
    assert first.returncode == 0, first.stderr
    refused([*base, "--trials", "1", "--seed", "-1"], copy, cache, ["--seed"])
    refused([*base, "--trials", "1", "--candidates", "0"], copy, cache, ["--candidates"])
    sentence = refused([*base, "--trials", "2"], copy, cache, ["--name", "--overwrite"])
    assert "different evaluation" in sentence


def test_report_of_a_json_that_is_not_a_result(scratch, cache):
    other = scratch / "other.json"
    other.write_text(json.dumps({"a": 1}))
    assert_user_error(["report", other], cache=cache, watch=[scratch], fragments=["not a result"])
    other.write_text("[1, 2]")
    assert_user_error(["report", other], cache=cache, watch=[scratch], fragments=["not a result"])
    other.write_bytes(os.urandom(64) + b"\xff")
    assert_user_error(["report", other], cache=cache, watch=[scratch], fragments=["not a readable JSON"])
    assert not (scratch / "report").exists()


def test_generate_with_an_invalid_utf8_prompt(trained, scratch, cache):
    refused(
        ["generate", trained, "--prompt", os.fsdecode(b"abc \xff\xfe"), "--max-new-tokens", "1"],
        trained,
        cache,
        ["--prompt", "UTF-8"],
    )
    binary = scratch / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 800)  # 200 KB that is not UTF-8
    refused(
        ["generate", trained, "--prompt-file", binary, "--max-new-tokens", "1"],
        trained,
        cache,
        ["blob.bin", "not UTF-8"],
        watch=[binary],
    )
    nul = scratch / "nul.txt"
    nul.write_bytes(b"\x00" * 1000)
    refused(["generate", trained, "--prompt-file", nul], trained, cache, ["NUL"], watch=[nul])


@pytest.mark.parametrize("value", ["window", "max", 64])
def test_placeholder_option_values_pass_the_check(value, tiny_data):
    """Values an evaluation resolves itself (--interpolate's "window", "max") are not refused as strings."""
    from extrapos.errors import UserError
    from extrapos.run.config import load_config
    from extrapos.tasks.common import check_encoding_options

    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"model.positions.name": '"learned"'}))
    check_encoding_options(cfg, {"interpolate_to": value})
    with pytest.raises(UserError, match="interpolate_to=abc"):
        check_encoding_options(cfg, {"interpolate_to": "abc"})


def test_lm_eval_fewshot_beyond_the_task(trained, scratch, cache):
    """--num-fewshot within its bound but above what a task can draw from (three documents): exit 2, the
    last line of stderr one sentence (the harness logs its task loading above it), no traceback, no result
    written."""
    pytest.importorskip("lm_eval")
    from harness import PREFIX, SECOND_SENTENCE, assert_unchanged, snapshot

    from tests.integrations.test_lm_eval import CHOICE_DOCS, YAML

    tasks = scratch / "tasks"
    tasks.mkdir()
    (tasks / "choice.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CHOICE_DOCS))
    (tasks / "xp_choice.yaml").write_text(YAML["xp_choice"].format(dir=tasks))
    before, names = snapshot(trained, tasks), files_under(trained)
    result = run(
        ["lm-eval", trained, "--tasks", "xp_choice", "--include-path", tasks, "--num-fewshot", "5"],
        cache=cache,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(PREFIX) and not SECOND_SENTENCE.search(last[len(PREFIX) :]), last
    assert "--num-fewshot 5" in last and "xp_choice" in last and "lower --num-fewshot" in last
    assert_unchanged(before)
    assert files_under(trained) == names
