"""``python-site``: the standard library's and every installed package's sources, tests included, each
distinct file once (by content), under ids that do not depend on where the interpreter lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from extrapos.data import open_corpus
from extrapos.data.corpora import python_site_corpus
from extrapos.data.python_sources import site_directories, source_files
from extrapos.errors import UserError


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_each_distinct_file_once_in_a_fixed_order(tmp_path):
    std = tree(
        tmp_path / "lib",
        {
            "json/decoder.py": "def decode(): pass\n",
            "test/test_json.py": "import json\n",  # tests are code too: kept
            "json/__pycache__/decoder.py": "stale copy\n",
            ".hidden/x.py": "hidden\n",
            "notes.txt": "not python\n",
            # the base interpreter's site directory, which this (virtual) environment does not import from
            "site-packages/base/c.py": "c = 3\n",
        },
    )
    site = tree(
        tmp_path / "env",
        {
            "pkg/a.py": "a = 1\n",
            "pkg/__init__.py": "",  # no token to learn: left out
            "vendored/decoder.py": "def decode(): pass\n",  # the stdlib file's bytes again: a duplicate
            "other/b.py": "x = 1\n",
        },
    )
    corpus = python_site_corpus(std, [site])
    docs = list(corpus)
    assert [d for d, _ in docs] == [
        "python-site/stdlib/json/decoder.py",
        "python-site/stdlib/test/test_json.py",
        "python-site/site-packages/other/b.py",
        "python-site/site-packages/pkg/a.py",
    ]
    assert docs[0][1] == "def decode(): pass\n"
    assert list(corpus) == docs  # iterating again: the same documents
    (site / "other" / "b.py").write_text("x = 2\n")
    assert python_site_corpus(std, [site]).fingerprint != corpus.fingerprint  # an edit is a new corpus


def test_an_unreadable_file_is_skipped_and_an_empty_tree_refused(tmp_path):
    site = tree(tmp_path / "env", {"a.py": "a = 1\n"})
    (site / "gone.py").symlink_to(tmp_path / "missing.py")  # a broken link: one file less, not a failure
    assert [d for d, _ in python_site_corpus(tree(tmp_path / "lib", {"s.py": "s\n"}), [site])] == [
        "python-site/stdlib/s.py",
        "python-site/site-packages/a.py",
    ]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="Found no Python source files"):
        python_site_corpus(tmp_path / "empty", [])


def test_this_interpreter_has_its_stdlib_and_its_packages():
    assert site_directories()  # the venv's (or the system's) site-packages
    ids = {doc_id for doc_id, _ in source_files()}
    assert "python-site/stdlib/json/decoder.py" in ids
    assert "python-site/site-packages/numpy/__init__.py" in ids  # numpy: a required dependency
    assert open_corpus("python-site").spec == "python-site"
