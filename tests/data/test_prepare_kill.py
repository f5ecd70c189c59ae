"""`kill -9` of a running `extrapos data prepare`, from outside, half-way through its shards.

The child is the real CLI; the only change to it is that, after its tenth document is written, it
says so on stdout and waits on stdin, so the parent's SIGKILL lands mid-way every time without
the test sleeping. Afterwards nothing may look finished, and a second prepare must give exactly
what an uninterrupted one gives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from data_helpers import text_of

from extrapos.data import open_split, prepare_data
from extrapos.errors import UserError

CHILD = r"""
import sys
from extrapos.data import prepare
from extrapos.data.shards import SplitWriter

prepare.ENCODE_BATCH_DOCS = 4  # many batches, so the kill falls between two of them
real_add, written = SplitWriter.add, [0]

def add(self, ids, num_bytes):
    real_add(self, ids, num_bytes)
    written[0] += 1
    if written[0] == 10:
        print("mid-way", flush=True)
        sys.stdin.read()  # until the parent kills us

SplitWriter.add = add
from extrapos.cli import main
sys.exit(main(sys.argv[1:]))
"""
ARGS = ["--tokenizer", "bpe:300", "--split-fractions", "0.5,0.25,0.25", "--quiet"]
SHARDS = ["tokenizer.json", *(f"{s}{x}" for s in ("train", "val", "test") for x in (".bin", ".offsets.npy"))]


def run_cli(args, cache, child=None):
    env = {**os.environ, "EXTRAPOS_CACHE": str(cache)}
    code = ["-c", child] if child else ["-m", "extrapos"]
    return subprocess.Popen(
        [sys.executable, *code, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def contents(directory):
    manifest = json.loads((directory / "manifest.json").read_text())
    for key in ("seconds", "created"):
        manifest.pop(key)
    return {name: (directory / name).read_bytes() for name in SHARDS}, manifest


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(40):
        (folder / f"d{i:02d}.txt").write_text(text_of(i, 10 + i % 7))
    return folder


def test_kill_9_mid_prepare_leaves_nothing_finished_and_a_rerun_matches(corpus, tmp_path):
    out, cache = tmp_path / "prepared", tmp_path / "cache"
    args = ["data", "prepare", "--corpus", str(corpus), "--out", str(out), *ARGS]
    child = run_cli(args, cache, CHILD)
    try:
        assert child.stdout.readline() == "mid-way\n", child.stderr.read()
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdin.close()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    staging = [p for p in tmp_path.iterdir() if p.name.startswith(".prepared.tmp-") and p.is_dir()]
    assert len(staging) == 1 and (staging[0] / "train.bin").exists()  # it was killed mid-way
    assert not (staging[0] / "manifest.json").exists()
    assert not out.exists()  # nothing at the target, so nothing a later command could trust
    with pytest.raises(UserError, match="No prepared data"):
        open_split(out, "train")

    again = run_cli(args, cache)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the dead one's staging swept
    reference = prepare_data(
        str(corpus), "bpe:300", tmp_path / "reference", split_fractions=(0.5, 0.25, 0.25), progress=False
    )
    assert contents(out) == contents(reference)
