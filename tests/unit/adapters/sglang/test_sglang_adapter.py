"""The SGLang adapter against SGLang-format streams and metrics from a local fake server.

No live SGLang server is involved (there is no CPU build here): the fixtures
in tests/fixtures/sglang/ are written from SGLang's documented formats.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from adapters.metrics_scrape import extract, parse_prometheus
from adapters.sglang import SglangEngine, mamba_full_memory_ratio
from common.errors import HbenchError
from harness.config import RunConfig
from harness.request_table import RequestTable
from tests.support import FIXTURES
from tests.support.scripted_server import Script, ScriptedServer
from tests.support.served import served_setup
from workloads.workload import Workload, WorkloadRequest

SGLANG_FIXTURES = FIXTURES / "sglang"




def recorded_script() -> Script:
    lines = [ln for ln in (SGLANG_FIXTURES / "completion_stream.sse").read_text().splitlines() if ln]
    delays = [0.1] + [0.02] * (len(lines) - 1)
    return Script(raw_events=tuple(zip(delays, lines, strict=True)))


class MetricsSequence:
    """First scrape sees metrics_before.txt, every later one metrics_after.txt."""

    def __init__(self):
        self.before = (SGLANG_FIXTURES / "metrics_before.txt").read_text()
        self.after = (SGLANG_FIXTURES / "metrics_after.txt").read_text()
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return self.before if self.calls == 1 else self.after


def workload(n=3) -> Workload:
    return Workload(tuple(
        WorkloadRequest(request_id=i, arrival_s=0.05 * i, prompt_text=f"shared context. q{i}",
                        prompt_token_ids=np.arange(300, dtype=np.int64), output_len=4,
                        prefix_group=0)
        for i in range(n)))


def d0(**kw) -> RunConfig:
    return RunConfig(org="d0", engine="sglang", **kw)


@pytest.mark.slow
def test_sglang_stream_and_metrics_become_an_engine_run():
    with ScriptedServer(recorded_script(), metrics_text=MetricsSequence(),
                        models=("tiny-falcon-h1",)) as srv:
        run = SglangEngine(scrape_interval_s=0.05).run(workload(), served_setup(d0(endpoint=srv.endpoint.url)))
        bodies = list(srv.bodies)
    assert isinstance(run.requests, RequestTable)
    assert [r.status for r in run.requests] == ["finished"] * 3
    assert run.requests.array("n_token_times").tolist() == [4] * 3   # empty-text token counted
    for r in run.requests:
        assert r.output_tokens == 4
        assert r.prompt_tokens == 300 and r.reused_tokens == 256 and r.initial_input_tokens == 44
        assert r.first_token_s - r.dispatch_s >= 0.1 - 0.005   # the recorded first pause
    assert all(b["model"] == "tiny-falcon-h1" and b["return_token_ids"] is True for b in bodies)
    last = run.steps[-1]
    assert last["running"] == 2 and last["waiting"] == 1
    assert last["kv_usage"] == pytest.approx(0.28)
    assert last["cache_hit_rate"] == pytest.approx(0.4266666666666667)
    assert run.counters["prefix_hits"] == 512 and run.counters["prompt_tokens"] == 600
    assert run.engine_info["peak_kv_usage_frac"] == pytest.approx(0.28)
    assert run.peak_memory == {}   # SGLang does not publish its pool size in bytes
    assert run.engine_info["engine"] == "sglang" and run.engine_info["launched"] is False


@pytest.mark.slow
def test_isolate_gives_every_request_its_own_cache_salt():
    with ScriptedServer(recorded_script()) as srv:
        SglangEngine().run(workload(), served_setup(d0(endpoint=srv.endpoint.url, isolate=True, seed=7)))
        salts = sorted(b["cache_salt"] for b in srv.bodies)
    assert salts == ["hbench-7-0", "hbench-7-1", "hbench-7-2"]


def test_sglang_metric_names_map_onto_the_common_columns():
    row = extract(parse_prometheus((SGLANG_FIXTURES / "metrics_after.txt").read_text()), "sglang")
    assert row == {"running": 2.0, "waiting": 1.0, "kv_usage": 0.28,
                   "cache_hit_rate": 0.4266666666666667, "used_tokens": 604.0,
                   "prefix_hits": 1024.0, "prompt_tokens": 1800.0, "generation_tokens": 48.0}


def test_launch_flags_map_the_d0_split_and_the_cap():
    # a model directory hbench knows no geometry for: only the split is passed
    argv = SglangEngine(python=sys.executable).launch_argv(
        d0(model="/models/tiny", cap=12, d0_attn_fraction=0.25, launch=True), 31000)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert argv[argv.index("--port") + 1] == "31000"
    assert argv[argv.index("--model-path") + 1] == "/models/tiny"
    assert argv[argv.index("--mamba-full-memory-ratio") + 1] == "3"
    assert argv[argv.index("--max-running-requests") + 1] == "12"
    assert "--max-total-tokens" not in argv
    assert "--enable-metrics" in argv and "--enable-cache-report" in argv
    assert mamba_full_memory_ratio(0.5) == 1.0


@pytest.mark.parametrize("budget", ["b63", "b83", "b108"])
def test_the_budget_becomes_sglangs_two_pool_limits(budget):
    """Falcon-H1-7B at bN: D0's pools as `hbench budget` resolves them, in
    SGLang's units: attention tokens (16 per block) and whole-state slots."""
    from harness.budget import resolve_budget
    from harness.model_configs import preset
    from harness.orgs import layout_for

    geom = preset("falcon-h1-7b")
    attn, ckpt = resolve_budget(budget, layout_for("d0", geom), geom, 0.5).pools
    argv = SglangEngine(python=sys.executable).launch_argv(
        d0(model="falcon-h1-7b", budget=budget, launch=True), 31000)
    assert argv[argv.index("--max-total-tokens") + 1] == str(16 * attn.pages)
    assert argv[argv.index("--max-mamba-cache-size") + 1] == str(ckpt.pages)
    assert "--mamba-full-memory-ratio" not in argv
    # b83: floor(0.5 x 83 x 1,594,368 / 16,384) = 4,038 blocks, 41 checkpoint units
    if budget == "b83":
        assert (16 * attn.pages, ckpt.pages) == (64_608, 41)


def test_the_version_is_the_serving_interpreters(tmp_path):
    """Asked of the interpreter that serves (its package metadata), not hbench's;
    then the digest of hbench's code that drives it."""
    from adapters.sglang import DIGEST_ROOTS
    from common.code_digest import code_digest

    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'["sglang", "0.5.9"]\'\n')
    fake.chmod(0o755)
    digest = code_digest(DIGEST_ROOTS)
    assert SglangEngine(python=str(fake)).version() == f"sglang-0.5.9-{digest}"
    assert SglangEngine(python=str(tmp_path / "missing")).version() == f"sglang-unknown-{digest}"


def test_an_organization_sglang_cannot_express_names_the_engines_that_can():
    with pytest.raises(HbenchError) as exc:
        SglangEngine().run(workload(), served_setup(RunConfig(org="s0", engine="sglang", endpoint="x:1")))
    msg = str(exc.value)
    assert msg.startswith("organization s0 is not expressible on sglang; engines that can run it: ")
    assert "vllm" in msg.split(": ", 1)[1]


def test_unified_memory_is_refused_against_a_server():
    """u0 is SGLang's unified memory in process; against a server hbench would
    have to launch --enable-unified-memory, which it does not drive."""
    for server in ({"endpoint": "x:1"}, {"launch": True}):
        with pytest.raises(HbenchError, match="^organization u0 runs on sglang in process only"):
            SglangEngine().run(workload(), served_setup(RunConfig(org="u0", engine="sglang",
                                                               **server)))


def test_headroom_is_refused_rather_than_silently_ignored():
    with pytest.raises(HbenchError, match="--headroom 0.1 is not expressible on sglang"):
        SglangEngine().run(workload(), served_setup(d0(endpoint="x:1", headroom=0.1)))


def test_no_endpoint_and_no_launch_runs_in_process_and_needs_its_venv(monkeypatch):
    """Without a server, SGLang's memory code runs in process (adapters/sglang_cpu),
    which needs the SGLang venv's interpreter: a one-line error without it."""
    monkeypatch.delenv("HBENCH_SGLANG_PYTHON", raising=False)
    with pytest.raises(HbenchError, match="^--engine sglang without --endpoint or --launch runs "
                                          "SGLang's memory code in process and needs "
                                          "HBENCH_SGLANG_PYTHON"):
        SglangEngine().run(workload(), served_setup(d0()))


def test_missing_server_executable_is_a_one_line_error():
    with pytest.raises(HbenchError, match="^server executable 'no-such-sglang' not found$"):
        SglangEngine().run(workload(), served_setup(d0(launch=True, model="m",
                                          server_cmd="no-such-sglang --port {port}")))
