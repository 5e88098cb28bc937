#!/usr/bin/env bash
# Make the result trees a refactor must leave byte-identical: the CI smoke
# sweep (with per-step tables), `hbench reproduce q4 --quick`, Q6-shaped cells
# (D0 and S2 with the headroom at 0 and the study's 0.19), a multi-turn sweep,
# vLLM-paging cells and the two organizations of one region (u0, e0).
#
#   scripts/refactor_check.sh OUT            write OUT/{smoke,q4,q6,multiturn,vllm,region}
#   for t in smoke q4 q6 multiturn vllm region; do
#       python scripts/compare_results.py BEFORE/$t AFTER/$t; done
#
# Run it once on the commit before a refactor and once after, then compare.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
out="${1:?usage: scripts/refactor_check.sh OUT}"
jobs="${JOBS:-2}"
mkdir -p "$out"
sweep() { "$PYTHON" -m hbench.cli sweep --jobs "$jobs" "$@" > /dev/null; }
sweep --org s0,s1,s2,d0 --budget b83 --rate 3 --seeds 1-2 --requests 60 --out "$out/smoke"
"$PYTHON" -m hbench.cli reproduce q4 --quick --jobs "$jobs" --no-figures \
    --out "$out/q4" > /dev/null
sweep --org s2,d0 --budget b63,b83 --headroom 0,0.19 --rate 3 --seeds 1 --requests 60 \
    --out "$out/q6"
sweep --org s0,s2,d0 --budget b83 --workload-kind multiturn --rate 3 --seeds 1 \
    --requests 60 --out "$out/multiturn"
sweep --org s0,s1,s2,d0 --budget b63,b83 --paging vllm --rate 3 --seeds 1 --requests 60 \
    --out "$out/vllm"
sweep --org u0,e0 --budget b63,b83 --paging study,vllm --rate 3 --seeds 1 --requests 60 \
    --out "$out/region"
echo "wrote $out/{smoke,q4,q6,multiturn,vllm,region}"
