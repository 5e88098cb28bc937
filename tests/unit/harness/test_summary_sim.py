"""Summary metrics of real simulated runs: warm-up, measured period, memory bounds."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from harness.config import RunConfig
from harness.model_configs import geometry_for_run
from harness.results import list_runs, read_run
from hbench.cli import cli


def run_once(tmp_path, *args):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--json", *args])
    assert res.exit_code == 0, res.output
    (path,) = list_runs(tmp_path)
    return read_run(path)


def test_warmup_ledger_and_span_throughput_agree(tmp_path):
    # 30 warm-up requests then 40 measured: both timebases start at the first
    # measured arrival, so they differ only by the completion-poll rounding at the end
    data = run_once(tmp_path, "--org", "s2", "--budget", "b63", "--rate", "3", "--seed", "1",
                    "--requests", "40", "--warmup", "30")
    s = data["summary"]
    assert s["requests"] == 40 and s["finished"] == 40
    assert s["throughput_ledger_tok_s"] == pytest.approx(s["throughput_span_tok_s"], rel=0.05)
    # the step-based summaries cover only steps that start after the first measured arrival
    reqs = data["requests"]
    first = reqs[~reqs.warmup].arrival_s.min()
    steps = data["steps"]
    measured = steps[steps.start_s >= first]
    assert len(measured) < len(steps)
    total = measured[["mem_attention_bytes", "mem_ssm_bytes", "mem_conv_bytes"]].sum(axis=1)
    weights = geometry_for_run(RunConfig()).weights_bytes
    assert s["peak_mem_total_bytes"] == int(total.max()) + weights


@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
def test_peak_memory_never_exceeds_weights_plus_the_budget(tmp_path, org):
    # b63 at 3 req/s keeps the pool full (S1's per-kind peaks alone add up to more
    # than the whole budget here); the true peak is one moment's total
    data = run_once(tmp_path, "--org", org, "--budget", "b63", "--rate", "3", "--seed", "1",
                    "--requests", "30")
    s, budget = data["summary"], data["manifest"]["budget"]
    weights = geometry_for_run(RunConfig(org=org)).weights_bytes
    pool_bytes = sum(p["pages"] * p["page_bytes"] for p in budget["pools"]) * budget["pool_layers"]
    assert pool_bytes <= budget["whole_model_bytes"]
    steps = data["steps"]
    per_step = steps[["mem_attention_bytes", "mem_ssm_bytes", "mem_conv_bytes"]].sum(axis=1)
    assert (per_step <= pool_bytes).all(), per_step.max()
    assert s["peak_mem_total_bytes"] <= weights + budget["whole_model_bytes"]
    assert s["peak_mem_total_bytes"] - weights == per_step.max()
    for kind in ("attention", "ssm", "conv"):
        assert s[f"peak_mem_{kind}_bytes"] <= s["peak_mem_total_bytes"] - weights
