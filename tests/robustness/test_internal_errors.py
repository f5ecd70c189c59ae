"""The boundary in ``extrapos.cli.main`` (issue 24, item 6): an unexpected exception in any command is a
defect of extrapos and ends with one line and exit status 70 (never a traceback, never exit 2, which
means "your mistake"); ``--debug``, before or after the command, prints the traceback as well.

The commands run in-process through ``main([...])`` with a library function monkeypatched to raise.
"""

from __future__ import annotations

import re

import pytest

from extrapos.cli import main
from extrapos.errors import INTERNAL_ERROR, UserError

LINE = re.compile(
    r"^extrapos: internal error in (?P<command>[\w ]+): (?P<type>\w+): (?P<message>.*); "
    r"rerun with --debug for the traceback\.$"
)


def _boom(*args, **kwargs):
    raise ZeroDivisionError("float division by zero\nsecond line of the message")


@pytest.fixture
def broken_encodings(monkeypatch):
    """`extrapos encodings` with its library function raising an unexpected error."""
    import extrapos.tools.catalog

    monkeypatch.setattr(extrapos.tools.catalog, "encodings_text", _boom)


def _one_line(err: str) -> re.Match:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"not one line:\n{err}"
    m = LINE.match(lines[0])
    assert m, f"not the internal-error line: {lines[0]}"
    return m


def test_unexpected_error_is_one_line_with_its_own_exit_status(broken_encodings, capsys):
    assert INTERNAL_ERROR not in (0, 1, 2, 130)
    assert main(["encodings"]) == INTERNAL_ERROR
    out, err = capsys.readouterr()
    m = _one_line(err)
    assert m["command"] == "encodings"
    assert m["type"] == "ZeroDivisionError"
    assert m["message"] == "float division by zero"  # the first line of the message only
    assert out == ""


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(broken_encodings, capsys, where):
    argv = ["--debug", "encodings"] if where == "before" else ["encodings", "--debug"]
    assert main(argv) == INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):"), err
    assert "_boom" in err and "ZeroDivisionError: float division by zero" in err
    assert LINE.match(err.strip().splitlines()[-1]), err  # the one line still closes the output


def test_subcommand_of_a_group_is_named(monkeypatch, capsys, tmp_path):
    import extrapos.data.shards

    monkeypatch.setattr(extrapos.data.shards, "read_manifest", lambda *a, **k: {}["splits"])
    assert main(["data", "info", str(tmp_path), "--debug"]) == INTERNAL_ERROR
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert LINE.match(err.strip().splitlines()[-1])["command"] == "data info"
    assert main(["data", "info", str(tmp_path)]) == INTERNAL_ERROR
    m = _one_line(capsys.readouterr().err)
    assert (m["command"], m["type"], m["message"]) == ("data info", "KeyError", "'splits'")


def test_user_errors_and_interrupts_keep_their_behaviour(monkeypatch, capsys):
    import extrapos.tools.catalog

    def mistake(*a, **k):
        raise UserError("unknown model preset 'x'; choose one of: a, b.")

    monkeypatch.setattr(extrapos.tools.catalog, "encodings_text", mistake)
    assert main(["encodings", "--debug"]) == 2
    err = capsys.readouterr().err
    assert err == "extrapos: error: unknown model preset 'x'; choose one of: a, b.\n"

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(extrapos.tools.catalog, "encodings_text", interrupt)
    assert main(["encodings"]) == 130
    assert capsys.readouterr().err == "extrapos: interrupted\n"


def test_an_empty_message_still_reads_as_one_line(monkeypatch, capsys):
    import extrapos.tools.catalog

    def bare(*a, **k):
        raise RuntimeError

    monkeypatch.setattr(extrapos.tools.catalog, "encodings_text", bare)
    assert main(["encodings"]) == INTERNAL_ERROR
    m = _one_line(capsys.readouterr().err)
    assert (m["type"], m["message"]) == ("RuntimeError", "no message")


def test_debug_is_listed_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--debug" in capsys.readouterr().out
