"""Two requests of one result name at once: one result, the other reused or refused, never lost (issue 37,
item 2).

``extrapos eval RUN --lengths 1 --name same &`` and ``... --lengths 2 --name same &`` both exited 0 and
printed the same path while the file held one request. A result slot now holds the name's lock
(``run.lock.ResultLock``) from its decision to score until the result is written: the second process
waits, reads what the first wrote, and reuses it (the same request) or refuses (another request).
Each process sleeps 2 s just before writing, so the two are surely inside one slot at once.
"""

from __future__ import annotations

import json
import shutil

import pytest
from harness import PREFIX, Fault, start

from tests.conftest import tiny_overrides

SLOW_WRITE = Fault("extrapos.evaluate.slot:ResultSlot.write", sleep=2.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data)), run_dir, progress=False)
    return run_dir


@pytest.fixture
def run_copy(trained, scratch):
    out = scratch / "run"
    shutil.copytree(trained, out)
    return out


def _eval(run_dir, lengths, cache):
    args = [
        "eval",
        str(run_dir),
        "--lengths",
        lengths,
        "--max-tokens",
        "256",
        "--name",
        "same",
        "--no-progress",
    ]
    return start(args, cache=cache, fault=SLOW_WRITE)


def _finish(process):
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def test_two_requests_of_one_name_at_once_one_is_refused(run_copy, cache):
    first = _eval(run_copy, "1", cache)
    second = _eval(run_copy, "2", cache)
    results = [_finish(first), _finish(second)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, _, err in results if code == 2)
    assert "Traceback" not in refused and refused.strip().splitlines() == [refused.strip()]
    assert refused.startswith(PREFIX) and "holds a different evaluation" in refused
    # the file holds the request of the process that exited 0
    winner = next(out for code, out, _ in results if code == 0)
    saved = json.loads((run_copy / "eval" / "same.json").read_text())
    assert len(saved["results"]) == 1 and str(run_copy / "eval" / "same.json") in winner


def test_two_identical_requests_at_once_score_once(run_copy, cache):
    first = _eval(run_copy, "1", cache)
    second = _eval(run_copy, "1", cache)
    results = [_finish(first), _finish(second)]
    assert [code for code, _, _ in results] == [0, 0], results
    # one of them waited for the other and reused its result (it did not score again)
    assert sum("waiting for process" in out for _, out, _ in results) == 1, results
    mtime = (run_copy / "eval" / "same.json").stat().st_mtime_ns
    again = _eval(run_copy, "1", cache)
    assert _finish(again)[0] == 0 and (run_copy / "eval" / "same.json").stat().st_mtime_ns == mtime


def test_a_failed_evaluation_in_this_process_does_not_block_the_next(tmp_path):
    """An evaluation that raised keeps its slot (and lock) alive in the exception's traceback; the next
    request of the name in the same process takes the lock over instead of waiting on itself."""
    from extrapos.run.lock import ResultLock

    result = tmp_path / "eval" / "same.json"
    result.parent.mkdir()
    stale = ResultLock(result).acquire(wait=False)  # never released, as after an exception
    again = ResultLock(result).acquire(wait=False)  # would raise "being scored by process N" otherwise
    assert stale._fd is None and again._fd is not None
    again.release()
    assert not result.with_name(".same.json.lock").exists()  # no lock file is left behind
