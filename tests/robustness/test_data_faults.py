"""Faults during `extrapos data prepare`: signals at named points, a file-size limit, a full disk,
a read-only cache, two prepares at once, abandoned staging directories.

After each: every file that existed before has its bytes, no directory without a manifest is
published, and a rerun succeeds with the same shards as an uninterrupted prepare.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import time

import pytest
from harness import Fault, assert_one_sentence_error, assert_unchanged, run, snapshot, start

from extrapos.data import prepare_data
from extrapos.data.staging import FOREIGN_AGE_SECONDS, ORPHAN_LOCK_SECONDS, lock_path

ARGS = ["--tokenizer", "bpe:300", "--split-fractions", "0.5,0.25,0.25", "--quiet"]
SHARDS = [
    "tokenizer.json",
    "train.bin",
    "val.bin",
    "test.bin",
    "train.offsets.npy",
    "val.offsets.npy",
    "test.offsets.npy",
]

# name -> the place it strikes; each is a step of prepare, in order
POINTS = {
    "training the tokenizer": Fault("extrapos.data.prepare:train_bpe"),
    "after saving the tokenizer": Fault("extrapos.data.tokenizer:HFTokenizer.save", when="after"),
    "mid tokenizing": Fault("extrapos.data.shards:SplitWriter.add", nth=3),
    "before the manifest": Fault("extrapos.data.prepare:write_manifest"),
    "before the rename": Fault("extrapos.data.prepare:_publish"),
    "after the rename": Fault("extrapos.data.prepare:_publish", when="after"),
}


def prepare_args(corpus):
    return ["data", "prepare", "--corpus", corpus, *ARGS]


def shard_digests(directory):
    return {name: digest for path, digest in snapshot(directory).items() if (name := path.name) in SHARDS}


def published(cache):
    return [p for p in (cache / "data").iterdir() if not p.name.startswith(".")]


def staging(cache):
    """Staging directories, and lock files that still have one (a lock file alone, left by a kill
    right after the rename, is empty and swept by a later prepare)."""
    return [
        p
        for p in (cache / "data").iterdir()
        if ".tmp-" in p.name and (p.is_dir() or p.with_name(p.name.removesuffix(".lock")).exists())
    ]


def age(paths, seconds):
    for path in paths:
        past = time.time() - seconds
        os.utime(path, (past, past))


@pytest.fixture
def reference(tmp_path_factory, corpus):
    """The shards of an uninterrupted prepare of the same inputs."""
    out = prepare_data(
        str(corpus),
        "bpe:300",
        tmp_path_factory.mktemp("ref") / "ref",
        split_fractions=(0.5, 0.25, 0.25),
        progress=False,
    )
    return shard_digests(out)


@pytest.fixture
def existing(cache, corpus):
    """Prepared data in the cache from other inputs, which no fault may touch."""
    return prepare_data(str(corpus), "bpe:300", cache / "data" / "existing", max_docs=4, progress=False)


def assert_rerun_matches(cache, corpus, reference):
    result = run(prepare_args(corpus), cache=cache)
    assert result.returncode == 0, result.stderr
    out = [p for p in published(cache) if p.name != "existing"]
    assert len(out) == 1 and shard_digests(out[0]) == reference
    assert not staging(cache), "an abandoned staging directory survived the rerun"


@pytest.mark.parametrize("point", POINTS)
def test_sigkill(point, cache, corpus, existing, reference):
    before = snapshot(cache, corpus)
    result = run(prepare_args(corpus), cache=cache, fault=POINTS[point])
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert_unchanged(before)
    for directory in published(cache):  # nothing half-written is ever published
        assert (directory / "manifest.json").is_file()
    # a SIGKILLed prepare cannot clean up; the next one sweeps what it left (its lock is free)
    assert_rerun_matches(cache, corpus, reference)


@pytest.mark.parametrize("point", ["mid tokenizing", "before the rename"])
def test_sigterm_cleans_up_at_once(point, cache, corpus, existing, reference):
    before = snapshot(cache, corpus)
    result = run(
        prepare_args(corpus),
        cache=cache,
        fault=Fault(POINTS[point].target, signal.SIGTERM, nth=POINTS[point].nth),
    )
    assert result.returncode == 128 + signal.SIGTERM and "Traceback" not in result.stderr, result.stderr
    assert_unchanged(before)
    assert not staging(cache) and [p.name for p in published(cache)] == ["existing"]
    assert_rerun_matches(cache, corpus, reference)


@pytest.mark.parametrize("limit", ["below the tokenizer", "below the tokens"])
def test_file_size_limit(limit, cache, scratch, existing, reference):
    folder = scratch / "big"
    folder.mkdir()
    for i in range(40):  # enough tokens that train.bin outgrows tokenizer.json
        (folder / f"d{i}.txt").write_text(f"Text {i} " + "positional encodings extrapolate " * (30 + i))
    ref = prepare_data(
        str(folder), "bpe:300", scratch / "ref-big", split_fractions=(0.5, 0.25, 0.25), progress=False
    )
    sizes = {p.name: p.stat().st_size for p in ref.iterdir()}
    assert sizes["train.bin"] > sizes["tokenizer.json"] + 1000
    fsize = 1000 if limit == "below the tokenizer" else sizes["tokenizer.json"] + 500
    before = snapshot(cache, folder)
    result = run(prepare_args(folder), cache=cache, fsize_limit=fsize)
    assert_one_sentence_error(result, "file-size limit", "ulimit -f")
    assert_unchanged(before)
    assert not staging(cache) and [p.name for p in published(cache)] == ["existing"]
    assert run(prepare_args(folder), cache=cache).returncode == 0


def test_full_disk(cache, corpus, existing, reference):
    before = snapshot(cache, corpus)
    result = run(
        prepare_args(corpus),
        cache=cache,
        fault=Fault("extrapos.data.shards:SplitWriter.add", nth=2, error=errno.ENOSPC),
    )
    assert_one_sentence_error(result, "No space left", "EXTRAPOS_CACHE")
    assert_unchanged(before)
    assert not staging(cache) and [p.name for p in published(cache)] == ["existing"]
    assert_rerun_matches(cache, corpus, reference)


def test_two_prepares_at_once_agree(cache, corpus, existing, reference):
    procs = [start(prepare_args(corpus), cache=cache) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert_rerun_matches(cache, corpus, reference)


def test_sweep_spares_a_live_staging_directory(cache, corpus, existing):
    """A staging directory whose lock is held (a concurrent prepare) stays; one whose lock is free
    (its owner died) goes; one without a lock file (another writer) stays unless a day old; a
    lock file without its directory goes once a minute old."""
    data = cache / "data"
    live, dead, foreign, old_foreign = (
        data / f".x.tmp-{name}" for name in ("live", "dead", "foreign", "old")
    )
    for path in (live, dead, foreign, old_foreign):
        path.mkdir()
        (path / "train.bin").write_bytes(b"partial")
    for path in (live, dead):
        lock_path(path).touch()
    orphan, young_orphan = data / ".y.tmp-orphan.lock", data / ".y.tmp-young.lock"
    orphan.touch()
    young_orphan.touch()  # maybe an owner between creating and locking it
    age([old_foreign], FOREIGN_AGE_SECONDS + 60)
    age([orphan], ORPHAN_LOCK_SECONDS + 60)
    fd = os.open(lock_path(live), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a concurrent prepare holds it
    try:
        assert run(prepare_args(corpus), cache=cache).returncode == 0
        assert live.is_dir() and (live / "train.bin").read_bytes() == b"partial" and lock_path(live).exists()
        assert not dead.exists() and not lock_path(dead).exists()
        assert foreign.is_dir() and not old_foreign.exists()
        assert not orphan.exists() and young_orphan.exists()
    finally:
        os.close(fd)
    assert run([*prepare_args(corpus), "--max-docs", "5"], cache=cache).returncode == 0
    assert not live.exists() and not lock_path(live).exists()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o002, 0o775)])
def test_cache_follows_the_umask(umask, mode, cache, corpus):
    assert run(prepare_args(corpus), cache=cache, umask=umask).returncode == 0
    (out,) = published(cache)
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert stat.S_IMODE((out / "train.bin").stat().st_mode) == mode & 0o666


def test_a_read_only_shared_cache_is_still_reused(cache, corpus, reference):
    """A teammate's prepared data in a cache we cannot write: reuse needs no write, so it works."""
    assert run(prepare_args(corpus), cache=cache).returncode == 0
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    before = snapshot(cache)
    result = run(prepare_args(corpus), cache=cache, unprivileged=True)
    assert result.returncode == 0 and "Reused" in result.stdout, result.stderr
    assert_unchanged(before)
    assert_one_sentence_error(
        run([*prepare_args(corpus), "--max-docs", "3"], cache=cache, unprivileged=True),
        "Cannot write",
        "EXTRAPOS_CACHE",
    )


def test_sigterm_handler_is_restored_after_prepare(tmp_path, corpus):
    prepare_data(str(corpus), "bpe:300", tmp_path / "out", progress=False)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
