"""The tokenizer an import copies into the run: the model's own or the one the user names."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.data.tokenizer import Tokenizer


def find_tokenizer(src: Path, tokenizer: str | Path | None) -> tuple[Path, str]:
    """The tokenizer file to import (the source's own or ``tokenizer``) and its name in the run."""
    from extrapos.data.tokenizer import TOKENIZER_FILES

    if tokenizer is not None:
        file = Path(tokenizer)
        if file.is_dir():
            found = [file / n for n in TOKENIZER_FILES if (file / n).is_file()]
            if not found:
                raise UserError(f"{file} holds no tokenizer.json, tokenizer.model or tokenizer.tiktoken.")
            file = found[0]
        if not file.is_file():
            raise UserError(f"tokenizer file {file} does not exist.")
    else:
        found = [src / n for n in ("tokenizer.json", "tokenizer.model") if (src / n).is_file()]
        if not found:
            raise UserError(
                f"{src} has no tokenizer.json or tokenizer.model; save the model's tokenizer there "
                "(tokenizer.save_pretrained) or pass tokenizer=PATH."
            )
        file = found[0]
    suffix = {".json": "tokenizer.json", ".model": "tokenizer.model", ".tiktoken": "tokenizer.tiktoken"}.get(
        file.suffix
    )
    if suffix is None:
        raise UserError(f"{file} is not a tokenizer.json, .model or .tiktoken file.")
    return file, suffix


def read_tokenizer(file: Path) -> Tokenizer:
    """Load the tokenizer where the user keeps it, so that an error names that file (not a temporary copy)."""
    from extrapos.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(file)
    except (UserError, OSError):
        raise
    except Exception as e:  # a damaged sentencepiece or tiktoken file raises its library's own errors
        why = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        raise UserError(f"{file} is not a tokenizer extrapos can read ({type(e).__name__}: {why}).") from None
