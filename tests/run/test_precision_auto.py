"""train.precision = "auto" (issue 39): bf16 only where the CPU multiplies bf16 natively and the model is
wide enough for it to pay, fp32 otherwise, bf16 on a GPU; the fp32 path is unchanged bit for bit."""

import pytest
import torch

from extrapos.run import precision
from extrapos.run.config import load_config
from extrapos.training import trainer as train_mod
from tests.conftest import tiny_overrides

CPU = torch.device("cpu")
SMALL, MID = 128, 512  # cpu/small's width and the d 512 x 6 model's


def cpu_with(monkeypatch, capability: str, amx: bool = False, avx512_bf16: bool = False) -> None:
    """A CPU as torch reports it: its capability string and its bf16 units."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: {"amx": amx, "avx512_bf16": avx512_bf16})


@pytest.mark.parametrize(
    "capability, units",
    [
        ("AVX2", {}),  # emulated bf16, ~20x slower
        ("AVX2", {"avx512_bf16": True}),  # ATEN_CPU_CAPABILITY=avx2 on a bf16 CPU: torch's kernels are AVX2
        ("AVX512", {}),  # AVX-512 without the bf16 units (Skylake, Cascade Lake)
        ("DEFAULT", {}),
    ],
)
def test_auto_picks_fp32_without_native_bf16_at_any_width(monkeypatch, capability, units):
    cpu_with(monkeypatch, capability, **units)
    assert not precision.cpu_has_fast_bf16()
    for width in (SMALL, MID, 2048):
        choice, why = precision.auto_precision(CPU, width)
        assert choice == "fp32" and "emulates bf16" in why and capability in why


@pytest.mark.parametrize("units", [{"amx": True}, {"avx512_bf16": True}, {"amx": True, "avx512_bf16": True}])
def test_auto_on_a_native_bf16_cpu_picks_by_width(monkeypatch, units):
    cpu_with(monkeypatch, "AVX512", **units)
    assert precision.cpu_has_fast_bf16()
    small, why = precision.auto_precision(CPU, SMALL)
    # never slower than fp32 on cpu/small
    assert small == "fp32" and "casts cost what its matmuls save" in why
    assert precision.auto_precision(CPU, precision.AUTO_BF16_MIN_D_MODEL - 1)[0] == "fp32"
    assert precision.auto_precision(CPU, precision.AUTO_BF16_MIN_D_MODEL)[0] == "bf16"
    assert precision.auto_precision(CPU, MID)[0] == "bf16"


def test_auto_on_a_gpu_follows_its_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.auto_precision(torch.device("cuda"), SMALL)[0] == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.auto_precision(torch.device("cuda"), MID)[0] == "fp32"


def test_explicit_precisions_are_kept_whatever_the_machine(monkeypatch):
    cpu_with(monkeypatch, "AVX2")
    cfg = load_config("cpu/tiny", ["train.precision=bf16"])
    assert precision.with_resolved_precision(cfg, CPU) == (cfg, None)
    assert precision.resolve_precision("fp32", CPU, MID) == "fp32"


def test_a_bad_precision_names_auto(tmp_path):
    from extrapos.errors import UserError

    with pytest.raises(UserError, match="'fp32', 'bf16' or 'auto'"):
        load_config("cpu/tiny", ["train.precision=fp16"])


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in train_mod.read_metrics(run_dir) if "loss" in m]


def test_fp32_training_is_bit_identical_and_auto_records_its_choice(tiny_data, tmp_path, monkeypatch):
    """A fixed seed trains to the same losses, bit for bit: fp32 as it is, fp32 with the precision
    resolution taken out (the code before auto existed), and auto on a narrow model (which picks fp32
    even on a native-bf16 CPU); the auto run's config.toml says what it computed in."""
    cpu_with(monkeypatch, "AVX512", amx=True)
    sets = tiny_overrides(tiny_data, **{"train.steps": 6})
    train_mod.train(load_config("cpu/tiny", sets), tmp_path / "fp32", progress=False)
    auto = load_config("cpu/tiny", sets + ['train.precision="auto"'])
    train_mod.train(auto, tmp_path / "auto", progress=False)
    with monkeypatch.context() as m:
        m.setattr(train_mod, "with_resolved_precision", lambda cfg, device: (cfg, None))
        train_mod.train(load_config("cpu/tiny", sets), tmp_path / "before", progress=False)
    reference = losses(tmp_path / "before")
    assert len(reference) == 6 and all(loss > 0 for _, loss in reference)
    assert losses(tmp_path / "fp32") == reference
    assert losses(tmp_path / "auto") == reference
    assert 'precision = "fp32"' in (tmp_path / "auto" / "config.toml").read_text()


def test_auto_trains_a_wide_model_in_bf16_on_a_native_cpu(tiny_data, tmp_path, monkeypatch, capsys, console):
    cpu_with(monkeypatch, "AVX512", amx=True)
    sets = tiny_overrides(
        tiny_data, **{"train.steps": 2, "model.d_model": MID, "model.n_heads": 8, "model.n_layers": 1}
    )
    cfg = load_config("cpu/tiny", sets + ['train.precision="auto"'])
    train_mod.train(cfg, tmp_path / "run", progress=False)
    assert 'precision = "bf16"' in (tmp_path / "run" / "config.toml").read_text()
    assert "train.precision = auto -> bf16" in capsys.readouterr().out
    # resuming with "auto" compares what it picks here with what the run saved: the same, so it resumes
    more = load_config("cpu/tiny", [*sets, 'train.precision="auto"', "train.steps=3"])
    train_mod.train(more, tmp_path / "run", resume=True, progress=False)
    assert [step for step, _ in losses(tmp_path / "run")] == [1, 2, 3]
