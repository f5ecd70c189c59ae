"""The per-architecture adapters (integrations/hf/architectures/): one weight map read both ways, the
context an export records, and the L_t an import reports."""

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from extrapos.cli import main  # noqa: E402
from extrapos.integrations.hf import (  # noqa: E402
    adapter_for,
    export_pretrained,
    hf_state_dict,
    import_pretrained,
    model_types,
)
from extrapos.run.config import load_run_config  # noqa: E402
from extrapos.run.directory import load_run  # noqa: E402
from tests.integrations.hf_helpers import CONTEXT, make_run, save_hf  # noqa: E402


def test_every_importable_model_type_has_an_adapter():
    assert set(model_types()) >= {"gpt2", "gpt_neox", "bloom", "llama", "mistral", "qwen2", "smollm3"}
    for name in model_types():
        assert adapter_for(name).model_type == name


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox", "bloom", "llama", "qwen2"])
def test_the_weight_map_read_backwards_gives_the_checkpoint_back(kind, tmp_path):
    """Import then export through the one map: every tensor of the checkpoint, bit for bit, no other."""
    from safetensors.torch import load_file

    save_hf(kind, tmp_path / "hf")
    run = load_run(import_pretrained(tmp_path / "hf", tmp_path / "run"))
    original = load_file(str(tmp_path / "hf" / "model.safetensors"))
    exported = hf_state_dict(run.model, kind)
    assert sorted(exported) == sorted(original)
    for name, t in original.items():
        assert torch.equal(exported[name], t), name


def _extended(run_dir, length):
    """Record the run as extended to ``length`` tokens, as `extrapos extend` does (data.extended_length)."""
    cfg = load_run_config(run_dir)
    cfg = replace(cfg, data=replace(cfg.data, extended_length=length))
    (run_dir / "config.toml").write_text(cfg.to_toml())


@pytest.mark.parametrize(
    "options,key",
    [
        (dict(flavour="llama"), "max_position_embeddings"),
        (dict(), "max_position_embeddings"),  # GPT-NeoX
        (dict(positions={"name": "alibi"}, embed_norm=True), "seq_length"),
    ],
    ids=["llama", "gpt_neox", "bloom"],
)
def test_an_extended_run_exports_its_new_context_length(options, key, tmp_path):
    make_run(tmp_path / "run", **options)
    export_pretrained(tmp_path / "run", tmp_path / "plain")
    _extended(tmp_path / "run", 4 * CONTEXT)
    export_pretrained(tmp_path / "run", tmp_path / "extended")
    for name, length in (("plain", CONTEXT), ("extended", 4 * CONTEXT)):
        config = json.loads((tmp_path / name / "config.json").read_text())
        tokenizer = json.loads((tmp_path / name / "tokenizer_config.json").read_text())
        assert config[key] == length and tokenizer["model_max_length"] == length, name
    plain = transformers.AutoConfig.from_pretrained(tmp_path / "plain")
    extended = transformers.AutoConfig.from_pretrained(tmp_path / "extended")
    assert getattr(extended, key) == 4 * getattr(plain, key)


def test_import_prints_bloom_training_length(tmp_path, capsys):
    save_hf("bloom", tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "a")]) == 0
    assert f"bloom: L_t = {CONTEXT} (config.json's seq_length)" in capsys.readouterr().out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["seq_length"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "bloom: L_t = 2048 (" in out and "no seq_length" in out
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "c"), "--context-length", "64"]) == 0
    assert "bloom: L_t = 64 (--context-length" in capsys.readouterr().out


TOY = """
from extrapos.integrations.hf.architectures.gpt2 import GPT2
from extrapos.integrations.hf.registry import register


class Toy(GPT2):
    model_type = "toy_gpt2"
    label = "Toy GPT-2"
    exports = None

    def claims(self, cfg):
        return False


register(Toy())
"""


def test_a_new_architecture_is_one_file(tmp_path, monkeypatch):
    """A module dropped into architectures/ is found by the registry and imports checkpoints."""
    import sys

    import extrapos.integrations.hf.architectures as package
    from extrapos.integrations.hf import registry

    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "toy_gpt2.py").write_text(TOY)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path / "arch")])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.delitem(sys.modules, f"{package.__name__}.toy_gpt2", raising=False)
    try:
        save_hf("gpt2", tmp_path / "hf")
        config = json.loads((tmp_path / "hf" / "config.json").read_text())
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "model_type": "toy_gpt2"}))
        run = import_pretrained(tmp_path / "hf", tmp_path / "run")
        assert json.loads((run / "source.json").read_text())["architecture"] == "toy_gpt2"
        assert load_run(run).cfg.model.positions["name"] == "learned"
    finally:
        sys.modules.pop(f"{package.__name__}.toy_gpt2", None)
