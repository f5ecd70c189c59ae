"""Fixtures of the robustness battery: a scratch directory, its cache, a small corpus."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import harness` from the tests of this folder

WORDS = (
    "The quick brown fox jumps over the lazy dog while positional encodings tell a transformer "
    "where each token sits and extrapolation asks what happens past the trained length. "
)


@pytest.fixture
def scratch(tmp_path) -> Path:
    return tmp_path


@pytest.fixture
def cache(scratch) -> Path:
    return scratch / "cache"


@pytest.fixture
def corpus(scratch) -> Path:
    """Eight small .txt documents, different from each other."""
    folder = scratch / "corpus"
    folder.mkdir()
    for i in range(8):
        (folder / f"doc{i}.txt").write_text(f"Document {i}. " + WORDS * (3 + i), encoding="utf-8")
    return folder
