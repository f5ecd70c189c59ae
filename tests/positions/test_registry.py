"""The registry: every encoding builds, declares its metadata, rejects bad options, trains, is listed."""

import dataclasses
import json

import pytest
import torch

from extrapos.cli import main
from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions import registry
from extrapos.positions.base import EncodingContext, PositionalEncoding
from extrapos.tools.catalog import encodings_table

CTX = EncodingContext(d_model=32, n_heads=4, head_dim=8, n_layers=2, train_length=16)
# every encoding the README promises (the papers' methods, their ablations and the baselines)
PROMISED = {
    "nope",
    "sinusoidal",
    "learned",
    "rope",
    "alibi",
    "kerple-log",
    "kerple-power",
    "fire",
    "t5",
    "cable",
    "cable-nw",
    "k-cable",
    "cable-official",
    "expe",
    "expe-stable",
    "expe-l1",
    "expe-once",
    "expe-learned",
    "expe-learned-init",
    "exqpe",
}


def test_promised_encodings_are_registered_by_discovery():
    assert PROMISED <= set(registry.names())
    # discovery imports every module of extrapos.positions but the protocol and the registry
    assert {"extrapos.positions.rotary", "extrapos.positions.cable"} <= set(registry.encoding_modules())
    assert not {"extrapos.positions.base", "extrapos.positions.registry"} & set(registry.encoding_modules())


@pytest.mark.parametrize("name", registry.names())
def test_metadata_and_options(name):
    s = registry.spec(name)
    assert issubclass(s.cls, PositionalEncoding)
    assert s.cls.family and s.cls.family != "none" or name == "nope"
    assert s.cls.paper and s.description
    assert dataclasses.is_dataclass(s.cls.Options)
    enc = registry.build_encoding(name, CTX)
    assert enc.registry_name == name
    assert isinstance(registry.default_options(name), dict)
    with pytest.raises(UserError, match="no option"):
        registry.build_encoding(name, CTX, {"no_such_option": 1})


def _learnable():
    return [n for n in registry.names() if any(True for _ in registry.build_encoding(n, CTX).parameters())]


@pytest.mark.parametrize("name", _learnable())
def test_gradients_reach_every_encoding_parameter(name):
    torch.manual_seed(0)
    cfg = model_config(
        n_layers=2, d_model=32, n_heads=4, vocab_size=41, train_length=16, positions={"name": name}
    )
    model = Decoder(cfg)
    params = dict(model.pos.named_parameters())
    tokens = torch.randint(0, 41, (2, 16))
    positions = torch.arange(16).expand(2, 16)
    model(tokens, positions).logsumexp(-1).mean().backward()
    for pname, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient reaches {pname}"


def test_learnable_set_includes_ours():
    assert {"learned", "expe-learned", "expe-learned-init"} <= set(_learnable())


def test_wrong_option_type_is_a_user_error():
    with pytest.raises(UserError, match="must be"):
        registry.build_encoding("expe", CTX, {"l": 2.5})
    with pytest.raises(UserError, match="unknown positional encoding"):
        registry.spec("rotary")


def test_encodings_table_counts_parameters():
    rows = {r["name"]: r for r in encodings_table("gpt2-tiny")}
    assert rows["learned"]["parameters"] == 256 * 512  # L_t rows of d_model
    assert rows["rope"]["parameters"] == 0 and rows["expe-learned"]["parameters"] == 2
    assert rows["exqpe"]["options"]["theta2"] == 1 / 16
    assert set(rows) == set(registry.names())


def test_encodings_table_of_an_encoder_size_has_no_count_for_causal_only_encodings(capsys):
    # the catalog's context is the preset's own (EncodingContext.of): an encoder's is bidirectional
    rows = {r["name"]: r for r in encodings_table("cpu-encoder")}
    causal_only = [n for n in registry.names() if registry.spec(n).cls.causal_only]  # the table's order
    assert {"xpos", "cope"} <= set(causal_only)
    assert {n for n, r in rows.items() if r["parameters"] is None} == set(causal_only)
    assert rows["learned"]["parameters"] == 64 * 128 and rows["alibi"]["parameters"] == 0
    assert main(["encodings", "--size", "cpu-encoder"]) == 0
    out = capsys.readouterr().out
    assert f"{', '.join(causal_only)} are causal only: the bidirectional cpu-encoder model" in out
    assert main(["encodings", "--size", "cpu-tiny"]) == 0
    assert "causal only" not in capsys.readouterr().out


def test_cli_encodings(capsys):
    assert main(["encodings", "--size", "cpu-tiny"]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert f"\n{name} " in out
    assert main(["encodings", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["size"] == "gpt2-tiny" and {r["name"] for r in data["encodings"]} == set(registry.names())
    assert main(["encodings", "--size", "nope-size"]) == 2
    assert "unknown model preset" in capsys.readouterr().err


def test_a_rejected_option_change_leaves_the_encoding_as_it_was():
    from extrapos.errors import UserError
    from extrapos.model import Decoder, model_config

    model = Decoder(model_config("cpu-tiny", vocab_size=50, train_length=16, positions={"name": "learned"}))
    with pytest.raises(UserError):
        model.pos.set_options(interpolate_to=8)  # shorter than the table: refused
    assert model.pos.options.interpolate_to is None
