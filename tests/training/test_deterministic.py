"""``train.deterministic``: strict deterministic kernels for one run, torch's settings restored after
it, torch's refusal of an operation turned into one sentence, and no trace in a run that does not ask."""

import pytest
import torch

from extrapos.errors import UserError
from extrapos.positions import registry
from extrapos.run.config import load_config
from extrapos.training import trainer as train_mod
from extrapos.training.determinism import deterministic_kernels
from tests.conftest import tiny_overrides


def settings():
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cuda.cudnn_sdp_enabled(),
    )


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in train_mod.read_metrics(run_dir) if "loss" in m]


def test_inside_the_block_strict_and_cudnn_attention_off_after_it_as_before():
    before = settings()
    with deterministic_kernels(True):
        assert settings() == (True, False, False)  # strict: warn_only leaves flash's backward racy
    assert settings() == before
    with deterministic_kernels(False):
        assert settings() == before


def test_a_deterministic_run_repeats_its_losses_and_leaves_the_process_as_it_was(tiny_data, tmp_path):
    sets = tiny_overrides(
        tiny_data, **{"train.steps": 6, "model.dropout": 0.1, "train.deterministic": "true"}
    )
    before = settings()
    first = train_mod.train(load_config("cpu/tiny", sets), tmp_path / "a", progress=False)
    assert settings() == before
    train_mod.train(load_config("cpu/tiny", sets), tmp_path / "b", progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b") and len(losses(tmp_path / "a")) >= 2
    assert first.final_loss == first.final_loss  # not nan: the run ended
    assert "deterministic = true" in (tmp_path / "a" / "config.toml").read_text()


def test_a_run_that_does_not_ask_writes_no_key(tiny_data, tmp_path):
    cfg = load_config("cpu/tiny", tiny_overrides(tiny_data, **{"train.steps": 2}))
    train_mod.train(cfg, tmp_path / "run", progress=False)
    assert "deterministic" not in (tmp_path / "run" / "config.toml").read_text()


@pytest.mark.parametrize("name", registry.names())
def test_every_encoding_trains_under_strict_determinism_on_the_cpu(name, tiny_data, tmp_path):
    sets = tiny_overrides(
        tiny_data, **{"train.steps": 2, "train.deterministic": "true", "model.positions.name": f'"{name}"'}
    )
    result = train_mod.train(load_config("cpu/tiny", sets), tmp_path / "run", progress=False)
    assert result.steps == 2 and result.final_loss == result.final_loss


def test_an_operation_without_a_deterministic_form_is_one_sentence(tiny_data, tmp_path, monkeypatch):
    def racy(self, step):  # what torch raises on a GPU for such an operation, word for word in its head
        raise RuntimeError(
            "index_add_cuda_ does not have a deterministic implementation, but you set "
            "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
            "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
            "application."
        )

    monkeypatch.setattr(train_mod.Trainer, "train_step", racy)
    sets = tiny_overrides(tiny_data, **{"train.steps": 2, "train.deterministic": "true"})
    before = settings()
    with pytest.raises(UserError) as err:
        train_mod.train(load_config("cpu/tiny", sets), tmp_path / "run", progress=False)
    message = str(err.value)
    assert message.startswith(
        "train.deterministic: index_add_cuda_ does not have a deterministic implementation;"
    )
    assert "set train.deterministic = false" in message and "\n" not in message
    assert settings() == before


def test_other_runtime_errors_pass_through(tiny_data, tmp_path, monkeypatch):
    def broken(self, step):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(train_mod.Trainer, "train_step", broken)
    sets = tiny_overrides(tiny_data, **{"train.steps": 2, "train.deterministic": "true"})
    with pytest.raises(RuntimeError, match="out of memory"):
        train_mod.train(load_config("cpu/tiny", sets), tmp_path / "run", progress=False)
