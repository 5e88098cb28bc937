#!/usr/bin/env bash
# Run the float-comparing tests (the torch model, its attention and state
# kernels, the statistics and the simulator's cost arithmetic) once per CPU
# kernel path, so a tolerance that only held on this CPU's kernels fails here
# and not on a newcomer's machine (tests/support/floats.py says why each
# tolerance is a rounding bound).
#
# Each path forces every library's code path down from what this CPU offers:
#   native    what the libraries pick here
#   avx2      a CPU without AVX-512: torch's ATen kernels, oneDNN, MKL and
#             numpy's dispatch all capped at AVX2
#   baseline  no vector extensions past numpy's baseline: ATen's default
#             (scalar) kernels, oneDNN at SSE4.1, MKL at SSE4.2
#   threads2  native kernels on two torch threads (another summation split)
# A path the CPU cannot take (numpy refuses to disable its own baseline) is
# only capped lower; the forced settings are printed with each result.
#
# Usage: scripts/kernel_paths.sh [PATH ...]   (default: all four)
#        PYTHON=.venv/bin/python scripts/kernel_paths.sh avx2
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
TESTS=(tests/unit/adapters/torch tests/unit/analysis/test_analysis_stats.py
       tests/unit/adapters/sim/test_sim_cost.py tests/unit/adapters/sim/test_sim_moves.py
       tests/unit/adapters/calibration)

settings() {
    case "$1" in
        native)   echo "" ;;
        avx2)     echo "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 NPY_DISABLE_CPU_FEATURES=$(npy_above X86_V3)" ;;
        baseline) echo "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 NPY_DISABLE_CPU_FEATURES=$(npy_above X86_V2)" ;;
        threads2) echo "HBENCH_TEST_TORCH_THREADS=2" ;;
        *) echo "unknown kernel path '$1' (native, avx2, baseline, threads2)" >&2; return 2 ;;
    esac
}

# numpy's dispatched features above a level, comma-free for the environment
npy_above() {
    "$PYTHON" - "$1" <<'EOF'
import sys
import numpy as np
from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_baseline__
keep = {"X86_V2": [], "X86_V3": ["X86_V3"]}[sys.argv[1]]
print(",".join(f for f in __cpu_dispatch__ if f not in keep and f not in __cpu_baseline__))
EOF
}

paths=("$@")
[[ ${#paths[@]} -eq 0 ]] && paths=(native avx2 baseline threads2)
status=0
for p in "${paths[@]}"; do
    env_line=$(settings "$p")
    start=$(date +%s)
    # shellcheck disable=SC2086
    if env $env_line "$PYTHON" -m pytest -p no:cacheprovider "${TESTS[@]}" > "/tmp/kernel-path-$p.log" 2>&1; then
        result=passed
    else
        result=FAILED; status=1
    fi
    cap=$(env $env_line "$PYTHON" -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
    summary=$(grep -E "(passed|failed|error)" "/tmp/kernel-path-$p.log" | tail -1)
    echo "$p: $result ($summary; torch kernels $cap; $(( $(date +%s) - start )) s) ${env_line:-(no settings)}"
done
exit "$status"
