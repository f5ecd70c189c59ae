"""Every writer stays in its place (issue 24, first group): a user-given name is a name, never a path; a
result is reused, refused or replaced with --overwrite, never silently; a directory extrapos did not make
is never written into; a resume never trains a run again from step 0 or shortens it; a run that failed
before its first checkpoint can be retried.

Each refusal: exit status 2, one sentence, no traceback, every file that existed keeps its bytes and no
file appears outside the target directory.
"""

from __future__ import annotations

import json
import shutil

import pytest
from harness import Fault, assert_one_sentence_error, assert_unchanged, assert_user_error, run, snapshot

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A finished 8-step run on the tiny data, checkpoints at steps 4 and 8 (library call: seconds)."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.checkpoint_every": 4}))
    train(cfg, run_dir, progress=False)
    return run_dir


@pytest.fixture
def run_copy(trained, scratch):
    """The trained run copied into ``scratch/home/run``: ``scratch/home`` is the 'outside' watched for new
    files."""
    out = scratch / "home" / "run"
    shutil.copytree(trained, out)
    return out


def files_under(root):
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def train_args(data_dir, out, *, resume=False, **extra):
    args = ["train", "--out", str(out), "--no-progress"]
    if resume:
        args.append("--resume")
    else:
        args += ["--config", "cpu/tiny"]
    for s in tiny_overrides(data_dir, **extra) if not resume else [f"{k}={v}" for k, v in extra.items()]:
        args += ["--set", s]
    return args


# ---- 1. a result name is a name, never a path ------------------------------------------------------

PATH_NAMES = ["../checkpoints/step-8/state", "../summary", "../../x", "sub/x", "/tmp/x", ".hidden", ".."]


@pytest.mark.parametrize("name", PATH_NAMES)
def test_lm_eval_name_is_never_a_path(name, run_copy, cache):
    pytest.importorskip("lm_eval")
    home = run_copy.parent
    before = files_under(home)
    assert_user_error(
        ["lm-eval", str(run_copy), "--tasks", "arc_easy", "--name", name],
        cache=cache,
        watch=[home],
        fragments=["plain file name", "--name"],
    )
    assert files_under(home) == before  # nothing new, inside the run or beside it


@pytest.mark.parametrize(
    "command",
    [
        ["passkey", "--lengths", "1", "--trials", "1"],
        ["synthetic-eval", "--lengths", "1"],
        ["eval", "--lengths", "1"],
    ],
    ids=["passkey", "synthetic-eval", "eval"],
)
def test_every_result_name_is_checked(command, run_copy, cache):
    home = run_copy.parent
    before = files_under(home)
    assert_user_error(
        [command[0], str(run_copy), *command[1:], "--name", "../summary"],
        cache=cache,
        watch=[home],
        fragments=["plain file name"],
    )
    assert files_under(home) == before


# ---- 2. lm-eval: the same request is reused, another one is refused -----------------------------


def test_lm_eval_reuses_the_same_request_and_refuses_another(run_copy, scratch, cache):
    pytest.importorskip("lm_eval")
    from extrapos.integrations.lm_eval import run_lm_eval
    from tests.integrations.test_lm_eval import (  # the adapter tests' local multiple-choice task
        CHOICE_DOCS,
        YAML,
    )

    tasks = scratch / "tasks"
    tasks.mkdir()
    (tasks / "choice.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CHOICE_DOCS))
    (tasks / "xw_choice.yaml").write_text(
        YAML["xp_choice"].replace("task: xp_choice", "task: xw_choice").format(dir=tasks)
    )
    first = run_lm_eval(run_copy, ["xw_choice"], limit=3, include_path=tasks, include_defaults=False)
    saved = run_copy / "eval" / "lm-eval-xw_choice.json"
    assert json.loads(saved.read_text())["results"] == first["results"]
    assert first["checkpoint"]["step"] == 8 and len(first["checkpoint"]["weights_sha256"]) == 64

    # the identical request on the same weights: reused, the harness is not run again
    home = run_copy.parent
    before, names = snapshot(home), files_under(home)
    same = ["lm-eval", str(run_copy), "--tasks", "xw_choice", "--limit", "3", "--include-path", str(tasks)]
    result = run(same, cache=cache)
    assert result.returncode == 0, result.stderr
    assert "reused" in result.stdout and "xw_choice: acc" in result.stdout
    assert_unchanged(before)

    # another request under the same name (--limit 2 over --limit 3): refused, naming both ways out
    other = [*same[:5], "2", *same[6:]]
    assert_user_error(
        other, cache=cache, watch=[home], fragments=["holds a different evaluation", "--name", "--overwrite"]
    )
    assert files_under(home) == names


# ---- 3. compare never writes into a directory it did not make ------------------------------------


def test_compare_refuses_an_out_directory_of_the_users_own(scratch, cache):
    mine = scratch / "mine"
    mine.mkdir()
    (mine / "results.json").write_text('{"mine": true}\n')
    (mine / "report.md").write_text("# my own report\n")
    before = files_under(scratch)
    assert_user_error(
        ["compare", "quick", "--out", str(mine), "--no-progress"],
        cache=cache,
        watch=[mine],
        fragments=["not made by extrapos compare", "--out"],
    )
    assert files_under(scratch) == before


def test_compare_out_check_accepts_its_own_directories(scratch):
    from extrapos.compare import OUT_MARKER, check_out_dir
    from extrapos.errors import UserError

    check_out_dir(scratch / "new")  # does not exist yet
    (scratch / "empty").mkdir()
    check_out_dir(scratch / "empty")
    marked = scratch / "marked"
    marked.mkdir()
    (marked / OUT_MARKER).write_text("{}")
    (marked / "report.md").write_text("x")
    check_out_dir(marked)
    older = scratch / "older"  # a comparison of an extrapos from before the marker
    (older / "runs" / "rope").mkdir(parents=True)
    (older / "runs" / "rope" / "config.toml").write_text("")
    (older / "report.md").write_text("x")
    check_out_dir(older)
    (scratch / "afile").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_out_dir(scratch / "afile")
    (older / "notes.txt").write_text("mine")  # a file no comparison writes
    with pytest.raises(UserError, match="not made by extrapos compare"):
        check_out_dir(older)


# ---- 4 and 5. a resume never trains again from step 0, never shortens a run ----------------------


def test_resume_with_every_checkpoint_damaged_is_refused(run_copy, tiny_data, cache):
    for ckpt in (run_copy / "checkpoints").iterdir():
        (ckpt / "model.safetensors").write_bytes(b"")
    (run_copy / "summary.json").unlink()  # an unfinished run: --resume would train
    home = run_copy.parent
    names = files_under(home)
    assert_user_error(
        ["train", "--out", str(run_copy), "--resume", "--no-progress"],
        cache=cache,
        watch=[home, tiny_data],
        fragments=["every checkpoint", "damaged", "--out"],
    )
    assert files_under(home) == names


@pytest.mark.parametrize("budget", ["train.steps=4", "train.tokens=1"])
def test_resume_with_a_smaller_budget_is_refused(budget, run_copy, tiny_data, cache):
    home = run_copy.parent
    names = files_under(home)
    assert_user_error(
        ["train", "--out", str(run_copy), "--resume", "--set", budget, "--no-progress"],
        cache=cache,
        watch=[home, tiny_data],
        fragments=["already at step 8", "train.steps=8"],
    )
    assert files_under(home) == names


# ---- 6. values that make step 1 NaN are refused; a run that failed before a checkpoint is retried ---

NAN_AT_STEP_1 = [
    ({"train.lr": 1e6}, "train.lr"),
    ({"train.lr": "nan"}, "train.lr"),
    ({"train.end_lr": 5}, "train.end_lr"),
    ({"model.positions.base": 0}, "model.positions.base"),
    ({"model.positions.base": -2}, "model.positions.base"),
    ({"model.norm_eps": -1}, "model.norm_eps"),
    ({"model.norm_eps": "inf"}, "model.norm_eps"),
]


@pytest.mark.parametrize(
    "extra,key", NAN_AT_STEP_1, ids=[f"{k}={list(e.values())[0]}" for e, k in NAN_AT_STEP_1]
)
def test_values_that_make_step_one_nan_are_refused_up_front(extra, key, tiny_data, scratch, cache):
    assert_user_error(
        train_args(tiny_data, scratch / "run", **extra), cache=cache, watch=[tiny_data], fragments=[key]
    )
    assert not (scratch / "run").exists()


@pytest.mark.parametrize(
    "fault",
    [
        Fault("extrapos.training.trainer:Trainer.train_step"),  # killed at step 1
        Fault("extrapos.training.trainer:Trainer.train_step", error=28),  # ENOSPC at step 1: one sentence
    ],
    ids=["killed", "failed"],
)
def test_a_run_that_failed_before_its_first_checkpoint_is_retried(fault, tiny_data, scratch, cache):
    out = scratch / "run"
    args = train_args(tiny_data, out, **{"train.steps": 3})
    first = run(args, cache=cache, fault=fault)
    assert first.returncode != 0 and "Traceback" not in first.stderr
    assert (out / "config.toml").is_file() and not (out / "checkpoints").exists()

    retry = run(args, cache=cache)  # the same command: no "already holds a run"
    assert retry.returncode == 0, retry.stderr
    assert "starting it over" in retry.stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [s for s in steps if s is not None]
    assert sorted(set(train_steps)) == [1, 2, 3] and (out / "summary.json").is_file()

    # a finished run is never started over
    assert_user_error(args, cache=cache, watch=[out], fragments=["already holds a run"])


def test_a_failed_run_is_retried_with_a_corrected_value(tiny_data, scratch, cache):
    out = scratch / "run"
    fault = Fault("extrapos.training.trainer:Trainer.train_step", error=28)
    assert run(train_args(tiny_data, out, **{"train.steps": 2}), cache=cache, fault=fault).returncode == 2
    fixed = run(train_args(tiny_data, out, **{"train.steps": 2, "train.lr": 1e-3}), cache=cache)
    assert fixed.returncode == 0, fixed.stderr
    assert "lr = 0.001" in (out / "config.toml").read_text()
    assert_one_sentence_error(
        run(train_args(tiny_data, out, **{"train.steps": 2}), cache=cache), "already holds a run"
    )
