"""Layer schedules (positions/schedule.py): an encoding on some layers, another (NoPE by default) on the
rest."""

import pytest
import torch

from extrapos.errors import UserError
from extrapos.model import Decoder, model_config
from extrapos.positions.base import EncodingContext
from extrapos.positions.registry import build_encoding
from extrapos.positions.schedule import LayerSchedule, parse_layers
from extrapos.presets import read_toml
from extrapos.run.checkpoint import load_weights, save_checkpoint
from extrapos.run.config import from_dict, load_config
from extrapos.tools.catalog import encodings_table, encodings_text
from tests.positions.encoding_checks import assert_causal

HYBRIDS = {
    "rope, nope every 2nd": {"name": "rope", "layers": "all but every 2nd"},
    "cable, cope on the rest": {"name": "cable", "layers": [0, 3], "others": {"name": "cope"}},
    "xpos every 2nd from 0, fox": {"name": "xpos", "layers": "every 2nd from 0", "others": "fox"},
    "dape, kerple every 4th": {
        "name": "dape",
        "layers": "all but every 4th",
        "others": {"name": "kerple-log"},
    },
    "expe, alibi on layer 2": {"name": "expe", "layers": [0, 1, 3], "others": {"name": "alibi"}},
}


def model(positions, n_layers=4, seed=0, perturb=0.3, **extra):
    torch.manual_seed(seed)
    cfg = model_config(
        n_layers=n_layers, d_model=32, n_heads=4, vocab_size=50, train_length=16, positions=positions, **extra
    )
    m = Decoder(cfg).double().eval()
    with torch.no_grad():  # encoding parameters away from their init (CoPE's table starts at zero)
        for p in m.pos.parameters():
            p.add_(perturb * torch.randn_like(p))
    return m


def one_sentence(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    body = text.replace("e.g. ", "")
    assert body.endswith(".") and ". " not in body and "\n" not in body, text
    return text


@pytest.mark.parametrize(
    "spec, n, expected",
    [
        ("every 4th", 8, (3, 7)),  # SmolLM3 / Llama 4's NoPE layers: (i + 1) % 4 == 0
        ("every 4th", 4, (3,)),
        ("all but every 4th", 8, (0, 1, 2, 4, 5, 6)),
        ("every 2nd from 0", 5, (0, 2, 4)),
        ("Every  3rd from 1", 7, (1, 4)),
        ("every 1st", 3, (0, 1, 2)),
        ("all", 3, (0, 1, 2)),
        ([2, 0], 4, (0, 2)),
    ],
)
def test_layer_specs(spec, n, expected):
    assert parse_layers(spec, n) == expected


@pytest.mark.parametrize(
    "spec, match",
    [
        ([0, 4], "names layer 4, but the model has 4 layers"),
        ([-1], "names layer -1"),
        ([1, 1], "lists layer 1 twice"),
        ("every 4th from 4", "starts at layer 4"),
        ("every 8th", "selects none of the model's 4 layers"),
        ("all but every 1st", "selects none"),
        ([], "selects none"),
        ("every fourth", "is not a layer schedule"),
        ("every 0th", "step of at least 1"),
        (3, "must be str or a list of int"),
    ],
)
def test_bad_layer_specs_are_one_sentence(spec, match):
    with pytest.raises(UserError, match=match) as e:
        parse_layers(spec, 4)
    one_sentence(e)


@pytest.mark.parametrize(
    "sets, match",
    [
        (['model.positions.others="alibi"'], "needs model.positions.layers"),
        (
            ['model.positions.layers="every 2nd"', 'model.positions.others={name="alibi", layers="all"}'],
            "schedule of its own",
        ),
        (
            ['model.positions.layers="every 2nd"', 'model.positions.others.name="learned"'],
            "'learned' \\(others",
        ),
        (['model.positions.name="sinusoidal"', 'model.positions.layers="all"'], "'sinusoidal'"),
        (
            ['model.positions.name="expe"', "model.positions.once=true", "model.positions.layers=[0]"],
            "'expe'",
        ),
        (
            ['model.positions.layers="every 2nd"', 'model.positions.others={name="alibi", nosuch=1}'],
            "has no option nosuch",
        ),
        (['model.positions.layers="every 2nd"', "model.positions.nosuch=1"], "has no option nosuch"),
        (["model.positions.layers=[0, 2]"], "names layer 2, but the model has 2 layers"),
        (['model.positions.layers="every 2nd"', "model.positions.others=3"], "must be a table"),
    ],
)
def test_config_errors(sets, match):
    with pytest.raises(UserError, match=match) as e:
        load_config("cpu/tiny", sets)
    one_sentence(e)


def test_the_encoder_refuses_a_causal_only_encoding_on_the_other_layers():
    with pytest.raises(UserError, match="'cope' cannot be used by the encoder"):
        model_config(
            "cpu-encoder", positions={"name": "rope", "layers": "every 2nd", "others": {"name": "cope"}}
        )


@pytest.mark.parametrize(
    "name", ["rope", "xpos", "alibi", "kerple-log", "fire", "t5", "cable", "fox", "cope", "dape", "expe"]
)
def test_a_schedule_of_every_layer_is_the_plain_model_bit_for_bit(name):
    plain = model({"name": name})
    scheduled = model({"name": name, "layers": "all"})
    assert isinstance(scheduled.pos, LayerSchedule) and scheduled.pos.others is None
    a, b = plain.state_dict(), scheduled.state_dict()
    renamed = {k.replace("pos.main.", "pos.", 1): v for k, v in b.items()}
    assert renamed.keys() == a.keys() and all(torch.equal(a[k], renamed[k]) for k in a)
    tokens = torch.randint(0, 50, (2, 11))
    positions = torch.arange(11).expand(2, 11) + torch.tensor([[0], [5]])
    with torch.no_grad():
        assert torch.equal(plain(tokens, positions), scheduled(tokens, positions))


def test_each_layer_runs_its_own_encoding():
    """Layers 1 and 3 of "rope, nope every 2nd" compute what a NoPE block computes, and ignore positions;
    layers 0 and 2 compute RoPE blocks."""
    m = model(HYBRIDS["rope, nope every 2nd"])
    ctx = EncodingContext(d_model=32, n_heads=4, head_dim=8, n_layers=4, train_length=16)
    reference = {"rope": build_encoding("rope", ctx), "nope": build_encoding("nope", ctx)}
    seen = {}
    hooks = [
        b.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, (args[0], out)))
        for i, b in enumerate(m.blocks)
    ]
    tokens, positions = torch.randint(0, 50, (2, 9)), torch.arange(9).expand(2, 9)
    with torch.no_grad():
        m(tokens, positions)
        for i, block in enumerate(m.blocks):
            h, out = seen[i]
            enc = "nope" if i in (1, 3) else "rope"
            assert torch.equal(block(h, positions, reference[enc], None), out)
            moved = block(h, positions * 3 + 7, m.pos, None)  # other positions, same relative order
            assert torch.equal(moved, out) if enc == "nope" else not torch.allclose(moved, out)
    for hook in hooks:
        hook.remove()


def test_each_encoding_owns_parameters_for_its_own_layers_only():
    m = model(HYBRIDS["dape, kerple every 4th"], perturb=0.0)
    assert len(m.pos.main.mlps) == 3 and m.pos.main.base.r1.shape[0] == 3  # layers 0, 1, 2
    assert m.pos.others.r1.shape[0] == 1  # layer 3
    assert [m.pos.at_layer(i) for i in range(4)] == [
        (m.pos.main, 0),
        (m.pos.main, 1),
        (m.pos.main, 2),
        (m.pos.others, 0),
    ]
    # no dead parameter (DDP without find_unused_parameters needs every one to get a gradient)
    for positions in HYBRIDS.values():
        m = model(positions)
        m(torch.randint(0, 50, (2, 12)), torch.arange(12).expand(2, 12)).logsumexp(-1).mean().backward()
        for name, p in m.pos.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{positions}: no gradient reaches {name}"


@pytest.mark.parametrize("which", list(HYBRIDS))
def test_causal(which):
    assert_causal(model(HYBRIDS[which]))


@pytest.mark.parametrize("which", list(HYBRIDS))
def test_cached_decoding_equals_the_full_forward(which):
    m = model(HYBRIDS[which])
    B, T = 2, 12
    tokens = torch.randint(0, 50, (B, T))
    positions = torch.arange(T).expand(B, T) + torch.tensor([[3], [1]])
    with torch.no_grad():
        full = m(tokens, positions)
        for chunks in ([1] * T, [5] + [1] * 7, [4, 3, 1, 4]):
            cache, out, t = m.new_cache(), [], 0
            for c in chunks:
                out.append(m(tokens[:, t : t + c], positions[:, t : t + c], cache))
                t += c
            torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-10, rtol=1e-10)


def test_set_options_reach_the_scheduled_encoding():
    m = model({"name": "xpos", "layers": "every 2nd", "others": "rope"})
    m.pos.set_options(blockwise=True, block_length=4)
    assert (
        m.pos.options.blockwise
        and m.pos.main.options.blockwise
        and not hasattr(m.pos.others.options, "blockwise")
    )
    with pytest.raises(UserError, match="no option"):
        m.pos.set_options(nosuch=1)


def test_checkpoint_and_config_round_trip(tmp_path):
    cfg = load_config(
        "cpu/tiny",
        [
            "model.n_layers=4",
            'model.positions.name="cable"',
            'model.positions.layers="all but every 4th"',
            'model.positions.others.name="fox"',
        ],
    )
    (tmp_path / "config.toml").write_text(cfg.to_toml())
    back = from_dict(read_toml(tmp_path / "config.toml"))
    assert back == cfg and back.model.positions["others"] == {"name": "fox"}
    torch.manual_seed(0)
    a = Decoder(cfg.model).eval()
    with torch.no_grad():
        for p in a.pos.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ckpt = save_checkpoint(tmp_path, 1, a, None, {})
    torch.manual_seed(1)
    b = Decoder(back.model).eval()
    load_weights(b, ckpt)
    tokens = torch.randint(0, cfg.model.vocab_size, (1, 20))
    with torch.no_grad():
        assert torch.equal(a(tokens, torch.arange(20)[None]), b(tokens, torch.arange(20)[None]))
    with pytest.raises(UserError, match="does not match the model"):  # the plain model has other keys
        load_weights(
            Decoder(load_config("cpu/tiny", ["model.n_layers=4", 'model.positions.name="cable"']).model), ckpt
        )


def test_catalog_and_export_say_what_a_schedule_takes():
    rows = {r["name"]: r for r in encodings_table("cpu-tiny")}
    assert not rows["learned"]["schedulable"] and not rows["expe-once"]["schedulable"]
    assert rows["rope"]["schedulable"] and rows["expe"]["schedulable"] and rows["cope"]["schedulable"]
    text = encodings_text("cpu-tiny")
    assert "model.positions.layers" in text and "sinusoidal, learned, expe-once act on the embeddings" in text
    from extrapos.integrations.hf import export_architecture

    cfg = model_config("cpu-llama", positions={"name": "rope", "layers": "all but every 4th"})
    with pytest.raises(UserError, match="layer schedule") as e:
        export_architecture(cfg)
    one_sentence(e)


def test_a_hybrid_run_trains_saves_and_loads(tiny_data, tmp_path):
    from extrapos.run.directory import load_run
    from extrapos.training.trainer import train
    from tests.conftest import tiny_overrides

    sets = tiny_overrides(tiny_data, **{"train.steps": 2, "model.positions.layers": '"every 2nd"'})
    train(load_config("cpu/tiny", sets), tmp_path / "run", progress=False)
    assert 'layers = "every 2nd"' in (tmp_path / "run" / "config.toml").read_text()
    run = load_run(tmp_path / "run")
    assert run.model.pos.layers == (1,) and run.model.pos.others.registry_name == "nope"
    tokens = torch.randint(0, 512, (1, 10))
    with torch.no_grad():
        full = run.model(tokens, torch.arange(10)[None])
        cache = run.model.new_cache()
        steps = torch.cat([run.model(tokens[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(10)], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
