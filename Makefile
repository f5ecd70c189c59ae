# Two entry points for a fresh machine: `make demo` (set up + the main job) and `make test`.
# torch is pinned to the CPU build 2.13.0 here (served locally, no CUDA download); the package
# itself only asks for torch>=2.5, so GPU users install their own torch first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.extrapos-installed

.PHONY: setup demo test test-all lint bench gpu-check gpu-run clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# the quick comparison; it ends with the table beside the published one (docs/results/quick/results.json),
# each cell judged against the run-to-run noise quick-seeds measured, and one line of verdict
demo: $(STAMP)
	$(BIN)/extrapos compare quick --out runs/compare-quick

test: $(STAMP)
	$(BIN)/python -m pytest -n 2

test-all: $(STAMP)
	$(BIN)/python -m pytest -m ""

# ruff, then the type checker over the package ([tool.mypy] in pyproject.toml: all of src/ but its exclude list)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_data.py
	$(BIN)/python benchmarks/bench_forward.py

# Everything a GPU can prove in minutes (doctor, bf16 runs per family, kill/resume, DDP/FSDP2, eval 1..16x, MFU)
# -> gpu-check/summary.{json,md};
# without CUDA a clearly labelled stand-in on the CPU paths (benchmarks/gpu_check.py says what is not in it yet)
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --out gpu-check

# The one command of a lent GPU (no network, at most 9 minutes): install from wheels/, then gpu-check's fast form
# and the papers' first table (gpu/first-table), each with its own deadline -> at most 8 files in $(GPU_RUN_OUT);
# without CUDA the same stages at CPU sizes (a stand-in). Needs no venv: the GPU machine's own python3 and torch.
GPU_RUN_OUT ?= gpu-run
STAGE ?= first
gpu-run:
	PYTHON=$(PYTHON) bash benchmarks/gpu_run.sh $(GPU_RUN_OUT) --step $(STAGE)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
