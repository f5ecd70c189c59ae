"""Where prepared data and tokenizers live, and how a finished directory takes its place there.

Every writer of prepared data (``prepare``, ``synthetic``) builds in a staging directory
(``staging.py``) and then publishes it: a rename onto the target, which is atomic on one filesystem,
so a reader sees either nothing or the whole directory. A target that already holds data of the
same inputs (the same ``key`` in its manifest) is reused, never rewritten; one that holds anything
else is refused in one sentence.
"""

from __future__ import annotations

import os
from pathlib import Path

from extrapos.data.shards import MANIFEST, read_manifest
from extrapos.errors import UserError


def cache_root() -> Path:
    """``$EXTRAPOS_CACHE``, else ``~/.cache/extrapos``."""
    return Path(os.environ.get("EXTRAPOS_CACHE") or Path.home() / ".cache" / "extrapos").expanduser()


def reusable(target: Path, key: str) -> bool:
    """True when ``target`` holds data prepared from the same inputs; UserError when it holds
    anything else (we never overwrite a directory we did not write for these inputs)."""
    if target.is_symlink():  # we write only where the path says, never through a link
        raise UserError(f"The output path '{target}' is a symbolic link; give --out a real directory path.")
    if not target.exists():
        return False
    if not target.is_dir():
        raise UserError(f"The output path '{target}' is a file; choose a directory for --out.")
    if (target / MANIFEST).exists():
        try:
            manifest = read_manifest(target)
        except UserError:
            manifest = {}
        if manifest.get("key") == key:
            return True
        raise UserError(
            f"'{target}' already holds data prepared from other inputs "
            f"(corpus {manifest.get('corpus', '?')}); choose another --out or delete it."
        )
    if any(target.iterdir()):
        raise UserError(
            f"The output directory '{target}' is not empty and is not prepared data; choose another --out."
        )
    return False  # an empty directory: we may fill it


def publish(tmp: Path, target: Path, key: str) -> bool:
    """Rename the finished temporary directory onto the target (atomic on one filesystem).

    Returns True when another process published the same data first (then ours is dropped).
    """
    try:
        os.rename(tmp, target)  # replaces an empty directory, fails on a non-empty one
    except OSError:
        if reusable(target, key):
            return True
        raise
    return False
