"""``extrapos encodings | head -1`` (issue 38, item 6): a reader that leaves is no error. The command stops
quietly with the status of a process SIGPIPE ended (141), as ``yes | head -1`` leaves ``yes``; it used to
exit 2 with "cannot read or write a file (Broken pipe)"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import CHILD


@pytest.mark.parametrize("command", [["encodings"], ["encodings", "--json"], ["presets"]])
def test_a_closed_pipe_ends_the_command_quietly(command, scratch):
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first byte
    try:
        env = {**os.environ, "EXTRAPOS_CACHE": str(scratch / "cache"), "HOME": str(scratch)}
        result = subprocess.run(
            [sys.executable, "-c", CHILD, *command], stdout=write, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write)
    assert result.returncode == 141 and result.stderr == "", result.stderr
