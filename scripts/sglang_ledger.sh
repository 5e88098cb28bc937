#!/usr/bin/env bash
# The ledger of SGLang's own memory code against hbench's organizations at the
# same bytes and split: each cell run once on `--engine sglang` (in process,
# SGLang's pools and radix cache; HBENCH_SGLANG_PYTHON,
# scripts/setup_sglang_cpu.sh) and once on `--engine sim`, same organization,
# workload, budget, --d0-attn-fraction and cost model, for D0 (SGLang's dual
# pools against hbench's D0) and u0 (SGLang's unified memory against hbench's
# u0). Writes OUT/{runs/, ledger.csv, ledger.md}; docs/engines.md names the
# rule behind each difference. ORGS="d0" runs D0's cells only.
#
#   HBENCH_SGLANG_PYTHON=$PWD/.venv-sglang/bin/python OUT=results/sglang-ledger \
#       PYTHON=.venv/bin/python bash scripts/sglang_ledger.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/sglang-ledger}"
PY="${PYTHON:-python}"
: "${HBENCH_SGLANG_PYTHON:?set HBENCH_SGLANG_PYTHON (scripts/setup_sglang_cpu.sh)}"
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs"
cells=(
  "study b83 --budget b83 --seed 0"
  "shared b83 --budget b83 --requests 40 --seed 0"
  "shared b16 --budget b16 --requests 40 --seed 0"
  "multiturn b16 --budget b16 --workload-kind multiturn --requests 40 --rate 1 --think-time 2 --seed 1"
)
for org in ${ORGS:-d0 u0}; do
  for cell in "${cells[@]}"; do
    read -r kind label args <<<"$cell"
    for engine in sglang sim; do
      # shellcheck disable=SC2086
      "$PY" -m hbench.cli run --engine "$engine" --org "$org" $args \
          --out "$OUT/runs/$org-$kind-$label" >/dev/null
    done
  done
done
"$PY" - "$OUT" <<'PYEOF'
import csv
import sys
from pathlib import Path

from harness.model_configs import preset
from harness.orgs.keys import KEY_TOKENS
from harness.results import iter_runs

out = Path(sys.argv[1])
keys = ("reused_tokens", "j_adopt_mean", "preemptions", "recomputed_tokens",
        "throughput_ledger_tok_s", "ttft_p50_s", "finished", "failed", "sglang_evictions",
        "sglang_evicted_kv_tokens", "sglang_evicted_mamba_slots", "sglang_tombstoned_nodes",
        "sglang_mamba_slots_in_use_peak", "invalidations_attention", "invalidations_checkpoint",
        "peak_mem_ssm_bytes", "compactions", "donated_attention_pages", "cascaded_checkpoints")
# one side by side for both engines: attention tokens and states evicted, states held at once
both = ("evicted_attention_tokens", "evicted_states", "peak_states")
state_bytes = preset("falcon-h1-7b").model_ssm_state_bytes
rows = []
for cell in sorted(p for p in (out / "runs").iterdir() if p.is_dir()):
    for run in iter_runs(cell):
        s = run.summary
        row = {"cell": cell.name, "engine": run.manifest["engine"]}
        row.update({k: s.get(k, "") for k in keys})
        if row["engine"] == "sglang":
            row.update(evicted_attention_tokens=s["sglang_evicted_kv_tokens"],
                       evicted_states=s["sglang_evicted_mamba_slots"],
                       peak_states=s["sglang_mamba_slots_in_use_peak"])
        else:   # hbench's attention blocks are 16 tokens (D0's, u0's)
            row.update(evicted_attention_tokens=s["invalidations_attention"] * KEY_TOKENS,
                       evicted_states=s["invalidations_checkpoint"],
                       peak_states=s["peak_mem_ssm_bytes"] // state_bytes)
        rows.append(row)
keys = keys + both
with open(out / "ledger.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["cell", "engine", *keys])
    w.writeheader()
    w.writerows(rows)
def fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}" if v == v else "-"
    return "-" if v in ("", None) else str(v)
lines = ["| " + " | ".join(["cell", "engine", *keys]) + " |",
         "|" + "---|" * (len(keys) + 2)]
lines += ["| " + " | ".join(fmt(r[k]) for k in ["cell", "engine", *keys]) + " |" for r in rows]
(out / "ledger.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
