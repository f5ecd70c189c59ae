"""The Python files of an exported folder and the ``auto_map`` in its config.json that points at them.

transformers runs a folder's own files for ``from_pretrained(DIR, trust_remote_code=True)``. They are
the library's modules the model runs, copied from the installed extrapos at export time with their
imports made relative (vendor.py), so the folder loads with torch and transformers alone; a model
saved again (``save_pretrained``, however it was loaded) writes the same files and map. In a folder,
``copy_code.py`` takes this module's place and copies the folder's own files.
"""

from __future__ import annotations

from pathlib import Path

from extrapos.integrations.hf_remote.copy_code import CONFIG_FILE, MODELING_FILE, auto_map, write_auto_map

__all__ = ["CONFIG_FILE", "MODELING_FILE", "auto_map", "encoding_classes", "write_remote_code"]


def encoding_classes(cfg) -> list[type]:
    """The classes of the encodings a ModelConfig uses (a layer schedule's two)."""
    from extrapos.positions.registry import spec

    return [spec(name).cls for name in cfg.positions_plan().names]


def write_remote_code(directory: str | Path, cfg) -> None:
    """Write the folder's Python files into ``directory`` and point its config.json's auto_map at them."""
    from extrapos.integrations.hf_remote.vendor import write_folder_code

    write_folder_code(directory, encoding_classes(cfg))
    write_auto_map(directory, cfg.causal)
