"""Failed writes (a full disk, a file-size limit, permissions) told in the user's paths, never in the
temporary directory the import or export was building and has just removed."""

from __future__ import annotations

import re
from pathlib import Path

from extrapos.errors import UserError


def write_failure(e: BaseException, tmp: Path) -> str | None:
    """Why writing into ``tmp`` failed (a full disk, a file-size limit, permissions), without naming
    ``tmp`` (any path starting with it); None when ``e`` is not a write failure."""
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename and str(tmp) not in str(e.filename) else ""
        return f"{where}{e.strerror or e}"
    if type(e).__name__ == "SafetensorError" and "I/O error" in str(e):  # safetensors' own I/O errors
        return str(e).rpartition("I/O error: ")[2]
    if isinstance(e, UserError) and str(tmp) in str(e):  # save_checkpoint's sentence names its directory
        m = re.search(r"^cannot write checkpoint \S+ \((.*)\); free some space", str(e))
        return m.group(1) if m else None
    return None
