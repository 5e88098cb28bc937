#!/usr/bin/env bash
# The torch engine's GPU checks: parity with transformers and continuation ==
# recomputation on the device (float32, tiny model), then one short serving run
# per organization with Falcon-H1-7B's full geometry (44 layers, random bf16
# weights, b83). Writes device_check.md / .json (and the tiny model) to $OUT.
#
#   OUT=./device-out bash scripts/device_check.sh               # NVIDIA GPU
#   DEVICE=cpu SMALL=1 OUT=/tmp/dc bash scripts/device_check.sh   # tiny model on CPU
#   HBENCH_WORKLOAD_CACHE=DIR PREPARE=1 bash scripts/device_check.sh # build its workloads
#       here, for a GPU machine without the ShareGPT package (then set the same
#       variable there)
#
# Needs python3 with torch, transformers and safetensors; no network. Never
# run by CI. Exit 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-./device-out}" DEVICE="${DEVICE:-cuda}" SMALL="${SMALL:-0}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
exec timeout 570 "$PY" -m hbench.device_check
