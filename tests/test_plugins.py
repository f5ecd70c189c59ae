"""Plug-ins from an outside package (issue 45): examples/extrapos-toy-plugin, made visible the way pip
makes an installed package visible (its source on the path and a dist-info with its entry points, read
from its own pyproject.toml), gives `extrapos` an encoding and a corpus; a broken plug-in is named in
one warning and breaks nothing."""

from __future__ import annotations

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
