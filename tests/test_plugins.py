"""Plug-ins from an outside package (issue 45): examples/extrapos-toy-plugin, made visible the way pip
makes an installed package visible (its source on the path and a dist-info with its entry points, read
from its own pyproject.toml), gives `extrapos` an encoding and a corpus; a broken plug-in is named in
one warning and breaks nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extrapos.presets import tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "extrapos-toy-plugin"


def install_like_pip(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> None:
    """A dist-info in ``site`` as pip writes one: METADATA and entry_points.txt (what importlib reads)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for group, eps in entry_points.items()
        )
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    install_like_pip(site, project["name"], project["version"], project["entry-points"])
    return site


def extrapos(site: Path | list[Path], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m extrapos ARGS`` where the dist-infos in ``site`` (one folder or several) are installed."""
    sites = [str(p) for p in (site if isinstance(site, list) else [site])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sites, str(EXAMPLE / "src"), str(ROOT / "src")])}
    return subprocess.run(
        [sys.executable, "-m", "extrapos", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def test_the_plugin_encoding_is_listed_and_conforms(site):
    listed = extrapos(site, "encodings")
    assert listed.returncode == 0, listed.stderr
    assert "toy-log-bias" in listed.stdout and "rope" in listed.stdout
    checked = extrapos(site, "check-encoding", "toy-log-bias", "--no-export")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "conforms: every check holds" in checked.stdout


def test_a_run_trains_on_the_plugin_encoding_and_corpus(site, tmp_path):
    """A config names both by their plug-in names; the corpus is prepared under its name (a word, kept
    as it is, not taken for a path) and the run trains."""
    run = tmp_path / "run"
    done = extrapos(
        site,
        "train",
        "--config",
        "cpu/tiny",
        "--out",
        str(run),
        "--no-progress",
        "--set",
        'model.positions={name="toy-log-bias"}',
        "--set",
        'data.corpus="toy-counting"',
        "--set",
        'data.tokenizer="bpe:300"',
        "--set",
        "model.vocab_size=300",
        "--set",
        "train.steps=3",
        "--set",
        "train.threads=1",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run / "summary.json").is_file()
    config = (run / "config.toml").read_text()
    assert 'name = "toy-log-bias"' in config and 'corpus = "toy-counting"' in config


def test_a_broken_plugin_is_named_and_breaks_nothing(site, tmp_path):
    broken = tmp_path / "broken-site"
    install_like_pip(broken, "broken-plugin", "0.3", {"extrapos.encodings": {"bad": "no_such_module_here"}})
    listed = extrapos([broken, site], "encodings")
    assert listed.returncode == 0, listed.stderr
    assert "rope" in listed.stdout and "toy-log-bias" in listed.stdout  # the others still load
    warning = [line for line in listed.stderr.splitlines() if "skipped the encoding plug-in" in line]
    assert len(warning) == 1 and "'bad'" in warning[0] and "broken-plugin 0.3" in warning[0]
    assert "ModuleNotFoundError" in warning[0] and "fix that package or uninstall it" in warning[0]


def test_an_unknown_corpus_names_the_plugin_corpora(site):
    done = extrapos(site, "data", "prepare", "--corpus", "no-such-corpus")
    assert done.returncode == 2
    assert "toy-counting" in done.stderr and "Unknown corpus 'no-such-corpus'" in done.stderr


def test_a_plugin_task_is_a_command_a_sweep_column_and_a_report_section(site, tmp_path):
    """Issue 45: the toy task lives in one file of the plug-in package (extrapos_toy/task.py) and nothing of
    extrapos names it; installed, it is a command, a sweep's column and its report section (re-rendered by
    `extrapos report` the same)."""
    run = tmp_path / "run"
    trained = extrapos(
        site,
        "train",
        "--config",
        "cpu/tiny",
        "--out",
        str(run),
        "--no-progress",
        "--set",
        "train.steps=3",
        "--set",
        "train.threads=1",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr
    listed = extrapos(site, "--help")
    assert "toy-repeat" in listed.stdout and "passkey" in listed.stdout  # beside the built-in commands
    flags = extrapos(site, "toy-repeat", "--help")
    assert "--examples EXAMPLES" in flags.stdout and "random sequences per length" in flags.stdout
    scored = extrapos(site, "toy-repeat", str(run), "--examples", "3", "--no-progress", "--device", "cpu")
    assert scored.returncode == 0, scored.stdout + scored.stderr
    assert "| ev | length | copy accuracy |" in scored.stdout and "| 2 |" in scored.stdout
    saved = run / "eval" / "toy-repeat-ev1_2.json"
    assert f"-> {saved}" in scored.stdout and saved.is_file()
    bad = extrapos(site, "toy-repeat", str(run), "--examples", "x")
    assert bad.returncode == 2 and "--examples" in bad.stderr

    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'title = "toy"\ntrain = "cpu/tiny"\nlengths = [1, 2]\nloss = false\ntasks = ["toy-repeat"]\n'
        "toy_repeat = { examples = 4 }\n"
        f'[[rows]]\nname = "RoPE"\nrun = "{run}"\n'
        f'[[rows]]\nname = "RoPE again"\nrun = "{run}"\n'
    )
    out = tmp_path / "out"
    compared = extrapos(site, "compare", str(sweep), "--out", str(out), "--no-progress", cwd=tmp_path)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    report = (out / "report.md").read_text()
    assert "Toy repeat (a plug-in task)" in report and "Copy accuracy (higher is better" in report
    assert "| RoPE again |" in report and (out / "plots" / "toy-repeat_vs_length.png").is_file()
    csv = (out / "tasks.csv").read_text().splitlines()
    assert sum(line.startswith("RoPE again,toy-repeat,2,") for line in csv) == 1
    row = json.loads((out / "tasks" / "toy-repeat" / "rope-again.json").read_text())
    assert [c["ev"] for c in row["results"]] == [1, 2] and row["request"]["examples"] == 4

    wrong = tmp_path / "wrong.toml"
    wrong.write_text(sweep.read_text().replace("examples = 4", "examples = 0"))
    refused = extrapos(site, "compare", str(wrong), "--out", str(tmp_path / "o2"), cwd=tmp_path)
    assert refused.returncode == 2 and "toy_repeat.examples must be at least 1, got 0." in refused.stderr

    before = report
    rerendered = extrapos(site, "report", str(out), cwd=tmp_path)
    assert rerendered.returncode == 0, rerendered.stderr
    assert (out / "report.md").read_text() == before


def test_without_the_plugin_its_sweep_column_is_refused_by_name(tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('tasks = ["toy-repeat"]\n[[rows]]\nname = "A"\npositions = { name = "rope" }\n')
    refused = extrapos([], "compare", str(sweep), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert (
        refused.returncode == 2 and "tasks must be distinct names from synthetic, passkey" in refused.stderr
    )
