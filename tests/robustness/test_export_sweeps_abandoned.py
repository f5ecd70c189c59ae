"""A killed export's temporary folder is swept by the next one (issue 48, item 4).

``kill -9`` of ``extrapos export --format remote-code`` mid-way leaves ``.tmp-export-<name>-<pid>`` beside
``--out`` (the export is built there and renamed into place whole); nothing removed it, and three piled
up. Every writer that builds a directory whole (export, import: ``files.fresh_output_dir``) now removes
the ones beside its ``--out`` whose process is gone, as the data cache sweeps its staging folders, and
keeps those of a live process.
"""

from __future__ import annotations

import os
import signal

import pytest
from harness import Fault, run

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2})), run_dir, progress=False)
    return run_dir


MID_EXPORT = Fault("extrapos.integrations.hf_remote.export:write_remote_model")


def _export(trained, out, cache, fault=None):
    return run(["export", trained, "--out", out, "--format", "remote-code"], cache=cache, fault=fault)


def _temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def test_killed_exports_are_swept_by_the_next_one(trained, scratch, cache):
    exports = scratch / "exports"
    exports.mkdir()
    for name in ("a", "b"):  # each killed export leaves its own folder and sweeps the one before
        killed = _export(trained, exports / name, cache, fault=MID_EXPORT)
        assert killed.returncode == -signal.SIGKILL
        assert [t.rpartition("-")[0] for t in _temporaries(exports)] == [f".tmp-export-{name}"]
    live = exports / f".tmp-export-c-{os.getpid()}"  # a live process's export under way is kept
    live.mkdir()
    foreign = exports / ".tmp-export-notes"  # not ours (no pid): kept
    foreign.mkdir()
    done = _export(trained, exports / "d", cache)
    assert done.returncode == 0, done.stderr
    assert _temporaries(exports) == sorted([live.name, foreign.name])
    assert (exports / "d" / "config.json").is_file()
