#!/usr/bin/env bash
# Make the result trees a refactor must leave byte-identical: the CI smoke
# sweep (with per-step tables) and `hbench reproduce q4 --quick`.
#
#   scripts/refactor_check.sh OUT            write OUT/smoke and OUT/q4
#   python scripts/compare_results.py BEFORE/smoke AFTER/smoke
#   python scripts/compare_results.py BEFORE/q4 AFTER/q4
#
# Run it once on the commit before a refactor and once after, then compare.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
out="${1:?usage: scripts/refactor_check.sh OUT}"
mkdir -p "$out"
"$PYTHON" -m hbench.cli sweep --org s0,s1,s2,d0 --budget b83 --rate 3 --seeds 1-2 \
    --requests 60 --jobs "${JOBS:-2}" --out "$out/smoke" > /dev/null
"$PYTHON" -m hbench.cli reproduce q4 --quick --jobs "${JOBS:-2}" --no-figures \
    --out "$out/q4" > /dev/null
echo "wrote $out/smoke and $out/q4"
