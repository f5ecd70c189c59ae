"""The decoder: both flavours, presets, init, parameter and FLOP accounting, user errors."""

import math

import pytest
import torch

from extrapos.errors import UserError
from extrapos.model import (
    MODEL_PRESETS,
    Decoder,
    count_parameters,
    flops_per_token,
    matmul_parameters,
    model_config,
)


def tiny(**overrides):
    base = dict(n_layers=2, d_model=32, n_heads=4, vocab_size=97, train_length=16)
    return model_config(**{**base, **overrides})


def batch(cfg, B=2, T=10, offset=0):
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    positions = torch.arange(offset, offset + T).expand(B, T)
    return tokens, positions


@pytest.mark.parametrize(
    "flavour,extra",
    [
        ("gpt2", {}),
        ("llama", {}),
        ("llama", {"n_kv_heads": 2, "tie_embeddings": False}),
    ],
)
def test_forward_backward(flavour, extra):
    torch.manual_seed(0)
    cfg = tiny(flavour=flavour, **extra)
    model = Decoder(cfg)
    tokens, positions = batch(cfg)
    logits = model(tokens, positions)
    assert logits.shape == (2, 10, cfg.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    # untrained model: loss close to ln(V)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.5


def test_flavour_structure():
    gpt2, llama = Decoder(tiny(flavour="gpt2")), Decoder(tiny(flavour="llama"))
    assert isinstance(gpt2.norm, torch.nn.LayerNorm) and gpt2.blocks[0].attn.qkv.bias is not None
    assert isinstance(llama.norm, torch.nn.RMSNorm) and llama.norm.eps == 1e-5
    assert llama.blocks[0].attn.qkv.bias is None and hasattr(llama.blocks[0].mlp, "gate")
    assert gpt2.lm_head.weight is gpt2.tok_emb.weight
    untied = Decoder(tiny(flavour="llama", tie_embeddings=False))
    assert untied.lm_head.weight is not untied.tok_emb.weight
    # llama hidden: 8d/3 rounded up to a multiple of 256
    assert model_config("llama-m").hidden == 2816 and model_config("llama-s").hidden == 2048


def test_any_length_and_explicit_positions():
    cfg = tiny()
    model = Decoder(cfg).eval()
    tokens, positions = batch(cfg, T=5 * cfg.train_length)  # rope: no length bound
    assert torch.isfinite(model(tokens, positions)).all()
    with pytest.raises(ValueError):
        model(tokens, positions[:, :-1])


def test_init():
    torch.manual_seed(0)
    cfg = model_config(n_layers=8, d_model=256, n_heads=4, vocab_size=512)
    model = Decoder(cfg)
    blk = model.blocks[0]
    assert abs(blk.attn.qkv.weight.std().item() - 0.02) < 0.002
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert abs(blk.attn.proj.weight.std().item() - residual) < 0.1 * residual
    assert abs(blk.mlp.down.weight.std().item() - residual) < 0.1 * residual
    assert (blk.attn.qkv.bias == 0).all() and (blk.norm1.weight == 1).all()


def test_dropout_only_in_training():
    torch.manual_seed(0)
    cfg = tiny(dropout=0.5)
    model = Decoder(cfg)
    tokens, positions = batch(cfg)
    model.eval()
    assert torch.equal(model(tokens, positions), model(tokens, positions))
    model.train()
    assert not torch.equal(model(tokens, positions), model(tokens, positions))


def _count(preset, **overrides):
    with torch.device("meta"):
        return count_parameters(Decoder(model_config(preset, **overrides)))


def test_preset_parameter_counts():
    # GPT-2 small with its learned 1024-position table: 124.4M (Radford et al. 2019)
    gpt2 = _count("gpt2-small", positions={"name": "learned"})
    assert gpt2["total"] == 124_439_808 and gpt2["positional"] == 1024 * 768
    # ExPE App. B, Table 6: 35M total, 23M non-embedding
    expe = _count("expe-35m", positions={"name": "expe"})
    assert round(expe["total"] / 1e6) == 35 and round(expe["non_embedding"] / 1e6) == 23
    assert expe["positional"] == 0
    # ExPE App. C, Table 8: 135M and 342M
    assert round(_count("llama-s")["total"] / 1e6) == 135
    assert round(_count("llama-m")["total"] / 1e6) == 342
    for name in MODEL_PRESETS:
        c = _count(name)
        assert c["total"] == c["embedding"] + c["non_embedding"]


def test_flops_per_token_formula():
    cfg = model_config("gpt2-small")
    T = 1024
    N = 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 768 * 50257
    assert matmul_parameters(cfg) == N
    assert flops_per_token(cfg, T) == 6 * N + 12 * 12 * 768 * T
    llama = model_config("llama-s", n_kv_heads=4)
    d, kv = 768, 4 * 64
    assert matmul_parameters(llama) == 12 * (2 * d * d + 2 * d * kv + 3 * d * 2048) + d * 32768


def test_user_errors():
    with pytest.raises(UserError, match="preset"):
        model_config("gpt5-huge")
    with pytest.raises(UserError, match="unknown model option"):
        model_config(n_layer=3)
    with pytest.raises(UserError, match="divisible"):
        model_config(d_model=30, n_heads=4)
    with pytest.raises(UserError, match="flavour"):
        model_config(flavour="bert")
    with pytest.raises(UserError, match="no option"):
        Decoder(tiny(positions={"name": "rope", "bse": 10.0}))
    with pytest.raises(UserError, match="must be"):
        Decoder(tiny(positions={"name": "rope", "base": "large"}))
    with pytest.raises(UserError, match="unknown positional encoding"):
        Decoder(tiny(positions={"name": "ropey"}))
    model = Decoder(tiny())
    with pytest.raises(UserError, match="no option"):
        model.pos.set_options(scale=0.5)


def test_inference_mode_and_reused_positions_buffer():
    """Decoding loops may reuse one positions tensor in place; RoPE's per-forward cos/sin memo must not go
    stale."""
    torch.manual_seed(0)
    model = Decoder(tiny()).eval()
    tokens = torch.randint(0, 97, (1, 4))
    with torch.inference_mode():
        full = model(tokens, torch.arange(4)[None])
        cache, pos, steps = model.new_cache(), torch.zeros(1, 1, dtype=torch.long), []
        for t in range(4):
            pos.fill_(t)
            steps.append(model(tokens[:, t : t + 1], pos, cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_the_positions_plan_is_typed_frozen_and_built_once():
    """``ModelConfig.positions`` stays the TOML table; the plan built from it holds the encoding's own
    Options (typed, frozen), once per config, and the model shares them (issue 38, item 4)."""
    import dataclasses

    from extrapos.model import ModelConfig
    from extrapos.positions.absolute import LearnedAbsolute
    from extrapos.positions.rotary import RoPE

    table = {"name": "rope", "base": 500.0}
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=16, train_length=8, positions=table)
    plan = cfg.positions_plan()
    assert plan is cfg.positions_plan()
    assert isinstance(plan.options, RoPE.Options) and plan.options_as(RoPE.Options).base == 500.0
    table["base"] = 5.0  # the caller's dict: the config holds its own copy, the plan stays right
    assert (
        cfg.positions == {"name": "rope", "base": 500.0}
        and cfg.positions_plan().options_as(RoPE.Options).base == 500.0
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.positions = {"name": "nope"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.options.base = 2.0
    with pytest.raises(TypeError, match="LearnedAbsolute"):
        plan.options_as(LearnedAbsolute.Options)
    assert Decoder(cfg).pos.options is plan.options
    changed = dataclasses.replace(cfg, positions={"name": "alibi"})  # a changed model is a new config
    assert changed.positions_plan().name == "alibi" and cfg.positions_plan().name == "rope"
    with pytest.raises(UserError, match="model.positions.base"):
        ModelConfig(positions={"name": "rope", "base": 0}).positions_plan()
