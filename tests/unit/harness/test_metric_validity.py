"""Validity per metric (harness.validity): which checks spoil which metrics,
and how the commands count runs per metric kind (analysis.run_validity)."""

from __future__ import annotations

import pytest

from analysis.run_validity import of_summaries
from harness import validity as V


def _validity(*failed: str) -> dict:
    checks = {name: {"status": V.PASS, "detail": ""} for name in V.SPOILS}
    for name in failed:
        checks[name] = {"status": V.FAIL, "detail": f"{name} detail"}
    return V.verdict(checks)


@pytest.mark.parametrize(("metric", "kind"), [
    ("throughput_ledger_tok_s", V.RATE), ("throughput_span_tok_s", V.RATE),
    ("delivered_rate_req_s", V.RATE),
    ("ttft_p99_s", V.LATENCY), ("ttft_p50_wait_memory_s", V.LATENCY), ("tpot_p99_s", V.LATENCY),
    ("e2e_p50_s", V.LATENCY), ("later_turn_ttft_p50_s", V.LATENCY), ("waiting_median", V.LATENCY),
    ("server_ttft_p99_s", V.LATENCY), ("goodput", V.LATENCY),
    ("itl_p99_s", V.ITL), ("server_itl_p50_s", V.ITL),
    ("preemptions", V.LEDGER), ("j_adopt_mean", V.LEDGER), ("initial_input_tokens", V.LEDGER),
    ("running_median", V.LEDGER), ("peak_mem_total_bytes", V.LEDGER), ("token_hit_rate", V.LEDGER),
])
def test_each_summary_metric_has_a_kind(metric, kind):
    assert V.metric_kind(metric) == kind


def test_a_growing_queue_spoils_latency_and_keeps_throughput_as_the_service_rate():
    v = _validity("overload")
    assert not v["valid"]
    kinds = v["metrics"]
    assert {k for k in V.METRIC_KINDS if kinds[k]["valid"]} == {V.RATE, V.LEDGER}
    assert kinds[V.LATENCY]["reasons"] == ["overload"] and kinds[V.ITL]["reasons"] == ["overload"]
    assert kinds[V.RATE]["as"].startswith("the sustained service rate")
    summary = {"validity": v}
    assert V.metric_is_valid(summary, "throughput_ledger_tok_s")
    assert not V.metric_is_valid(summary, "ttft_p99_s")
    assert V.describe_validity(summary, detail=False) == (
        "throughput, work and cache counters valid; latency, inter-token latency NOT VALID: overload")
    assert V.valid_as(summary).startswith("valid: throughput as the sustained service rate")


def test_in_a_steady_state_throughput_is_the_delivered_rate():
    kinds = _validity()["metrics"]
    assert all(kinds[k]["valid"] for k in V.METRIC_KINDS)
    assert kinds[V.RATE]["as"].startswith("the delivered rate")
    assert V.valid_as({"validity": _validity()}) == ""


@pytest.mark.parametrize("check", ["arrival_rate", "arrival_process", "dispatch_lag", "failures"])
def test_a_load_not_asked_for_or_failed_requests_spoil_every_metric(check):
    summary = {"validity": _validity(check)}
    assert not any(V.kind_is_valid(summary, k) for k in V.METRIC_KINDS)
    assert V.describe_validity(summary, detail=False) == f"NOT VALID: {check}"
    assert V.valid_as(summary) == ""


def test_a_bursty_stream_spoils_inter_token_latency_only():
    summary = {"validity": _validity("stream")}
    assert not V.metric_is_valid(summary, "itl_p50_s")
    assert V.metric_is_valid(summary, "tpot_p99_s") and V.metric_is_valid(summary, "ttft_p99_s")


def test_runs_written_before_validity_existed_count_as_valid():
    assert V.metric_is_valid({}, "ttft_p99_s")


def test_runs_are_counted_per_kind_of_the_metrics_a_command_tests():
    items = [("a", {"validity": _validity("overload")}), ("b", {"validity": _validity()}),
             ("c", {"validity": _validity("failures")})]
    tput = of_summaries(items, include_invalid=False, metrics=["throughput_ledger_tok_s"])
    assert [(k.kind, k.valid, k.growing, k.checks) for k in tput.kinds] == [(V.RATE, 2, 1, ("failures",))]
    assert tput.invalid == ("c (failures)",)     # a is valid for throughput: not named
    assert tput.sentence("Holm families").startswith(
        "3 runs; throughput valid in 2 of 3 (1 under a growing queue, where throughput is the sustained "
        "service rate) (not: requests failed).")
    both = of_summaries(items, include_invalid=False, metrics=["throughput_ledger_tok_s", "ttft_p99_s"])
    assert both.invalid == ("a (overload)", "c (failures)")
    assert [(k.kind, k.valid) for k in both.kinds] == [(V.RATE, 2), (V.LATENCY, 1)]
    assert both.as_dict()["valid_by_kind"][V.LATENCY] == {
        "valid": 1, "under_growing_queue": 0, "spoiled_by": ["overload", "failures"]}
