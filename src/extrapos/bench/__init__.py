"""`extrapos bench`: the cost of every encoding, side by side, as ratios to NoPE.

One invocation measures, with the same model size and batch for every encoding:

- the training step (forward + backward + AdamW) at L_t = 256, fp32 and bf16 autocast, with its
  model-FLOPs utilisation against the matmul peak measured here in the same precision;
- evaluation time at 1x, 4x and 16x L_t, and evaluation peak memory;
- generation tokens/s at 1k tokens of context, with the KV cache and by recomputing the prefix;
- the bf16 position-resolution diagnostic of ExPE / ExQPE (see resolution.py).

Timings are interleaved (every repeat visits every encoding) and reported as medians, so a noisy
machine slows all encodings alike and the ratios survive. Peak memory on CPU has no allocator
counter, so it is the peak growth of the resident set during the forward, sampled by a thread, in a
fresh child process per encoding: it counts everything the process really touched, kernel scratch
buffers included.

On a GPU (``run_bench_gpu``): GPT-2 small, each encoding alone on the card, absolute times,
``torch.cuda.max_memory_allocated`` and MFU against the GPU's dense bf16 peak (docs/architecture.md).

Modules: ``measure`` (the CPU timings and memory), ``llama_peer`` (against Hugging Face's Llama), ``gpu``
(the GPU bench), ``tables`` (the Markdown), ``run`` (one invocation), ``resolution`` (the bf16 position
resolution) and ``peers`` (against peer libraries on matched shapes: benchmarks/bench_peers.py, not
re-exported). The names below are the package's API.
"""

from extrapos.bench.gpu import CudaDevice, gpu_settings, gpu_training, run_bench_gpu
from extrapos.bench.llama_peer import PEER_SHAPE, bench_peer, format_peer
from extrapos.bench.measure import (
    BenchSettings,
    bench_eval_memory,
    bench_eval_time,
    bench_generation,
    bench_training,
    child_memory,
    interleaved,
    matmul_rate,
    peak_rss_growth_mb,
    timing_spread,
)
from extrapos.bench.run import bench_names, run_bench
from extrapos.bench.tables import TARGETS, format_bench, format_targets, target_rows

__all__ = [
    "PEER_SHAPE",
    "TARGETS",
    "BenchSettings",
    "CudaDevice",
    "bench_eval_memory",
    "bench_eval_time",
    "bench_generation",
    "bench_names",
    "bench_peer",
    "bench_training",
    "child_memory",
    "format_bench",
    "format_peer",
    "format_targets",
    "gpu_settings",
    "gpu_training",
    "interleaved",
    "matmul_rate",
    "peak_rss_growth_mb",
    "run_bench",
    "run_bench_gpu",
    "target_rows",
    "timing_spread",
]
