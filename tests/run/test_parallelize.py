"""run/parallelize.py in one process: the option's checks, activation checkpointing, tied-weight names,
the plan's answers on one process, and configs that stay byte-identical for runs saved before the
options existed."""

import pytest
import torch
import torch.utils.checkpoint

from extrapos.errors import UserError
from extrapos.model import Decoder
from extrapos.run import parallelize
from extrapos.run.config import RunConfig, from_dict, load_config
from extrapos.training.trainer import read_metrics, train
from tests.conftest import tiny_overrides


def test_unknown_parallel_value_names_the_key():
    with pytest.raises(UserError, match="train.parallel must be 'ddp' or 'fsdp', got 'zero3'"):
        load_config("cpu/tiny", ["train.parallel=zero3"])


def test_fsdp_in_one_process_is_one_sentence_before_anything_is_written(tiny_data, tmp_path):
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.parallel": "fsdp"}))
    with pytest.raises(UserError, match="torchrun --nproc_per_node=N"):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_new_train_keys_are_written_only_when_set():
    default = RunConfig().to_toml()
    assert "parallel =" not in default and "activation_checkpointing" not in default
    cfg = load_config(None, ["train.parallel=fsdp", "train.activation_checkpointing=true"])
    text = cfg.to_toml()
    assert 'parallel = "fsdp"' in text and "activation_checkpointing = true" in text
    again = from_dict(cfg.to_dict())
    assert again.train.parallel == "fsdp" and again.train.activation_checkpointing is True


def test_activation_checkpointing_changes_no_loss_and_no_parameter_name(tiny_data, tmp_path):
    sets = {"train.steps": 4, "model.dropout": 0.1}  # dropout: the recompute must redraw the same masks
    plain = train(
        load_config("cpu/tiny", tiny_overrides(tiny_data, **sets)), tmp_path / "plain", progress=False
    )
    ac = train(
        load_config(
            "cpu/tiny", tiny_overrides(tiny_data, **sets, **{"train.activation_checkpointing": "true"})
        ),
        tmp_path / "ac",
        progress=False,
    )
    losses = [[m["loss"] for m in read_metrics(r.run_dir) if "loss" in m] for r in (plain, ac)]
    assert len(losses[0]) == 4 and losses[0] == losses[1]

    model = Decoder(load_config("cpu/tiny", tiny_overrides(tiny_data)).model)
    names = list(model.state_dict())
    cfg = load_config("cpu/tiny", ["train.activation_checkpointing=true"])
    parallelize.Parallel.of(cfg, torch.device("cpu"), world=1).wrap(model)
    assert list(model.state_dict()) == names
    assert all(b.forward.func is torch.utils.checkpoint.checkpoint for b in model.blocks)  # recomputed


def test_tied_names_follow_safetensors_choice():
    tied = Decoder(load_config("cpu/tiny", ["model.tie_embeddings=true"]).model)
    assert parallelize.tied_names(tied) == {"tok_emb.weight": "lm_head.weight"}
    untied = Decoder(load_config("cpu/tiny", ["model.tie_embeddings=false"]).model)
    assert parallelize.tied_names(untied) == {}


def test_one_process_plan_steps_the_model_itself_and_saves_it_as_it_is():
    cpu = torch.device("cpu")
    with pytest.raises(UserError, match="torchrun --nproc_per_node=N"):
        parallelize.Parallel.of(load_config("cpu/tiny", ["train.parallel=fsdp"]), cpu, world=1)
    plan = parallelize.Parallel.of(load_config("cpu/tiny", ["model.tie_embeddings=true"]), cpu, world=1)
    assert not plan.sharded
    assert parallelize.Parallel.of(load_config("cpu/tiny", ["train.parallel=fsdp"]), cpu, world=2).sharded
    model = Decoder(load_config("cpu/tiny", ["model.tie_embeddings=true"]).model)
    wrapped = plan.wrap(model)
    assert wrapped.stepped is model and wrapped.fsdp is None and wrapped.ddp is None
    assert wrapped.ties == {"tok_emb.weight": "lm_head.weight"}
    optimizer = torch.optim.AdamW(model.parameters())
    assert wrapped.gather_state(optimizer) is None  # one process saves the model and optimizer directly


def test_train_checks_the_parallel_setting_once(tiny_data, tmp_path, monkeypatch):
    built = []
    of = parallelize.Parallel.of.__func__

    def counted(cls, cfg, device, world):
        built.append(world)
        return of(cls, cfg, device, world)

    monkeypatch.setattr(parallelize.Parallel, "of", classmethod(counted))
    train(
        load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 1})),
        tmp_path / "r",
        progress=False,
    )
    assert built == [1]  # train() builds the plan before writing; the Trainer asks it, never rebuilds it
