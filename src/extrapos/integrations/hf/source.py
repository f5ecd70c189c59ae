"""Where a model comes from: a local directory or a hub download, its config.json and its weight files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from extrapos.errors import UserError

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_source(source: str | Path, revision: str | None = None) -> tuple[Path, dict[str, Any]]:
    """A local model directory, or a hub name downloaded with ``huggingface_hub.snapshot_download``.

    Returns the directory and a provenance record for ``source.json``.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path, {"source": str(source), "path": str(path.resolve())}
    text = str(source)
    if path.exists() or not _HUB_NAME.match(text) or text.startswith((".", "/", "~")):
        raise UserError(
            f"{source} is not a model directory; pass a directory holding config.json and "
            "*.safetensors, or a hub name such as openai-community/gpt2."
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(
            f"{source} is not a local directory and huggingface_hub is not installed; "
            "pip install huggingface_hub (or extrapos[hf]) or pass a local model directory."
        ) from None
    patterns = [
        "config.json",
        "*.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
        "generation_config.json",
    ]
    try:
        local = snapshot_download(repo_id=text, revision=revision, allow_patterns=patterns)
    except Exception as e:  # network, authentication, unknown repository: all things the user fixes
        raise UserError(
            f"could not download {source} from the Hugging Face hub ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'no message'}); check the name, your "
            "network and HF_TOKEN, or pass a local model directory."
        ) from None
    return Path(local), {
        "source": text,
        "path": str(local),
        "hub": True,
        "revision": revision,
        "commit": Path(local).name,
    }


def read_json(f: Path) -> Any:
    """A JSON file of a model directory; a UserError naming it when it is not UTF-8 JSON."""
    try:
        return json.loads(f.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{f} is not UTF-8 text; fix or re-download it.") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{f} is not valid JSON ({e}); fix or re-download it.") from None
    except RecursionError:
        raise UserError(f"{f} nests too deeply to be a model's JSON file; fix or re-download it.") from None


def read_hf_config(directory: Path) -> dict[str, Any]:
    f = Path(directory) / "config.json"
    if f.is_symlink() and not f.exists():  # a dangling link or a loop: the file is there but unreadable
        raise UserError(
            f"{f} is a symlink that leads nowhere (dangling or a loop); replace it with the file."
        )
    if not f.is_file():
        raise UserError(f"{directory} has no config.json; pass the directory save_pretrained wrote.")
    hf = read_json(f)
    if not isinstance(hf, dict):
        raise UserError(f"{f} holds {_json_kind(hf)}, not a JSON object of settings; fix or re-download it.")
    return hf


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def weight_files(directory: Path) -> list[Path]:
    """The safetensors shards of a model directory (via ``model.safetensors.index.json`` if present)."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index} has no weight_map (tensor name -> shard file); fix or re-download it.")
        bad = [
            v
            for v in weight_map.values()
            if not isinstance(v, str) or Path(v).name != v or v in ("", ".", "..")
        ]
        if bad:
            raise UserError(
                f"{index} maps a tensor to {json.dumps(bad[0])}, which is not a shard file name; "
                "fix or re-download it."
            )
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise UserError(f"{directory} lacks the shard {missing[0]} its index names; download it again.")
        return [directory / n for n in names]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if others:
        return others
    if any(directory.glob("*.bin")):
        raise UserError(
            f"{directory} holds only PyTorch .bin weights; re-save it with safetensors "
            "(model.save_pretrained(dir, safe_serialization=True)) and import that."
        )
    raise UserError(f"{directory} has no *.safetensors weights; pass a directory save_pretrained wrote.")
