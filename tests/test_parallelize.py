"""parallelize.py in one process: the option's checks, activation checkpointing, tied-weight names,
and configs that stay byte-identical for runs saved before the options existed."""

import pytest
import torch
import torch.utils.checkpoint

from extrapos import parallelize
from extrapos.config import RunConfig, from_dict, load_config
from extrapos.errors import UserError
from extrapos.model import Decoder
from extrapos.train import read_metrics, train
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
    parallelize.parallelize(
        model, load_config("cpu/tiny", ["train.activation_checkpointing=true"]), torch.device("cpu"), world=1
    )
    assert list(model.state_dict()) == names
    assert all(b.forward.func is torch.utils.checkpoint.checkpoint for b in model.blocks)  # recomputed


def test_tied_names_follow_safetensors_choice():
    tied = Decoder(load_config("cpu/tiny", ["model.tie_embeddings=true"]).model)
    assert parallelize.tied_names(tied) == {"tok_emb.weight": "lm_head.weight"}
    untied = Decoder(load_config("cpu/tiny", ["model.tie_embeddings=false"]).model)
    assert parallelize.tied_names(untied) == {}
