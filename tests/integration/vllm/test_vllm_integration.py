"""A real vLLM (CPU build) serving a tiny random-weight Falcon-H1.

Skipped unless HBENCH_VLLM_PYTHON points at the interpreter of the venv made
by scripts/setup_vllm_cpu.sh. One server start serves both phases: SHARE
(requests share a long prefix and must hit vLLM's prefix cache) and ISOLATE
(a unique cache salt per request: no hits at all), then the verify check
(greedy outputs with and without prefix reuse agree token for token).

The tiny-model spec tests at the top need no vLLM and always run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from adapters.tiny_model import TinyFalconH1, random_weights
from harness.config import RunConfig
from tests.support.engines import VLLM_PYTHON, requires_vllm, vllm_tiny_model
from tests.support.served import served_setup
from workloads.workload import Workload, WorkloadRequest

OUTPUT_LEN = 8




def test_tiny_falcon_h1_shapes_follow_the_checkpoint_layout():
    spec = TinyFalconH1()
    shapes = spec.param_shapes(vocab_size=2048)
    # z (128) + xBC (128 + 2 x 16) + dt (4 heads) rows in the fused input projection
    assert shapes["model.layers.0.mamba.in_proj.weight"] == (128 + 160 + 4, 128)
    assert shapes["model.layers.1.mamba.conv1d.weight"] == (160, 1, 4)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (64, 128)
    assert len(shapes) == 2 + 2 * 16 + 1
    cfg = spec.hf_config(2048)
    assert cfg["model_type"] == "falcon_h1" and cfg["architectures"] == ["FalconH1ForCausalLM"]
    assert cfg["mamba_d_head"] * cfg["mamba_n_heads"] == cfg["mamba_d_ssm"]


def test_tiny_weights_are_a_pure_function_of_the_seed():
    spec = TinyFalconH1()
    a, b, c = (random_weights(spec, 64, s) for s in (0, 0, 1))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["lm_head.weight"], c["lm_head.weight"])
    assert all(w.dtype == np.float32 for w in a.values())


def test_tiny_model_cli_builds_a_model_or_names_the_missing_package(tmp_path):
    import importlib.util
    import json

    from click.testing import CliRunner

    from hbench.cli import cli

    res = CliRunner().invoke(cli, ["tiny-model", "-o", str(tmp_path / "m"), "--records", "20"])
    missing = [m for m in ("safetensors", "tokenizers") if importlib.util.find_spec(m) is None]
    if missing:
        assert res.exit_code == 2
        assert res.output.startswith(f"Error: hbench tiny-model needs the {missing[0]} package")
    else:
        assert res.exit_code == 0, res.output
        summary = json.loads(res.output)
        cfg = json.loads((tmp_path / "m" / "config.json").read_text())
        assert cfg["vocab_size"] == summary["vocab_size"] and cfg["model_type"] == "falcon_h1"
        assert {p.name for p in (tmp_path / "m").iterdir()} >= {
            "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"}


needs_vllm = requires_vllm("the real-vLLM integration test")


def shared_prefix_workload(prefix: str, n: int, salt_prefix: str | None) -> Workload:
    reqs = tuple(
        WorkloadRequest(
            request_id=i, arrival_s=0.2 * i,
            prompt_text=f"{prefix}\nQuestion {i}: what does item {i * 7 + 3} say about it?",
            prompt_token_ids=np.zeros(1, dtype=np.int64), output_len=OUTPUT_LEN,
            prefix_group=0, salt=None if salt_prefix is None else f"{salt_prefix}-{i}")
        for i in range(n))
    return Workload(reqs)


PRESSURE_PROMPTS, PRESSURE_PROMPT_LEN, PRESSURE_OUTPUT = 6, 1500, 300


@needs_vllm
def test_stock_s0_under_a_budget_that_binds_preempts_on_the_real_server(tmp_path):
    """Stock S0 on CPU with the budget mapped to vLLM's block count.

    The proportional tiny model (Falcon-H1-7B's state proportions): vLLM
    resolves 1664-token blocks (one page holds a Mamba state). b13 becomes
    ``--num-gpu-blocks-override 12`` (13 S0 pages of 400,896 B in blocks of
    425,984 B; 11 usable: vLLM keeps a null block).
    Six 1,500-token prompts (no shared prefix), cap 4: each is admitted with
    one attention block and one Mamba block (the whole prompt fits, so vLLM's
    whole-input admission check passes), and their 300 output tokens cross the
    1664-token block edge, where each needs another attention block and Mamba
    block: 4 x 4 > 11, so running requests are preempted. Runs before the
    module's shared server starts (one server at a time). Asserted from
    vLLM's own /metrics: the block count it resolved, its preemption counter
    and a waiting queue seen while it ran.
    """
    import random
    import threading
    import urllib.request

    from adapters.client.http import Endpoint, http_get, served_models
    from adapters.metrics_scrape import (
        MetricsScraper,
        extract,
        histogram_buckets,
        info_labels,
        parse_prometheus,
    )
    from adapters.server_process import ServerProcess, free_port
    from adapters.vllm import VllmEngine

    model = tmp_path / "prop"
    vllm_tiny_model(model, "--preset", "proportional")
    config = RunConfig(org="s0", engine="vllm", model=str(model),
                       config_path=str(model / "config.json"), budget="b13", cap=4,
                       max_model_len=4096, max_output=PRESSURE_OUTPUT, launch=True)
    engine = VllmEngine(python=VLLM_PYTHON, log_dir=tmp_path)
    engine.check_config(config)
    requested = engine.requested_info(config)
    assert requested["num_blocks"] == 12 and requested["vllm_pool"]["block_tokens"] == 1664
    rng = random.Random(11)
    prompts = [[rng.randrange(10, 2000) for _ in range(PRESSURE_PROMPT_LEN)]
               for _ in range(PRESSURE_PROMPTS)]
    port = free_port()
    with ServerProcess(engine.launch_argv(config, port), Endpoint("127.0.0.1", port),
                       tmp_path / "server.log", env=engine.launch_env(config),
                       ready_timeout_s=600) as server:
        model_id = served_models(server.endpoint)[0]
        scraper = MetricsScraper(server.endpoint, "vllm", 0.25).start(0.0)
        out: dict[int, int] = {}

        def one(i):
            body = json.dumps({"model": model_id, "prompt": prompts[i],
                               "max_tokens": PRESSURE_OUTPUT, "min_tokens": PRESSURE_OUTPUT,
                               "ignore_eos": True, "temperature": 0}).encode()
            req = urllib.request.Request(f"{server.endpoint.url}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=900) as resp:
                out[i] = json.loads(resp.read())["usage"]["completion_tokens"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(PRESSURE_PROMPTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        scraper.stop()
        status, body = http_get(server.endpoint, "/metrics")
        samples = parse_prometheus(body.decode())
    assert status == 200 and out == {i: PRESSURE_OUTPUT for i in range(PRESSURE_PROMPTS)}
    info = info_labels(samples, "vllm")
    assert info["num_gpu_blocks"] == "12" and info["num_gpu_blocks_override"] == "12"
    assert info["block_size"] == "1664"
    assert extract(samples, "vllm")["preemptions"] > 0
    # a waiting queue: six requests at cap 4 leave two waiting for a slot, seconds
    # long. The server's queue-time histogram records it; the gauge, sampled
    # every 0.25 s, may miss it when /metrics answers slowly on a loaded machine.
    queued = histogram_buckets(samples, "vllm:request_queue_time_seconds")
    waited_over_1s = queued[math.inf] - max(n for le, n in queued.items() if le <= 1.0)
    assert waited_over_1s >= 2 or max(r.get("waiting", 0) for r in scraper.rows) > 0, queued


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from adapters.client.http import Endpoint
    from adapters.server_process import ServerProcess, free_port
    from adapters.vllm import VllmEngine

    model = tmp_path_factory.mktemp("tiny")
    vllm_tiny_model(model, "--arch", "falcon_h1")
    # a roomy budget: the tiny model's b83 is 12 blocks of 128 tokens, short of
    # one 2048-token sequence (hbench refuses it before launching)
    config = RunConfig(org="s0", engine="vllm", model=str(model), cap=8, max_model_len=2048,
                       max_output=16, launch=True, budget="1GiB")
    engine = VllmEngine(python=VLLM_PYTHON, log_dir=model)
    port = free_port()
    server = ServerProcess(engine.launch_argv(config, port), Endpoint("127.0.0.1", port),
                           model / "server.log", env=engine.launch_env(config),
                           ready_timeout_s=600)
    with server:
        engine.server = server
        yield engine, server, config


@needs_vllm
def test_share_hits_the_prefix_cache_and_isolate_does_not(served):
    from adapters.tiny_model import sharegpt_texts

    engine, server, config = served
    prefix = max(sharegpt_texts(40), key=len)[:2500]   # several 128-token blocks
    share = engine.run_on(server.endpoint, shared_prefix_workload(prefix, 6, None), config)
    isolate = engine.run_on(server.endpoint, shared_prefix_workload(prefix, 6, "iso"), config)

    for run in (share, isolate):
        assert (run.requests.array("n_token_times") == OUTPUT_LEN).all()
        assert (run.requests.array("itl_mean_s") > 0).all()    # the last token after the first
        for r in run.requests:
            assert r.status == "finished", r.error
            assert r.output_tokens == OUTPUT_LEN
            assert r.finish_s >= r.first_token_s > r.dispatch_s >= 0
            assert r.prompt_tokens > 256
        assert run.engine_info["resolved"]["block_size"] == 128
        assert run.engine_info["resolved"]["mamba_cache_mode"] == "align"
        assert run.steps and "prefix_hits" in run.steps[-1]

    # SHARE: later requests reuse whole 128-token blocks of the common prefix
    assert share.counters["prefix_hits"] > 0
    reused = [r.reused_tokens for r in share.requests[1:]]
    assert min(reused) >= 256 and all(x % 128 == 0 for x in reused)
    # ISOLATE: a unique salt per request defeats every cross-request hit
    assert isolate.counters["prefix_hits"] == 0
    assert [r.reused_tokens for r in isolate.requests] == [0] * 6


@needs_vllm
def test_greedy_output_is_identical_with_and_without_prefix_reuse(served):
    from hbench.verify import default_prompts, verify_endpoint

    engine, server, config = served
    checks = verify_endpoint(server.endpoint, config.model, default_prompts(2), output_len=12)
    for c in checks:
        assert c.hit_cached_tokens >= 128 and c.miss_cached_tokens == 0
        assert c.identical, c.describe()
        assert c.max_logprob_diff < 1e-3


@needs_vllm
def test_hbench_run_against_the_server_writes_the_same_results_as_the_simulator(served, tmp_path):
    """`hbench run --engine vllm --org s0 --endpoint URL` on a ShareGPT workload
    whose requests all share one context: same files and summary keys as a
    simulator run, every request complete, later requests served from cache
    (not necessarily the second: it may arrive before the first one's blocks
    are cached)."""
    from click.testing import CliRunner

    from harness.metrics import SUMMARY_KEYS
    from harness.results import list_runs, read_run
    from hbench.cli import cli

    _, server, config = served
    model = config.model
    res = CliRunner().invoke(cli, [
        "run", "--engine", "vllm", "--org", "s0", "--budget", "b83",
        "--endpoint", server.endpoint.url, "--model", model,
        "--config", str(Path(model) / "config.json"),
        "--requests", "5", "--rate", "2", "--q", "1", "--contexts", "1",
        "--mean-input", "500", "--max-model-len", "1024",
        "--max-output", "16", "--seed", "3", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    (run_dir,) = list_runs(tmp_path)
    data = read_run(run_dir)
    s, m, req = data["summary"], data["manifest"], data["requests"]
    assert set(SUMMARY_KEYS) <= set(s)
    assert s["finished"] == 5 and s["failed"] == 0
    assert (req["output_tokens"] == req["target_output_tokens"]).all()
    assert s["ttft_p50_s"] > 0 and s["itl_p50_s"] > 0 and s["throughput_ledger_tok_s"] > 0
    assert m["engine"] == "vllm" and m["config"]["endpoint"] == server.endpoint.url
    assert m["engine_info"]["resolved"]["block_size"] == 128
    # one shared context: later requests are served from whole cached blocks
    assert req["reused_tokens"].iloc[0] == 0
    assert (req["reused_tokens"] > 0).sum() >= 2 and (req["reused_tokens"] % 128 == 0).all()
    assert s["reused_tokens"] == req["reused_tokens"].sum()


def test_org_that_vllm_cannot_express_is_refused_before_launch():
    from adapters.vllm import VllmEngine
    from common.errors import HbenchError

    with pytest.raises(HbenchError, match=r"^--org s2 on vllm needs vLLM 0.32.0"):
        VllmEngine(python=sys.executable).run(
            None, served_setup(RunConfig(org="s2", engine="vllm", launch=True)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
