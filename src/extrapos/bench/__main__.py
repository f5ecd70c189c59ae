"""The memory child of `extrapos bench`: python -m extrapos.bench --memory-child NAME --settings JSON
(a fresh process per encoding, so its resident-set growth is that encoding's alone)."""

import argparse
import json
import sys

import torch

from extrapos.bench.measure import BenchSettings, child_memory

ap = argparse.ArgumentParser()
ap.add_argument("--memory-child", required=True)
ap.add_argument("--settings", required=True)
a = ap.parse_args()
raw = json.loads(a.settings)
raw["eval_lengths"] = tuple(raw["eval_lengths"])
settings = BenchSettings(**raw)
if settings.threads:  # the parent's --threads: the same kernels' scratch buffers as in its timings
    torch.set_num_threads(settings.threads)
# the answer to the parent (measure.py reads it): this child's data on stdout, not a message to a person
sys.stdout.write(json.dumps(child_memory(a.memory_child, settings)) + "\n")
