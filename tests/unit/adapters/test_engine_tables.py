"""Every engine hands its requests back as one `RequestTable`: the simulator,
a served engine's client (vLLM's adapter over the scripted server), the torch
engine and, where their venvs are named, vLLM's scheduler and SGLang's
memory code in process. Each gives a row per request in request-id order,
and the summary counts them from the table."""

from __future__ import annotations

import numpy as np
import pytest

from harness.config import RunConfig
from harness.metrics import summarize
from harness.request_table import RequestTable
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload
from tests.support.engines import requires_sglang, requires_vllm

SMALL = {"budget": "b16", "requests": 6, "rate": 3.0, "max_output": 8, "seed": 1}


def assert_one_table(run, workload) -> None:
    table = run.requests
    assert isinstance(table, RequestTable)
    ids = [r.request_id for r in workload.requests]
    assert table.array("request_id").tolist() == sorted(ids)
    assert table.statuses() == ["finished"] * len(ids)
    assert table.array("n_token_times").tolist() == table.array("output_tokens").tolist()
    summary = summarize(run)
    assert summary["requests"] == summary["finished"] == len(ids)
    assert summary["output_tokens"] == int(table.array("output_tokens").sum())


def run_in_process(adapter, **kw):
    config = RunConfig(**{**SMALL, **kw})
    workload = build_run_workload(config)
    return adapter.run(workload, RunSetup.resolve(config)), workload


def test_the_simulator_hands_back_one_table():
    from adapters.sim.engine import SimEngine

    assert_one_table(*run_in_process(SimEngine(), org="s2"))


@pytest.mark.slow
def test_a_served_engine_appends_a_row_per_request_it_sent():
    from tests.support.scripted_server import Script, ScriptedServer
    from tests.support.served import served_setup, vllm_engine, vllm_s0
    from workloads.workload import Workload, WorkloadRequest

    workload = Workload(tuple(WorkloadRequest(i, 0.02 * i, "p", np.arange(3, dtype=np.int64), 4)
                              for i in range(3)))
    with ScriptedServer(Script(first_delay_s=0.01, interval_s=0.005)) as srv:
        run = vllm_engine().run(workload, served_setup(vllm_s0(endpoint=srv.endpoint.url)))
    assert_one_table(run, workload)


@pytest.mark.slow
def test_the_torch_engine_hands_back_one_table(model_dir):
    pytest.importorskip("torch")
    from adapters.torch.engine import TorchEngine

    run, workload = run_in_process(TorchEngine(), engine="torch", org="s0", budget="b12",
                                   model=str(model_dir),
                                   config_path=str(model_dir / "config.json"),
                                   max_model_len=2048, mean_input=300, rate=50.0, max_output=4)
    assert_one_table(run, workload)


@pytest.mark.slow
@requires_vllm("vLLM's scheduler in process")
def test_vllms_scheduler_in_process_hands_back_one_table():
    from adapters.vllm import VllmEngine

    assert_one_table(*run_in_process(VllmEngine(), engine="vllm", org="s0"))


@pytest.mark.slow
@requires_sglang("SGLang's memory code in process")
def test_sglangs_memory_code_in_process_hands_back_one_table():
    from adapters.sglang import SglangEngine

    assert_one_table(*run_in_process(SglangEngine(), engine="sglang", org="d0"))
