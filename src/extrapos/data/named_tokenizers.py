"""Tokenizers named by a word: ``gpt2``, GPT-2's byte-level BPE, from a local file or fetched once.

``gpt2`` is the vocabulary all four papers use (Radford et al. 2019): 50,257 tokens, 50,000 merges
over the 256 bytes and ``<|endoftext|>`` = 50256, cut with ``GPT2_PATTERN``. Its rank file is the
one tiktoken publishes as ``r50k_base.tiktoken`` (tiktoken's ``gpt2`` encoding has the same ranks,
pattern and end-of-text id; openai-whisper ships the same file as ``whisper/assets/gpt2.tiktoken``).
Where it comes from, first found wins:

1. ``$EXTRAPOS_CACHE/tokenizers/gpt2.tiktoken`` (default ``~/.cache/extrapos/tokenizers/``): a file
   you put there, or the copy an earlier download left.
2. tiktoken's loader, ``tiktoken.load.read_file_cached(url, sha256)``: tiktoken's own cache
   (``$TIKTOKEN_CACHE_DIR``, default ``<tmp>/data-gym-cache``), else a download from the URL. A
   file found this way is copied to 1., so later runs need no network.

Every file is checked against the published sha256, so ``gpt2`` is one vocabulary wherever it came
from; the tokenizer built from it is the one ``load_tokenizer("path/to/gpt2.tiktoken")`` builds, so
the hash (ranks, pattern, special tokens), and with it prepared data and runs, are the same either
way. With nothing reachable, one sentence names the local file to provide.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from extrapos.errors import UserError


@dataclass(frozen=True)
class NamedTokenizer:
    """A published tiktoken rank file: where it lives, its sha256, and what it is called."""

    name: str
    file: str  # the name under $EXTRAPOS_CACHE/tokenizers/
    url: str
    sha256: str
    described: str  # for messages: what the file is and where else it can be found


NAMED_TOKENIZERS = {
    "gpt2": NamedTokenizer(
        name="gpt2",
        file="gpt2.tiktoken",
        url="https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken",
        sha256="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        described="GPT-2's rank file (tiktoken's r50k_base.tiktoken, or whisper/assets/gpt2.tiktoken "
        "in the openai-whisper sdist)",
    )
}


def local_path(entry: NamedTokenizer) -> Path:
    """Where a named tokenizer's file is looked for first, and kept once fetched."""
    from extrapos.data.cache import cache_root

    return cache_root() / "tokenizers" / entry.file


def fetch(entry: NamedTokenizer) -> bytes:
    """The file from tiktoken's cache or its URL, checked against ``entry.sha256`` (tiktoken's
    loader raises ValueError on a mismatch and OSError when the network fails)."""
    from tiktoken.load import read_file_cached

    return read_file_cached(entry.url, entry.sha256)


def named_file(name: str) -> tuple[bytes, str, str]:
    """A named tokenizer's rank file, checked: ``(its bytes, its file name, where it was read)``, from
    which ``tokenizer.load_tokenizer`` builds the ``TiktokenTokenizer`` (see the module docstring).
    Bytes, not the tokenizer, so this module needs nothing of ``tokenizer.py``, which imports it."""
    entry = NAMED_TOKENIZERS[name]
    path = local_path(entry)
    if path.is_file():
        data = _read(path)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise UserError(
                f"'{path}' is not {entry.described}: its sha256 differs; replace it with that file "
                "or delete it."
            )
    else:
        try:
            import tiktoken.load  # noqa: F401
        except ImportError:
            raise UserError(
                f"The tokenizer {name} needs tiktoken; run `pip install tiktoken`, or set "
                f"data.tokenizer to the path of a {entry.file} file."
            ) from None
        try:
            data = fetch(entry)
        except (OSError, ValueError) as e:  # offline, blocked, a proxy's error page
            reason = _short_reason(e)
            raise UserError(
                f"The tokenizer {name} is not in '{path}' and fetching it from {entry.url} failed "
                f"({reason}); copy {entry.described} to '{path}', or set data.tokenizer (or "
                "--tokenizer) to the path of such a file."
            ) from None
        _keep(path, data)
    return data, entry.file, str(path)


def _short_reason(error: Exception) -> str:
    """The error's own words when they are short, else its kind (a requests ConnectionError
    runs to three lines of pool and URL details)."""
    if isinstance(error, ValueError):
        return "the file's sha256 is not the published one"
    text = " ".join(str(error).split()).rstrip(".")
    return text if 0 < len(text) <= 100 else type(error).__name__


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"Cannot read '{path}' ({e.strerror or e}); check its permissions.") from None


def _keep(path: Path, data: bytes) -> None:
    """Copy a fetched file to the local path (written aside and renamed, so a reader never sees
    half a file); a cache we cannot write only costs the next run a fetch."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
