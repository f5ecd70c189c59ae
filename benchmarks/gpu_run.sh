#!/usr/bin/env bash
# One command for a lent GPU (`make gpu-run`): install the wheels brought along and this checkout, offline,
# into a folder of their own, then the GPU check and the papers' first table, each stage with its own
# deadline, in at most nine minutes; at most eight files in OUT, rewritten after every stage.
# benchmarks/gpu_run.py says what each stage does; docs/distributed.md how to run it on an offline machine.
#
#   benchmarks/gpu_run.sh OUT [--wheels DIR] [--set KEY=VALUE ...] [--budget-seconds S] [--stages ...]
#
# PYTHON picks the interpreter (default: python3, the one torch is installed in).
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: benchmarks/gpu_run.sh OUT [options of benchmarks/gpu_run.py]" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${PYTHON:-python3}" "$ROOT/benchmarks/gpu_run.py" "$@"
