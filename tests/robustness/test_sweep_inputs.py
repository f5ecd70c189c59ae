"""A comparison sweep is validated whole before its first row trains (issue 24): lengths, max_eval_tokens,
task options, rows that reuse themselves, rows whose names share a directory, unknown eval options; and
compare's advice names only what compare can do. Each refusal: exit status 2, one sentence, no traceback,
nothing trained (no OUT/runs), every existing file unchanged.
"""

from __future__ import annotations

import shutil

import pytest
from harness import assert_user_error, run

from tests.conftest import tiny_overrides

ROWS = '[[rows]]\nname = "RoPE"\npositions = { name = "rope" }\n'


def sweep_text(tiny_data, body: str, head: str = "lengths = [1, 2]\n") -> str:
    overrides = [s.replace('"', '\\"') for s in tiny_overrides(tiny_data)]
    return 'train = "cpu/tiny"\n' + head + "set = [" + ", ".join(f'"{o}"' for o in overrides) + "]\n" + body


def refused(sweep, tiny_data, scratch, cache, fragments, extra=()):
    out = scratch / "cmp"
    sentence = assert_user_error(
        ["compare", str(sweep), "--out", str(out), *extra],
        cache=cache,
        watch=[sweep, tiny_data],
        fragments=fragments,
    )
    assert not (out / "runs").exists()  # nothing was trained
    return sentence


@pytest.mark.parametrize(
    "head,body,fragments",
    [
        ("lengths = []\n", ROWS, ["lengths must be a non-empty list"]),
        ("lengths = [0, -1]\n", ROWS, ["lengths must be a non-empty list", "[0, -1]"]),
        ("lengths = [1]\nmax_eval_tokens = -5\n", ROWS, ["max_eval_tokens must be a positive", "-5"]),
        ("lengths = [1]\nmax_eval_tokens = 0\n", ROWS, ["max_eval_tokens must be a positive"]),
        (
            'lengths = [4]\ntasks = ["passkey"]\npasskey = { trials = -2 }\n',
            ROWS,
            ["passkey.trials must be at least 1", "-2"],
        ),
        (
            'lengths = [4]\ntasks = ["passkey"]\npasskey = { candidates = 1000000 }\n',
            ROWS,
            ["passkey.candidates must be between 2 and"],
        ),
        (
            'lengths = [4]\ntasks = ["passkey"]\npasskey = { seed = -1 }\n',
            ROWS,
            ["passkey.seed must be a non-negative"],
        ),
        (
            'lengths = [1]\ntasks = ["synthetic"]\nsynthetic = { examples = 0 }\n',
            ROWS,
            ["synthetic.examples must be at least 1"],
        ),
        (
            'lengths = [1]\ntasks = ["lm-eval"]\nlm_eval = { tasks = ["arc_easy"], limit = -3 }\n',
            ROWS,
            ["lm_eval.limit must be a positive"],
        ),
        (
            'lengths = [1]\ntasks = ["lm-eval"]\nlm_eval = { tasks = ["arc_easy"], batch_size = 0 }\n',
            ROWS,
            ["lm_eval.batch_size must be a positive"],
        ),
        (
            "lengths = [1]\n",
            ROWS + '[[rows]]\nname = "self"\nreuse = "self"\n',
            ["row 'self' reuses 'self'", "never itself"],
        ),
        (
            "lengths = [1]\n",
            ROWS + '[[rows]]\nname = "b"\nreuse = "RoPE"\n[[rows]]\nname = "c"\nreuse = "b"\n',
            ["row 'c' reuses 'b'", "reuse row"],
        ),
        (
            "lengths = [1]\n",
            ROWS + '[[rows]]\nname = "rope"\npositions = { name = "alibi" }\n',
            ["rows 'RoPE' and 'rope'", "'rope'", "rename one"],
        ),
        (
            "lengths = [1]\n",
            '[[rows]]\nname = "A-B"\npositions = { name = "rope" }\n'
            '[[rows]]\nname = "A_B"\npositions = { name = "alibi" }\n',
            ["rows 'A-B' and 'A_B'", "rename one"],
        ),
        (
            "lengths = [1]\n",
            ROWS + '[[rows]]\nname = "RoPE nosuch"\nreuse = "RoPE"\neval = { nosuch = 1 }\n',
            ["row 'RoPE nosuch' eval options nosuch=1", "no option nosuch"],
        ),
        (
            "lengths = [1]\n",
            ROWS + '[[rows]]\nname = "RoPE base0"\nreuse = "RoPE"\neval = { base = 0 }\n',
            ["row 'RoPE base0' eval options base=0", "greater than 1"],
        ),
        (  # a string option is a choice, refused before any row trains as a number out of bounds is
            "lengths = [1]\n",
            ROWS + '[[rows]]\nname = "RoPE bogus"\nreuse = "RoPE"\neval = { scaling = "bogus" }\n',
            ["row 'RoPE bogus' eval options scaling=bogus", "one of 'linear', 'ntk'"],
        ),
        (
            'lengths = [4]\ntasks = ["passkey"]\npasskey = { trials = 100000000000 }\n',
            ROWS,
            ["row 'RoPE'", "of memory", "passkey.trials"],
        ),
        (
            'lengths = [10000000]\nloss = false\ntasks = ["synthetic"]\n'
            'synthetic = { task = "synthetic:copy" }\n',
            ROWS,
            ["row 'RoPE'", "of memory", "synthetic.examples"],
        ),
    ],
    ids=[
        "lengths-empty",
        "lengths-negative",
        "max_eval_tokens-negative",
        "max_eval_tokens-zero",
        "passkey-trials",
        "passkey-candidates",
        "passkey-seed",
        "synthetic-examples",
        "lm_eval-limit",
        "lm_eval-batch_size",
        "reuse-itself",
        "reuse-a-reuse-row",
        "slug-case",
        "slug-punctuation",
        "eval-unknown-option",
        "eval-nan-option",
        "eval-unknown-choice",
        "passkey-memory",
        "synthetic-memory",
    ],
)
def test_the_whole_sweep_is_checked_before_training(head, body, fragments, tiny_data, scratch, cache):
    sweep = scratch / "sweep.toml"
    sweep.write_text(sweep_text(tiny_data, body, head))
    refused(sweep, tiny_data, scratch, cache, fragments)


def test_max_eval_tokens_flag_zero_is_refused_not_replaced(tiny_data, scratch, cache):
    sweep = scratch / "sweep.toml"
    sweep.write_text(sweep_text(tiny_data, ROWS))
    refused(
        sweep,
        tiny_data,
        scratch,
        cache,
        ["--max-eval-tokens must be a positive", "0"],
        ["--max-eval-tokens", "0"],
    )
    refused(
        sweep,
        tiny_data,
        scratch,
        cache,
        ["--max-eval-tokens must be a positive"],
        ["--max-eval-tokens", "-1"],
    )


def test_compare_advice_names_what_compare_can_do(tiny_data, scratch, cache):
    """An existing run (run = row) whose eval/ holds another evaluation under the name the sweep's request
    takes: compare has no --name or --overwrite, so its sentence names neither."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    source = scratch / "imported"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2})), source, progress=False)
    first = run(["eval", source, "--lengths", "1", "--max-tokens", "256", "--no-progress"], cache=cache)
    assert first.returncode == 0, first.stderr
    sweep = scratch / "sweep.toml"
    sweep.write_text(f'lengths = [1]\nmax_eval_tokens = 512\n[[rows]]\nname = "R"\nrun = "{source}"\n')
    sentence = assert_user_error(
        ["compare", str(sweep), "--out", str(scratch / "cmp"), "--no-progress"],
        cache=cache,
        watch=[source, sweep],
        fragments=["other settings than this sweep's", "never replaces", "move that file away"],
    )
    assert "--name" not in sentence and "--overwrite" not in sentence
    shutil.rmtree(scratch / "cmp", ignore_errors=True)


def test_task_columns_refuse_an_encoder_row_before_training(tiny_data, scratch, cache):
    from tests.conftest import encoder_overrides

    overrides = [s.replace('"', '\\"') for s in encoder_overrides(tiny_data)]
    sweep = scratch / "sweep.toml"
    sweep.write_text(
        'train = "cpu/tiny"\nlengths = [4]\ntasks = ["passkey"]\n'
        + "set = ["
        + ", ".join(f'"{o}"' for o in overrides)
        + "]\n"
        + '[[rows]]\nname = "enc"\npositions = { name = "rope" }\n'
    )
    refused(sweep, tiny_data, scratch, cache, ["row 'enc' is an encoder", "task columns (passkey)"])
