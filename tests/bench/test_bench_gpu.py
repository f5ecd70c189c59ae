"""`extrapos bench` on a GPU, run on CPU: the table of bf16 peaks, the MFU arithmetic, and the GPU bench's
code with the CUDA queries (device name, bf16 support, allocator counters) stood in for."""

import pytest
import torch

from extrapos.bench import BenchSettings, CudaDevice, format_bench, run_bench_gpu
from extrapos.model import flops_per_token, model_config
from extrapos.run.perf import gpu_bf16_peak, mfu


@pytest.mark.parametrize(
    "name,expected",
    [
        ("NVIDIA A100-SXM4-80GB", ("A100", 312e12)),
        ("NVIDIA A100 80GB PCIe", ("A100", 312e12)),
        ("NVIDIA H100 80GB HBM3", ("H100 SXM", 989e12)),
        ("NVIDIA H100 PCIe", ("H100 PCIe", 756e12)),
        ("NVIDIA L4", ("L4", 121e12)),
        ("NVIDIA L40S", ("L40S", 362e12)),
        ("NVIDIA GeForce RTX 4090", ("RTX 4090", 165e12)),
        ("NVIDIA A10", ("A10", 125e12)),
        ("NVIDIA A10G", None),  # not an A10: its peak is not on record here
        ("NVIDIA H100 NVL", None),
        ("Tesla V100-SXM2-16GB", None),  # no bf16
    ],
)
def test_bf16_peak_by_device_name(name, expected):
    assert gpu_bf16_peak(name) == expected


def test_mfu_is_model_flops_per_second_over_the_peak():
    # GPT-2 small at L_t = 1024: 6 N + 12 n_layers d T FLOPs per token (PaLM, App. B)
    cfg = model_config("gpt2-small", vocab_size=50304, train_length=1024, positions={"name": "rope"})
    per_token = flops_per_token(cfg, 1024)
    assert 8e8 < per_token < 9e8  # 6 x 124M + 12 x 12 x 768 x 1024
    assert mfu(per_token, 150_000, 312e12) == pytest.approx(per_token * 150_000 / 312e12)
    assert 0.3 < mfu(per_token, 150_000, 312e12) < 0.5
    assert mfu(per_token, 150_000, None) is None


class FakeCuda(CudaDevice):
    """The CUDA queries of the GPU bench answered on CPU: a name, bf16 support, allocator counters."""

    def __init__(self, name, bf16):
        super().__init__(torch.device("cpu"))
        self._name, self._bf16, self.resets = name, bf16, 0

    def name(self):
        return self._name

    def bf16(self):
        return self._bf16

    def sync(self):
        pass

    def reset_peak(self):
        self.resets += 1

    def allocated(self):
        return 1 << 20

    def max_allocated(self):
        return 5 << 20

    def free(self):
        pass


TINY = BenchSettings(
    size="cpu-tiny",
    vocab=64,
    train_length=16,
    batch=2,
    eval_lengths=(1, 2),
    context=32,
    new_tokens=2,
    repeats=1,
    steps_per_repeat=1,
)


def test_gpu_bench_reports_absolute_times_allocator_peaks_and_mfu_against_the_table():
    cuda = FakeCuda("NVIDIA A100-SXM4-40GB", bf16=True)
    r = run_bench_gpu(["nope", "kerple-log"], TINY, cuda)
    assert r["machine"]["bf16_peak_tflops"] == 312 and r["machine"]["eval_precision"] == "bf16"
    per_token = flops_per_token(model_config("cpu-tiny", vocab_size=64, train_length=16), 16)
    for n in ("nope", "kerple-log"):
        bf16, fp32 = r["train_bf16"][n], r["train_fp32"][n]
        assert bf16["mfu"] == pytest.approx(per_token * bf16["tokens_per_s"] / 312e12)
        assert bf16["tokens_per_s"] == pytest.approx(2 * 16 / (bf16["step_ms"] / 1e3))
        assert fp32["mfu"] is None and fp32["peak_mb"] == 5.0 and bf16["peak_mb"] == 5.0
        assert r["eval_memory"][n] == {"peak_mb_1x": 4.0, "peak_mb_2x": 4.0}  # above the resident 1 MB
        assert r["eval_time"][n]["time_ms_2x"] > 0 and r["generation"][n]["decode_ms"] > 0
    assert r["train_bf16"]["nope"]["ratio"] == 1.0 and cuda.resets == 2 * 2 + 2 * 2
    text = format_bench(r)
    assert "on NVIDIA A100-SXM4-40GB (cpu)" in text and "A100 dense bf16 peak, 312 TFLOP/s" in text
    row = next(line for line in text.splitlines() if line.startswith("| kerple-log |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "–" and cells[4].endswith("%") and cells[5:7] == ["5", "5"]


def test_gpu_bench_on_a_gpu_not_in_the_table_omits_mfu_with_a_note():
    r = run_bench_gpu(["nope"], TINY, FakeCuda("NVIDIA Made-Up 9000", bf16=False))
    assert r["machine"]["bf16_peak_tflops"] is None and r["train_bf16"] is None
    text = format_bench(r)
    assert "no MFU: 'NVIDIA Made-Up 9000' is not in the table of dense bf16 peaks" in text
    assert "this GPU has no bf16" in text
    assert "| nope | " in text and "| – | skipped | - |" in text
