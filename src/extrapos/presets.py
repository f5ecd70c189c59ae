"""Shipped presets: training configs in ``configs/`` and comparison sweeps in ``configs/compare/``.

Finding and reading preset files needs no torch, so the command line can list them instantly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from extrapos.errors import UserError
from extrapos.schema import one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESETS_DIR = Path(__file__).parent / "configs"
SWEEPS_DIR = PRESETS_DIR / "compare"


def preset_names() -> list[str]:
    """Training presets (comparison sweeps live in configs/compare/ and are not training presets)."""
    return sorted(
        str(p.relative_to(PRESETS_DIR).with_suffix(""))
        for p in PRESETS_DIR.rglob("*.toml")
        if p.relative_to(PRESETS_DIR).parts[0] != "compare"
    )


def sweep_names() -> list[str]:
    return sorted(str(p.relative_to(SWEEPS_DIR).with_suffix("")) for p in SWEEPS_DIR.rglob("*.toml"))


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name no file can have (too long for the file system: ENAMETOOLONG)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def find_config(spec: str) -> Path:
    """A TOML path, or a preset name like 'cpu/tiny' shipped in extrapos/configs/."""
    p = Path(spec)
    if p.suffix == ".toml" and _is_file(p):
        return p
    preset = PRESETS_DIR / f"{spec.removesuffix('.toml')}.toml"
    if _is_file(preset):
        return preset
    shown = one_line(spec)  # a name with a line break stays one sentence of one line
    if p.suffix == ".toml":
        raise UserError(f"config file {shown} does not exist; pass an existing .toml or a preset name.")
    raise UserError(f"no config file or preset named '{shown}'; presets are: {', '.join(preset_names())}.")


def find_sweep(spec: str) -> Path:
    """A sweep TOML path, or a comparison preset name like 'quick'."""
    path = Path(spec)
    if not (path.suffix == ".toml" and path.is_file()):
        path = SWEEPS_DIR / f"{spec.removesuffix('.toml')}.toml"
    if not path.is_file():
        raise UserError(f"no comparison preset named '{spec}'; presets are: {', '.join(sweep_names())}.")
    return path


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML ({e}); fix the file.") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text, so not a TOML file; fix or replace the file.") from None


def parse_toml_value(text: str) -> Any:
    """A command-line value read as TOML (``3e-4``, ``true``, ``[1, 2]``), else as a bare string."""
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()  # a bare word such as expe or cosine
