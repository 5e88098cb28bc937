#!/usr/bin/env bash
# hbench's scheduler against vLLM's own, run in process at the study's scale
# (docs/fidelity.md, "hbench's scheduler against vLLM's"): the study's Q4
# cells (S0, S1, S2, D0 at b63 / b83 / b108), the no-share control Q3 (q = 0,
# b83), Q6's headroom 0.19 (S2, D0), seeds 0 and 1, and Q8's retention (S2
# at 254 pages, its seeds 79010-79012), each served by vLLM's
# scheduler and by the simulator on the same workload, bytes, pages and cost
# model. Keeps each ledger's summary, table and figure (not its runs) in
# OUT/vllm-scheduler-{q4,q3,q6,q8}/.
#
#   OUT=results/fidelity bash scripts/vllm_scheduler_ledger.sh
#
# Needs HBENCH_VLLM_PYTHON (scripts/setup_vllm_cpu.sh). 16 minutes on this
# 2-core machine beside other work (load average 4 to 8).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/fidelity}"
HB=("${PYTHON:-python}" -m hbench.cli fidelity --engine vllm --in-process)
RUNS="${RUNS:-$(mktemp -d)}"
ledger() {
  local name=$1; shift
  "${HB[@]}" "$@" --out "$RUNS/$name" | tee "$RUNS/$name.txt"
  mkdir -p "$OUT/$name"
  cp "$RUNS/$name"/{ledger.csv,fidelity.json,fidelity.png} "$RUNS/$name.txt" "$OUT/$name/"
  mv "$OUT/$name/$name.txt" "$OUT/$name/fidelity.txt"
}
ledger vllm-scheduler-q3 --budget b83 --q 0
ledger vllm-scheduler-q6 --org s2,d0 --headroom 0.19
ledger vllm-scheduler-q4
ledger vllm-scheduler-q8 --org s2 --budget 254p --seeds 79010-79012 --retention
