"""docs/results/peers-bench/README.md is generated whole (its first line says so, and the number guard takes
it as such): the command in its title, run again on the committed runs/*.json, renders it byte for byte,
so no number on it can differ from the runs it reports. Rendering needs the JSON only: no peer library,
no timing."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from extrapos.report.number_guard import GENERATED, check_page

ROOT = Path(__file__).resolve().parents[2]
FOLDER = Path("docs") / "results" / "peers-bench"
PAGE = ROOT / FOLDER / "README.md"


def _script():
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "benchmarks" / "bench_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _command(page: str) -> tuple[list[str], str]:
    """The arguments of the command in the page's title, and its note: the paragraph under the title, the
    one input the page gives back (--note, hand-written: when and where the runs were measured), which the
    title leaves out."""
    lines = page.split("\n")
    title = re.fullmatch(r"# extrapos against its peers \(`(.*)`\)", lines[1])
    assert title is not None, lines[1]
    argv = shlex.split(title.group(1))
    assert argv[:2] == ["python", "benchmarks/bench_peers.py"] and "--merge" in argv
    return argv[2:], page.split("\n\n")[1]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """The folder the title's command writes, run in a copy of the committed runs: the same relative paths,
    so the same title."""
    work = tmp_path_factory.mktemp("peers-bench")
    shutil.copytree(ROOT / FOLDER / "runs", work / FOLDER / "runs")
    argv, note = _command(PAGE.read_text())
    threads = torch.get_num_threads()  # the script sets its --threads for the whole process
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(work)
            assert _script().main([*argv, "--note", note]) == 0
    finally:
        torch.set_num_threads(threads)
    return work / FOLDER


def _differing_lines(page: str, rendered: str) -> list[int]:
    """1-based numbers of the page's lines that differ from the rendering's."""
    a, b = page.split("\n"), rendered.split("\n")
    return [i + 1 for i in range(max(len(a), len(b))) if a[i : i + 1] != b[i : i + 1]]


def test_the_page_is_its_runs_rendered_again(regenerated):
    page = PAGE.read_text()
    assert page.startswith(GENERATED)
    assert _differing_lines(page, (regenerated / "README.md").read_text()) == []
    assert (regenerated / "results.json").read_bytes() == (ROOT / FOLDER / "results.json").read_bytes()
    checked = check_page(PAGE, ROOT)  # generated whole: the guard counts its numbers and ties none
    assert checked.errors == [] and checked.generated > 300 and checked.tied == 0


@pytest.mark.parametrize("number", ["| 2.153 [2.099", "| 0.15 (0.15", "| 1124.8 |", "| 33.71 ["])
def test_a_changed_number_on_the_page_is_reported_naming_its_line(regenerated, number):
    """A copy of the page with one digit changed (a training time, a ratio, a peak memory, a decoding
    time) differs from the rendering on that line alone."""
    page = PAGE.read_text()
    at = page.index(number)
    digit_at = at + max(i for i, c in enumerate(number) if c.isdigit())
    changed = page[:digit_at] + ("1" if page[digit_at] != "1" else "2") + page[digit_at + 1 :]
    line = page[:at].count("\n") + 1
    assert _differing_lines(changed, (regenerated / "README.md").read_text()) == [line]
