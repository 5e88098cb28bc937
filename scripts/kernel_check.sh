#!/usr/bin/env bash
# The state kernels on an NVIDIA GPU, one command (under 8 minutes):
#
#   bash scripts/kernel_check.sh OUT            # GPU: tables, logs and profile into OUT
#   bash scripts/kernel_check.sh OUT --dry-run  # CPU, Triton's interpreter, toy sizes
#
# Per-layer paged vs contiguous state-update times for S0, S1, S2 and D0 at
# Falcon-H1-7B's geometry (bf16, batch 1-256) against the measured copy
# bandwidth, the engine's 7B decode step at b83 before and after the kernels,
# and a GPU cost profile (hbench calibrate --engine torch). Writes
# OUT/kernel_check.md, .json and .log (hbench/kernel_check.py). Needs python3
# with torch and triton; no network. A GPU machine without the ShareGPT package
# takes the workloads from HBENCH_WORKLOAD_CACHE (see scripts/device_check.sh).
set -euo pipefail
OUT="${1:?usage: kernel_check.sh OUT [--dry-run]}"
shift
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
if [ "${1:-}" = "--dry-run" ]; then
    export TRITON_INTERPRET=1
fi
exec timeout 470 "$PY" -m hbench.kernel_check "$OUT" "$@" 2>&1 | tee -a "$OUT/kernel_check.out"
