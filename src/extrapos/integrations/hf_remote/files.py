"""The Python files of an exported folder and the ``auto_map`` in its config.json that points at them.

transformers runs a folder's own files for ``from_pretrained(DIR, trust_remote_code=True)`` (and checks
that every package they import is installed, naming the missing one: ``pip install extrapos``). Here
they only subclass the library's classes, so the model is built by the installed extrapos: the folder
carries no copy of the library to drift from it, and a model loaded from it saves the same files
(transformers copies a remote class's own file; ``save_pretrained`` rewrites them and the map).
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_FILE = "configuration_extrapos.py"
MODELING_FILE = "modeling_extrapos.py"

CONFIGURATION = '''"""The configuration of an extrapos model: transformers runs this file for
AutoConfig.from_pretrained(DIR, trust_remote_code=True).

The model is built by the extrapos library (positional encodings for length extrapolation), which must
be installed: pip install extrapos. With extrapos imported, this folder also loads without
trust_remote_code.
"""

from extrapos.integrations.hf_remote.configuration import ExtraposConfig as LibraryConfig


class ExtraposConfig(LibraryConfig):
    """The run's extrapos ModelConfig (extrapos_model) and its context length."""
'''

MODELING = '''"""The model classes of an extrapos model: transformers runs this file for
AutoModelForCausalLM / AutoModelForMaskedLM / AutoModel.from_pretrained(DIR, trust_remote_code=True).

Each class is the installed extrapos library's (pip install extrapos), which builds the model with its
own positional encoding, so the logits are the ones extrapos computes.
"""

from extrapos.integrations.hf_remote import modeling

from .configuration_extrapos import ExtraposConfig


class ExtraposModel(modeling.ExtraposModel):
    config_class = ExtraposConfig


class ExtraposForCausalLM(modeling.ExtraposForCausalLM):
    config_class = ExtraposConfig


class ExtraposForMaskedLM(modeling.ExtraposForMaskedLM):
    config_class = ExtraposConfig
'''


def auto_map(causal: bool) -> dict[str, str]:
    """The Auto classes a folder of a decoder (causal) or an encoder answers to."""
    head = "AutoModelForCausalLM" if causal else "AutoModelForMaskedLM"
    model = "ExtraposForCausalLM" if causal else "ExtraposForMaskedLM"
    return {
        "AutoConfig": "configuration_extrapos.ExtraposConfig",
        "AutoModel": "modeling_extrapos.ExtraposModel",
        head: f"modeling_extrapos.{model}",
    }


def write_remote_code(directory: str | Path, cfg) -> None:
    """Write the two Python files into ``directory`` and point its config.json's auto_map at them."""
    directory = Path(directory)
    (directory / CONFIG_FILE).write_text(CONFIGURATION)
    (directory / MODELING_FILE).write_text(MODELING)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map(cfg.causal)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
