#!/usr/bin/env bash
# The prepared GPU check in one command: see bench/device_check.py (stages, output, targets).
#   bash bench/device_check.sh           one NVIDIA GPU, after `make gpu-wheels` here (.whl carried)
#   bash bench/device_check.sh --dry     on a CPU: tiny shapes, the same stages and output files
# The GPU machine's python3 holds jax and torch; PYTHON overrides it.
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" -m bench.device_check "$@"
