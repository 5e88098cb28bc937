"""SGLang's own memory code (radix cache, KV and Mamba pools) serving small
workloads on the CPU, sized from an hbench budget.

Skipped unless HBENCH_SGLANG_PYTHON points at the interpreter of the venv
made by scripts/setup_sglang_cpu.sh (.ci/run sets it). One run of
`adapters.sglang_cpu.serve_check` in that venv; every number asserted here
is read from SGLang's objects or counted from what SGLang's calls returned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.budget import parse_budget_bytes
from harness.model_configs import preset
from tests.support import REPO_ROOT
from tests.support.engines import SGLANG_PYTHON, requires_sglang

REPO = REPO_ROOT
PYTHON = SGLANG_PYTHON
pytestmark = requires_sglang("SGLang's memory code")

BUDGET, RATIO = "b16", 0.9


@pytest.fixture(scope="module")
def check() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([PYTHON, "-m", "adapters.sglang_cpu.serve_check", "--budget", BUDGET,
                           "--ratio", str(RATIO)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
    assert done.returncode == 0
    return json.loads(done.stdout[done.stdout.index("{"):])


def test_budget_reaches_sglang_pool_sizes(check):
    geom = preset("falcon-h1-7b")
    budget_bytes, _ = parse_budget_bytes(BUDGET, geom, "d0")
    assert check["budget_bytes_per_pool_layer"] == budget_bytes
    pools = check["sglang_pools"]
    # SGLang's objects hold what its ratio rule gives from the budget's bytes
    slot = geom.slot_checkpoint_bytes
    mamba_bytes = budget_bytes * RATIO / (1 + RATIO)
    assert pools["mamba_slots"] == int((mamba_bytes - slot) // slot) == check["split"]["mamba_slots"]
    assert pools["mamba_pool_bytes"] == (pools["mamba_slots"] + 1) * slot   # + SGLang's padding slot
    assert pools["kv_tokens"] == check["split"]["kv_tokens"]
    assert pools["kv_pool_bytes"] == (pools["kv_tokens"] + 1) * geom.slot_attn_bytes_per_token
    assert pools["mamba_pool_bytes"] + pools["kv_pool_bytes"] <= budget_bytes
    assert budget_bytes - pools["mamba_pool_bytes"] - pools["kv_pool_bytes"] < slot


def test_shared_prefix_is_truncated_to_a_mamba_state(check):
    """Requests share a 2,000-token prefix, but no node there holds a Mamba state:
    SGLang's match walks the KV and then truncates to the deepest state."""
    shared = check["shared_prefix"]
    assert shared["requests"] == 6
    assert shared["matched_tokens"] == 0
    assert shared["truncated_tokens"] == 5 * 2000


def test_multi_turn_reuses_and_evicts(check):
    turns = check["multi_turn"]
    assert turns["requests"] == 16
    assert turns["matched_tokens"] > 0 and turns["requests_matched"] > 0
    assert turns["evictions"] > 0
    assert turns["evicted_kv_tokens"] > 0 and turns["evicted_mamba_slots"] > 0
    assert turns["mamba_slots_in_use_peak"] <= turns["mamba_slots"]


def served_in_process(out: Path, org: str) -> Path:
    """The run directory of `hbench run --engine sglang --org ORG` in process:
    a multi-turn workload of 20 sessions at b16."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "hbench.cli", "run", "--engine", "sglang",
                           "--org", org, "--budget", "b16", "--workload-kind", "multiturn",
                           "--requests", "20", "--rate", "1", "--think-time", "2", "--seed", "1",
                           "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def test_hbench_run_in_process_reuses_evicts_and_records_sglang_pools(tmp_path):
    """`hbench run --engine sglang` without a server: SGLang's tree and pools
    serve a multi-turn workload; the results directory is complete and holds
    SGLang's counters and its pool sizes, read from its objects."""
    from harness.results import read_run

    run_dir = served_in_process(tmp_path, "d0")
    run = read_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reused_tokens"] > 0 and summary["j_adopt_mean"] > 0
    assert summary["sglang_evictions"] > 0 and summary["sglang_evicted_kv_tokens"] > 0
    geom = preset("falcon-h1-7b")
    budget_bytes, _ = parse_budget_bytes("b16", geom, "d0")
    sglang = json.loads((run_dir / "manifest.json").read_text())["engine_info"]["sglang"]
    assert sglang["budget_bytes_per_pool_layer"] == budget_bytes
    assert sglang["mamba_full_memory_ratio"] == 1.0          # D0's f = 0.5
    assert sglang["mamba_slots"] == summary["sglang_mamba_slots"]
    assert sglang["mamba_pool_bytes"] + sglang["kv_pool_bytes"] <= budget_bytes
    assert run is not None


def test_unified_memory_from_the_same_budget_reuses_and_evicts():
    """SGLang's unified memory (--enable-unified-memory): one buffer of the same
    split's bytes, KV and Mamba sides floating, serving the same workloads."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([PYTHON, "-m", "adapters.sglang_cpu.serve_check", "--budget", BUDGET,
                           "--ratio", str(RATIO), "--unified"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout[done.stdout.index("{"):])
    geom = preset("falcon-h1-7b")
    budget_bytes, _ = parse_budget_bytes(BUDGET, geom, "d0")
    pools, split = out["sglang_pools"], out["split"]
    # SGLang's one buffer: the split's KV tokens and Mamba slots, in the budget
    assert pools["unified_bytes"] == (split["kv_tokens"] * geom.slot_attn_bytes_per_token
                                      + split["mamba_slots"] * geom.slot_checkpoint_bytes)
    assert pools["unified_bytes"] <= budget_bytes
    # either side alone may take more than its split share of the region
    assert pools["kv_free_tokens"] > split["kv_tokens"]
    assert pools["mamba_slots"] > split["mamba_slots"]
    turns = out["multi_turn"]
    assert turns["matched_tokens"] > 0 and turns["evictions"] > 0


def test_hbench_run_in_process_with_unified_memory_serves_every_request(tmp_path):
    """`hbench run --engine sglang --org u0`: SGLang's unified memory from the
    same budget serves a multi-turn workload to the end (none refused for want
    of a state's bytes), reuses and evicts, and its Mamba side holds more
    states at once than the dual pools' split gives it."""
    run_dir = served_in_process(tmp_path, "u0")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] == 0 and summary["finished"] > 20        # every turn of 20 sessions
    assert summary["reused_tokens"] > 0 and summary["sglang_evictions"] > 0
    sglang = json.loads((run_dir / "manifest.json").read_text())["engine_info"]["sglang"]
    geom = preset("falcon-h1-7b")
    budget_bytes, _ = parse_budget_bytes("b16", geom, "u0")
    assert sglang["memory"] == "unified"
    assert sglang["budget_bytes_per_pool_layer"] == budget_bytes
    assert sglang["unified_bytes"] <= budget_bytes
    slot = geom.slot_checkpoint_bytes     # SGLang's ratio rule at ratio 1.0 (D0's f = 0.5)
    dual_pool_slots = int((budget_bytes / 2 - slot) // slot)
    assert summary["sglang_mamba_slots_in_use_peak"] > dual_pool_slots


def test_eviction_tombstones_a_parent_state_and_the_count_says_so(check):
    """SGLang's LRU eviction of two Mamba states over A, A+B, A+C: leaf A+B goes
    whole, A keeps its KV (A+C needs it) but loses its state, a tombstone; A+B
    then matches nothing, since no node on its path holds a state."""
    t = check["tombstone"]
    assert t["evicted_mamba_slots"] == 2
    assert t["tombstoned_nodes"] == 1
    assert t["evicted_kv_tokens"] == 100                 # B's tokens; A's stay
    assert t["kv_tokens_left"] == 100 + 50              # A and C
    assert t["rematched_ab"] == 0
