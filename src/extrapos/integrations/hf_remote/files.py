"""The Python files of an exported folder and the ``auto_map`` in its config.json that points at them.

transformers runs a folder's own files for ``from_pretrained(DIR, trust_remote_code=True)``. They are
the library's modules the model runs, copied from the installed extrapos at export time with their
imports made relative (vendor.py), so the folder loads with torch and transformers alone; a model
saved again (``save_pretrained``, however it was loaded) writes the same files and map. In a folder,
``copy_code.py`` takes this module's place and copies the folder's own files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from extrapos.integrations.hf_remote.copy_code import CONFIG_FILE, MODELING_FILE, auto_map, write_auto_map

__all__ = ["CONFIG_FILE", "MODELING_FILE", "auto_map", "encoding_classes", "write_remote_code"]


def encoding_classes(cfg: Any) -> list[type]:
    """The classes of every encoding a ModelConfig's model builds: a layer schedule's two, and those an
    encoding builds by name inside itself (DAPE's base encoding). Read from the encodings built once,
    so an option naming another encoding is followed however it is spelled."""
    from extrapos.positions.base import EncodingContext, PositionalEncoding
    from extrapos.positions.registry import spec
    from extrapos.positions.schedule import build_positions

    built = build_positions(cfg.positions_plan(), EncodingContext.of(cfg))
    named = {getattr(m, "registry_name", None) for m in built.modules() if isinstance(m, PositionalEncoding)}
    return [spec(name).cls for name in sorted(n for n in named if isinstance(n, str))]


def write_remote_code(directory: str | Path, cfg: Any) -> None:
    """Write the folder's Python files into ``directory`` and point its config.json's auto_map at them."""
    from extrapos.integrations.hf_remote.vendor import write_folder_code

    write_folder_code(directory, encoding_classes(cfg))
    write_auto_map(directory, cfg.causal)
