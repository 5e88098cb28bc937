#!/usr/bin/env bash
# CI smoke test: run a small deterministic sweep and compare it with the
# committed baseline (results/baselines/smoke) using `hbench regress`.
#
#   scripts/ci_smoke.sh                    compare; exit status is regress's
#                                          (0 ok, 1 regression, 2 bad input)
#   scripts/ci_smoke.sh --update-baseline  rewrite the baseline from this code
#
# The grid (4 organizations x b83 x 2 seeds x 60 requests, simulator) is small
# enough for every push; the simulator is deterministic, so an unchanged
# engine reproduces the baseline exactly and any change is a real one. The
# baseline keeps manifest.json, summary.json and requests.parquet per run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python}"
BASELINE=results/baselines/smoke
GRID=(--org s0,s1,s2,d0 --budget b83 --rate 3 --seeds 1-2 --requests 60)
JOBS="${JOBS:-2}"

if [[ "${1:-}" == "--update-baseline" ]]; then
    rm -rf "$BASELINE"
    "$PYTHON" -m hbench.cli sweep "${GRID[@]}" --jobs "$JOBS" --out "$BASELINE"
    # regress reads only manifest.json and summary.json; the per-step tables
    # (~130 KB a run) stay out of the repository, the per-request ones stay in.
    # drop_files also moves them from the manifest's checksums to its
    # "dropped_files", so readers do not take their absence for damage.
    "$PYTHON" -c 'import sys
from harness.results import drop_files, list_runs
for run in list_runs(sys.argv[1]):
    drop_files(run, ["steps.parquet"])' "$BASELINE"
    du -sh "$BASELINE"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m hbench.cli sweep "${GRID[@]}" --jobs "$JOBS" --out "$tmp/candidate"
rc=0
"$PYTHON" -m hbench.cli regress --baseline "$BASELINE" --candidate "$tmp/candidate" \
    --report "$tmp/report.md" || rc=$?
exit "$rc"
