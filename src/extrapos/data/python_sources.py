"""``python-site``: the Python sources a machine already has, as a corpus no download is needed for
(``corpora.python_site_corpus`` makes the corpus of these files).

Every ``*.py`` file of the running interpreter's standard library and of every installed package (each
``site-packages`` / ``dist-packages`` directory this interpreter imports from, ``PYTHONPATH`` entries
included): on a machine with torch, transformers and their kin that is hundreds of MB of real code,
enough for a GPT-2-small run that never repeats a token (``python-stdlib`` alone is about 7M tokens).

Why it is shaped this way:

- **Deduplicated by content.** A file whose bytes equal an earlier file's (the same vendored module in
  three packages, empty ``__init__.py`` files, a package installed twice) is kept once: the first one in
  the corpus order, by the sha256 of its bytes. Repeated files would otherwise sit in both the train and
  the test split, and a model that memorised them would look like one that extrapolates.
- **Stable ids.** ``python-site/stdlib/<path>`` and ``python-site/site-packages/<path>``, relative to the
  directory they were found in, so the train/val/test split (a hash of the id) does not depend on where
  the interpreter lives. Two site directories holding the same path with different bytes keep both
  files under one id (both then fall in the same split).
- **All cores.** Files are read (and hashed) by a pool of threads, in order, a window ahead of the
  tokenizer; the tokenizer encodes on every core (``prepare``).
- **Tests kept.** Unlike ``python-stdlib``, test suites stay in: they are code too, and this corpus is
  about size. ``__pycache__`` and hidden directories are skipped; symbolic links to directories are not
  followed. A site directory is read only when this interpreter imports from it (a virtual
  environment's, not its base interpreter's).
"""

from __future__ import annotations

import hashlib
import os
import site
import sys
import sysconfig
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SPEC = "python-site"
#: site directories: what a package installer writes into (Debian's interpreters use dist-packages)
SITE_NAMES = ("site-packages", "dist-packages")
#: files read ahead of the tokenizer: enough to keep the reading threads busy, a few MB in memory
READ_AHEAD = 256


def site_directories() -> list[Path]:
    """Every existing site directory of this interpreter, each once (resolved), in a fixed order: the
    interpreter's own (``sysconfig``, ``site``), then those on ``sys.path`` (a venv's, ``PYTHONPATH``
    entries, a ``pip install --target`` directory named on it)."""
    found: list[Path] = []
    candidates = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
    candidates += list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    candidates += [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    candidates += [p for p in sys.path if Path(p or ".").name in SITE_NAMES]
    for c in candidates:
        if not c:
            continue
        path = Path(c).resolve()
        if path.is_dir() and path not in found:
            found.append(path)
    return found


def _python_files(root: Path, skip_sites: bool) -> list[Path]:
    """``*.py`` files under ``root`` in sorted order, without ``__pycache__`` and hidden directories, and
    with ``skip_sites`` without the site directories inside it (the standard library's tree holds the
    system interpreter's site-packages: read as a site directory when this interpreter imports from it,
    not at all from a virtual environment, which does not)."""
    files = []
    for folder, dirs, names in os.walk(root):  # symbolic links to directories are not followed
        here = Path(folder)
        dirs[:] = [
            d
            for d in dirs
            if d != "__pycache__" and not d.startswith(".") and not (skip_sites and d in SITE_NAMES)
        ]
        files += [here / n for n in names if n.endswith(".py") and not n.startswith(".")]
    return sorted(files)


def source_files(stdlib: Path | None = None, sites: list[Path] | None = None) -> list[tuple[str, Path]]:
    """(document id, file) of every candidate file, the standard library first, then each site directory
    (default: this interpreter's); duplicates by content are removed while reading
    (``python_site_corpus``)."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"]).resolve()
    sites = site_directories() if sites is None else [Path(p).resolve() for p in sites]
    named = [(f"{SPEC}/stdlib/{p.relative_to(stdlib).as_posix()}", p) for p in _python_files(stdlib, True)]
    for root in sites:
        named += [
            (f"{SPEC}/site-packages/{p.relative_to(root).as_posix()}", p) for p in _python_files(root, False)
        ]
    return named


def _read(path: Path) -> tuple[bytes, str] | None:
    """A file's bytes and their sha256 (hashlib releases the GIL on large inputs); None when it cannot
    be read (a broken link, a file removed meanwhile, no permission): one file less, not a failed run."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data, hashlib.sha256(data).hexdigest()


def _in_order(files: list[tuple[str, Path]], workers: int) -> Iterator[tuple[str, tuple[bytes, str] | None]]:
    """(id, read file) in the order of ``files``, read by ``workers`` threads at most READ_AHEAD ahead."""
    with ThreadPoolExecutor(workers, thread_name_prefix="extrapos-read") as pool:
        for start in range(0, len(files), READ_AHEAD):
            part = files[start : start + READ_AHEAD]
            yield from zip((i for i, _ in part), pool.map(_read, [p for _, p in part]))


def unique_sources(files: list[tuple[str, Path]]) -> Iterator[tuple[str, bytes]]:
    """(id, bytes) of every readable, non-empty file of ``files`` whose bytes no earlier file had, in order;
    read by a thread per core (at most 32)."""
    seen: set[str] = set()
    for doc_id, read in _in_order(files, max(1, min(32, os.cpu_count() or 1))):
        if read is None:
            continue
        data, digest = read
        if digest in seen or not data.strip():  # a duplicate, or a file without a token to learn
            continue
        seen.add(digest)
        yield doc_id, data


def sources_fingerprint(files: list[tuple[str, Path]]) -> str:
    """Ids, sizes and modification times of every candidate file: changes whenever one is added or
    edited, so a cache keyed by it is never stale."""
    stamp = hashlib.sha256()
    for doc_id, path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        stamp.update(f"{doc_id}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"python-{sys.version_info[:3]}-site-" + stamp.hexdigest()[:16]
