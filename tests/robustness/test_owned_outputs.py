"""One write discipline for every writer (issue 37, items 3 and 4): a writer creates or replaces only files
it owns, and never writes inside a run's own tree.

``extrapos doctor --json RUN/config.toml`` replaced the run's config (the run was then unusable), or any
user's file; ``extend RUN --out RUN/checkpoints/step-22`` (or ``RUN/eval/x``, ``RUN/checkpoints``) made a
run that RUN's checkpoint pruning later deleted with its weights and results. Each writer now checks its
output before any work (``extrapos.owned``): exit status 2, one sentence, every file kept, nothing new.
"""

from __future__ import annotations

import json
import shutil

import pytest
from harness import assert_user_error, run

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data)), run_dir, progress=False)
    return run_dir


@pytest.fixture
def home(trained, scratch):
    """``scratch/home``: a copy of the run (``home/run``) and two files of the user (mine.json, mine.png)."""
    folder = scratch / "home"
    shutil.copytree(trained, folder / "run")
    (folder / "mine.json").write_text('{"mine": true}\n')
    (folder / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\n my holiday picture")
    return folder


def files_under(root):
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def refused(args, home, cache, *fragments):
    names = files_under(home)
    sentence = assert_user_error(args, cache=cache, watch=[home], fragments=fragments)
    assert files_under(home) == names  # nothing new, inside the run or beside it
    return sentence


INSIDE = ["run/config.toml", "run/eval/doctor.json", "run/checkpoints/step-8/x.json"]


@pytest.mark.parametrize("target", INSIDE)
def test_doctor_json_never_writes_into_a_run(target, home, cache):
    refused(
        ["doctor", "--encodings", "nope", "--no-speed", "--json", str(home / target)],
        home,
        cache,
        "inside the run",
    )


def test_doctor_json_never_replaces_a_users_file(home, cache):
    args = ["doctor", "--encodings", "nope", "--no-speed", "--no-progress", "--json"]
    refused([*args, str(home / "mine.json")], home, cache, "not a file extrapos doctor wrote")
    # its own report is written, and replaced by the next doctor
    out = home / "doctor.json"
    assert run([*args, str(out)], cache=cache).returncode == 0 and "checks" in json.loads(out.read_text())
    again = run([*args, str(out)], cache=cache)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    "target", ["run/checkpoints/step-22", "run/eval/x", "run/checkpoints", "run/sub/deeper"]
)
def test_extend_out_never_inside_the_parent_run(target, home, cache):
    args = ["extend", str(home / "run"), "--method", "chunk", "--tokens", "256", "--no-progress", "--out"]
    refused([*args, str(home / target)], home, cache, "inside the run", "--out")


def test_train_out_never_inside_a_run(home, tiny_data, cache):
    args = [
        "train",
        "--config",
        "cpu/tiny",
        "--out",
        str(home / "run" / "checkpoints" / "step-9"),
        "--no-progress",
    ]
    for s in tiny_overrides(tiny_data):
        args += ["--set", s]
    refused(args, home, cache, "inside the run")


@pytest.mark.parametrize(
    "command",
    [
        ["export", "{run}", "--out", "{run}/checkpoints/hf"],
        ["compare", "quick", "--out", "{run}/compare", "--no-progress"],
        ["bench", "--quick", "--out", "{run}/bench.md"],
    ],
    ids=["export", "compare", "bench"],
)
def test_other_writers_never_write_into_a_run(command, home, cache):
    args = [part.replace("{run}", str(home / "run")) for part in command]
    refused(args, home, cache, "inside the run")


def test_plots_and_tables_never_replace_a_users_file(home, cache):
    run_dir = str(home / "run")
    refused(
        ["passkey", run_dir, "--lengths", "1", "--trials", "1", "--plot", str(home / "mine.png")],
        home,
        cache,
        "not a file an extrapos plot wrote",
    )
    (home / "other").mkdir()
    shutil.copytree(home / "run", home / "other" / "run")
    refused(
        [
            "passkey",
            run_dir,
            "--lengths",
            "1",
            "--trials",
            "1",
            "--plot",
            str(home / "other" / "run" / "p.png"),
        ],
        home,
        cache,
        "inside the run",
    )
    (home / "mine.md").write_text("# my notes\n")
    refused(
        ["bench", "--quick", "--out", str(home / "mine.md")], home, cache, "not a file extrapos bench wrote"
    )


def test_report_out_is_new_or_its_own(home, cache):
    ev = run(
        ["eval", str(home / "run"), "--lengths", "1", "--max-tokens", "256", "--no-progress"], cache=cache
    )
    assert ev.returncode == 0, ev.stderr
    mine = home / "notes"
    mine.mkdir()
    (mine / "report.md").write_text("# my own report\n")
    (mine / "todo.txt").write_text("things\n")
    refused(["report", str(home / "run"), "--out", str(mine)], home, cache, "not made by extrapos report")
    refused(
        ["report", str(home / "run"), "--out", str(home / "run" / "report")], home, cache, "inside the run"
    )
    out = home / "rep"
    for _ in range(2):  # made, then replaced by the next report
        done = run(["report", str(home / "run"), "--out", str(out)], cache=cache)
        assert done.returncode == 0, done.stderr
    assert (out / "report.md").is_file() and (out / ".extrapos-report").is_file()
