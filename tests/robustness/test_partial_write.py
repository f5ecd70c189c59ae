"""A picture replaced on a disk that fills part-way through it keeps its old bytes (issue 48, part 1).

The fault matrix (``test_write_faults.py``) fails a write before it has any effect; a full disk can also
stop one part-way through a file. ``savefig`` onto a report's own ``plots/loss_vs_length.png`` truncated
the old picture first, so a report rendered again onto a full disk left half a PNG (exit 2, the report's
other files intact). A file-size limit (``RLIMIT_FSIZE``: a write past it fails with EFBIG) stops the
write part-way here, as a full disk would; the pictures now go through ``atomic_write``.
"""

from __future__ import annotations

import pytest
from harness import assert_user_error, run, snapshot

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, tiny_data):
    """A finished 4-step run with an evaluation at 1 and 2 x L_t."""
    from extrapos.run.config import load_config
    from extrapos.training.trainer import train

    folder = tmp_path_factory.mktemp("evaluated")
    run_dir = folder / "run"
    train(load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 4})), run_dir, progress=False)
    done = run(
        ["eval", run_dir, "--lengths", "1,2", "--max-tokens", "256", "--no-progress"], cache=folder / "cache"
    )
    assert done.returncode == 0, done.stderr
    return run_dir


def test_a_report_rendered_again_onto_a_full_disk_keeps_its_pictures(evaluated, scratch, cache):
    out = scratch / "report"
    first = run(["report", evaluated, "--out", out], cache=cache)
    assert first.returncode == 0, first.stderr
    picture = out / "plots" / "loss_vs_length.png"
    assert picture.stat().st_size > 4096  # the limit below stops its new version part-way
    before = snapshot(out)
    # another title: a new picture (its title is drawn in it) onto a disk with room for 4 KiB of it
    args = ["report", evaluated, "--out", out, "--title", "Another title"]
    assert_user_error(
        args, cache=cache, watch=[out, evaluated], fragments=["File too large"], fsize_limit=4096
    )
    assert snapshot(out) == before
    assert not [p.name for p in out.rglob(".*.tmp")]  # atomic_write removed its temporary
    again = run(args, cache=cache)  # room again: the new picture, whole
    assert again.returncode == 0, again.stderr
    assert snapshot(picture)[picture] != before[picture]
