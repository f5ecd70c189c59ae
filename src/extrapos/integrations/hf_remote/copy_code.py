"""``save_pretrained`` of a model built from an exported folder's own code: the folder's Python files
written into the new folder as they are, and its config.json's ``auto_map`` (``files.py`` writes the
same map where the library generates the files).

The library's ``files.py`` generates the folder's code from the installed extrapos (vendor.py); a folder
loaded without extrapos has only its own copies, so ``vendor.py`` puts this module in place of
``files.py`` there. Imports only the standard library and transformers: it is one of the copies.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

CONFIG_FILE = "configuration_extrapos.py"
MODELING_FILE = "modeling_extrapos.py"


def auto_map(causal: bool) -> dict[str, str]:
    """The Auto classes a folder of a decoder (causal) or an encoder answers to."""
    head = "AutoModelForCausalLM" if causal else "AutoModelForMaskedLM"
    model = "ExtraposForCausalLM" if causal else "ExtraposForMaskedLM"
    return {
        "AutoConfig": f"{CONFIG_FILE.removesuffix('.py')}.ExtraposConfig",
        "AutoModel": f"{MODELING_FILE.removesuffix('.py')}.ExtraposModel",
        head: f"{MODELING_FILE.removesuffix('.py')}.{model}",
    }


def write_auto_map(directory: str | Path, causal: bool) -> None:
    """Point ``directory``'s config.json at the folder's model classes."""
    config_path = Path(directory) / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map(causal)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_remote_code(directory: str | Path, cfg: Any) -> None:
    """Copy the Python files this module was loaded with (the two entry files and every file they import,
    as transformers collects them) into ``directory`` and write its auto_map."""
    from transformers.dynamic_module_utils import get_relative_import_files

    here = Path(__file__).resolve().parent
    entries = [here / CONFIG_FILE, here / MODELING_FILE]
    if not all(p.is_file() for p in entries):
        raise RuntimeError(f"{here} holds no exported folder's code to copy.")
    files = {p.name: p for p in entries}
    for entry in entries:
        files.update({Path(f).name: Path(f) for f in get_relative_import_files(entry)})
    directory = Path(directory)
    for name, path in sorted(files.items()):
        if path.resolve() != (directory / name).resolve():
            shutil.copyfile(path, directory / name)
    write_auto_map(directory, cfg.causal)
