"""The library logs and prints nothing of its own; ``extrapos <command>`` prints what it logs (console.py)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from extrapos.cli import main
from extrapos.console import ABOVE_BARS, STDERR, console
from extrapos.data import prepare_data
from extrapos.run.config import load_config
from extrapos.training import trainer as train_mod
from tests.conftest import tiny_overrides


def test_the_console_writes_bare_lines_to_the_stream_each_record_asks_for(capsys):
    said = logging.getLogger("extrapos.some.module")
    root = logging.getLogger("extrapos")
    before = (root.level, root.propagate, list(root.handlers))
    with console():
        said.info("on stdout")
        said.warning("extrapos: warning: a warning, on stdout too")
        said.info("a note", extra=STDERR)
        said.info("above the bars", extra=ABOVE_BARS)
        said.debug("not at the command's level")
    printed = capsys.readouterr()
    assert printed.out == "on stdout\nextrapos: warning: a warning, on stdout too\nabove the bars\n"
    assert printed.err == "a note\n"
    # put back as it was: a command run in-process leaves logging as it found it
    assert (root.level, root.propagate, root.handlers) == before
    assert [type(h) for h in root.handlers] == [logging.NullHandler]  # import extrapos's own
    said.warning("after the command")
    assert capsys.readouterr() == ("", "")


@pytest.fixture
def texts(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text(f"Document {i}. " + "The quick brown fox jumps over it. " * 40)
    return folder


def test_data_preparation_prints_nothing_unless_logging_is_configured(texts, tmp_path, capsys, caplog):
    """It used to print "Prepared data in ..." on stderr, whatever the program embedding it wanted."""
    fractions = (0.5, 0.25, 0.25)
    prepare_data(str(texts), "bpe:300", tmp_path / "a", split_fractions=fractions, progress=True)
    assert capsys.readouterr() == ("", "")
    assert "Prepared data in" not in caplog.text  # below the default level (warning)
    caplog.set_level(logging.INFO)
    prepare_data(str(texts), "bpe:300", tmp_path / "b", split_fractions=fractions, progress=True)
    assert capsys.readouterr() == ("", "")
    said = [r for r in caplog.records if r.getMessage().startswith("Prepared data in")]
    assert len(said) == 1 and said[0].name == "extrapos.data.prepare" and said[0].levelno == logging.INFO


def test_a_warning_is_silent_too_until_logging_is_configured():
    """The package's NullHandler: without it Python's last-resort handler prints warnings on stderr. In a
    fresh process, as a program sees it (pytest's own handlers would hide the last resort here)."""
    code = (
        "import logging, torch\n"
        "from extrapos.run import runtime\n"
        "runtime.cpu_has_fast_bf16 = lambda: False\n"
        "runtime.warn_slow_bf16(torch.device('cpu'), 'bf16')\n"
        "logging.basicConfig(format='%(name)s %(levelname)s %(message)s')\n"
        "runtime.warn_slow_bf16(torch.device('cpu'), 'bf16')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("extrapos.run.runtime WARNING extrapos: this CPU (")


def test_a_training_run_prints_nothing_and_logs_its_lines(tiny_data, tmp_path, capsys, caplog):
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2}))
    caplog.set_level(logging.INFO, logger="extrapos")
    train_mod.train(cfg, tmp_path / "run", progress=False)
    assert capsys.readouterr() == ("", "")
    lines = [(r.name, r.getMessage()) for r in caplog.records]
    assert any(name == "extrapos.training.trainer" and "parameters, encoding" in m for name, m in lines)
    assert any(m.startswith("checkpoint saved: ") for _, m in lines)


def test_the_command_prints_the_same_lines(tiny_data, tmp_path, capsys):
    args = ["train", "--config", "cpu/tiny", "--out", str(tmp_path / "r"), "--no-progress"]
    for s in tiny_overrides(tiny_data, **{"train.steps": 2}):
        args += ["--set", s]
    assert main(args) == 0
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert lines[0].startswith("extrapos train: ") and "parameters, encoding" in lines[0]
    assert f"checkpoint saved: {tmp_path / 'r' / 'checkpoints' / 'step-2'}" in lines
    assert printed.err == ""
    assert not any(type(h).__name__ == "ConsoleHandler" for h in logging.getLogger("extrapos").handlers)
