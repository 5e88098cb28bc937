"""What a served run reports beside the client's own numbers: TTFT from the
send, the server's latency histograms over the run, and the vLLM plugin's page
peaks (summary keys of served runs only; no vLLM needed).

The histogram quantiles are checked against values worked out by hand from
Prometheus's ``histogram_quantile`` rule (linear inside the bucket holding the
rank, the first bucket from 0, the highest finite bound for the +Inf bucket).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.metrics_scrape import (
    bucket_delta,
    histogram_mean,
    histogram_quantile,
    parse_prometheus,
    plugin_state,
    server_latency,
)
from harness.config import RunConfig
from harness.metrics import SERVED_SUMMARY_KEYS, SUMMARY_KEYS, summarize
from harness.records import EngineRun, RequestRecord
from harness.request_table import RequestTable
from tests.support.scripted_server import Script, ScriptedServer
from tests.support.served import VLLM_CACHE_INFO, served_setup, vllm_engine, vllm_s0
from workloads.workload import Workload, WorkloadRequest

# cumulative counts: 2 at <= 0.1 s, 6 at <= 0.5 s, 8 at <= 1 s, 10 in all
BUCKETS = {0.1: 2.0, 0.5: 6.0, 1.0: 8.0, math.inf: 10.0}


@pytest.mark.parametrize("q, expected", [
    (0.1, 0.05),    # rank 1 in [0, 0.1] holding 2: 0 + 0.1 x 1/2
    (0.5, 0.4),     # rank 5 in (0.1, 0.5] holding ranks 2..6: 0.1 + 0.4 x 3/4
    (0.8, 1.0),     # rank 8 is the last of (0.5, 1]
    (0.99, 1.0),    # rank 9.9 in +Inf: the highest finite bound
])
def test_histogram_quantile_follows_prometheus(q, expected):
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_an_empty_or_incomplete_histogram_has_no_quantile():
    assert math.isnan(histogram_quantile(0.5, {}))
    assert math.isnan(histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}))
    assert math.isnan(histogram_quantile(0.5, {0.1: 3.0}))   # no +Inf bucket: not a histogram


def histogram_text(family: str, buckets: dict[float, float], labels='model_name="m"') -> str:
    lines = [f'{family}_bucket{{{labels},le="{"+Inf" if math.isinf(le) else le}"}} {n}'
             for le, n in buckets.items()]
    return "\n".join(lines) + "\n"


def test_server_latency_counts_only_what_the_run_added():
    before = {0.1: 2.0, 0.5: 2.0, 1.0: 2.0, math.inf: 2.0}   # earlier traffic, all fast
    after = {le: n + BUCKETS[le] for le, n in before.items()}
    assert bucket_delta(before, after) == BUCKETS
    first = parse_prometheus(histogram_text("vllm:time_to_first_token_seconds", before))
    last = parse_prometheus(histogram_text("vllm:time_to_first_token_seconds", after)
                            # a second label set (engine 1) is summed with the first
                            + histogram_text("vllm:e2e_request_latency_seconds", BUCKETS,
                                             'engine="1"'))
    out = server_latency(first, last, "vllm")
    assert out == pytest.approx({"server_ttft_p50_s": 0.4, "server_ttft_p99_s": 1.0,
                                 "server_e2e_p50_s": 0.4, "server_e2e_p99_s": 1.0})
    assert server_latency(None, last, "vllm") == {}


def test_histogram_mean_is_what_the_sum_and_count_added():
    family = "vllm:inter_token_latency_seconds"

    def scrape(total, count):
        return parse_prometheus("".join(
            f'{family}_{k}{{engine="{e}"}} {v / 2}\n'        # two label sets, summed
            for e in (0, 1) for k, v in (("sum", total), ("count", count))))

    assert histogram_mean(scrape(3.0, 100), scrape(3.5, 110), family) == pytest.approx(0.05)
    assert histogram_mean(scrape(3.0, 100), scrape(3.0, 100), family) is None   # nothing observed
    assert histogram_mean(None, scrape(3.0, 100), family) is None


def test_plugin_page_peaks_become_counters():
    counters, _ = plugin_state([], {"org": "s2", "slab_slots": 16},
                               {"org": "s2", "invalidations_member": 1, "invalidations_carrier": 0,
                                "member_pages_peak": 12, "slab_pages_peak": 2}, 2)
    assert counters == {"invalidations_checkpoint": 1, "member_pages_peak": 12,
                        "slab_pages_peak": 2}


def record(i, arrival, dispatch, first):
    return RequestRecord(request_id=i, arrival_s=arrival, prompt_tokens=8, target_output_tokens=2,
                         dispatch_s=dispatch, first_token_s=first, finish_s=first + 0.1,
                         token_times=[first, first + 0.1], output_tokens=2)


def test_served_summary_keeps_ttft_from_arrival_and_from_send():
    reqs = [record(0, 0.0, 0.5, 1.0), record(1, 1.0, 1.0, 1.25), record(2, 2.0, 2.25, 2.5)]
    run = EngineRun(requests=RequestTable.of(reqs), steps=[], window_start_s=0.0, window_end_s=3.0,
                    engine_info={"launched": False},
                    counters={"server_ttft_p50_s": 0.2, "member_pages_peak": 7})
    s = summarize(run)
    assert list(s)[:len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert set(SERVED_SUMMARY_KEYS) <= set(s)
    assert s["ttft_p50_s"] == pytest.approx(0.5)         # 1.0, 0.25, 0.5 from the arrival
    assert s["ttft_send_p50_s"] == pytest.approx(0.25)   # 0.5, 0.25, 0.25 from the send
    assert s["server_ttft_p50_s"] == 0.2 and s["member_pages_peak"] == 7
    assert math.isnan(s["server_itl_p99_s"]) and math.isnan(s["slab_pages_peak"])


def test_a_simulated_run_has_no_served_keys():
    run = EngineRun(requests=RequestTable.of([record(0, 0.0, None, 1.0)]), steps=[], window_start_s=0.0,
                    window_end_s=2.0, engine_info={})
    assert not set(SERVED_SUMMARY_KEYS) & set(summarize(run))


@pytest.mark.slow
def test_a_run_against_a_server_reads_its_histograms():
    """First scrape: the histogram is empty; every later one holds BUCKETS."""
    family = "vllm:time_to_first_token_seconds"
    empty = histogram_text(family, dict.fromkeys(BUCKETS, 0.0))
    full = histogram_text(family, BUCKETS)
    scrapes = iter([empty + VLLM_CACHE_INFO] + [full + VLLM_CACHE_INFO] * 1000)
    wl = Workload((WorkloadRequest(0, 0.0, "p", np.arange(3, dtype=np.int64), 4),))
    with ScriptedServer(Script(first_delay_s=0.05), metrics_text=lambda: next(scrapes)) as srv:
        run = vllm_engine().run(wl, served_setup(vllm_s0(endpoint=srv.endpoint.url)))
    s = summarize(run)
    assert s["server_ttft_p50_s"] == pytest.approx(0.4)
    assert s["server_ttft_p99_s"] == pytest.approx(1.0)
    assert math.isnan(s["server_itl_p50_s"])    # not published by this server: unknown
    assert 0 < s["ttft_send_p50_s"] <= s["ttft_p50_s"]


def test_vllm_runs_say_what_their_organization_is_inside_vllm():
    """S1/S2 through the plugin are the study's allocator policy at vLLM's page
    size: the manifest says so, and every report's answers repeat it."""
    import pandas as pd

    from analysis.headlines import expression_sentences
    from harness.results import org_expression

    eng = vllm_engine()
    infos = {org: eng.requested_info(RunConfig(org=org, engine="vllm", model="/m", launch=True))
             for org in ("s0", "s1", "s2", "d0")}
    assert all("allocator policy at vLLM's page size" in infos[o]["org_expression"]
               for o in ("s1", "s2"))
    assert org_expression({"engine_info": {"requested": infos["s1"]}}) == infos["s1"]["org_expression"]
    assert org_expression({"engine_info": {}}) is None     # the simulator: the study's own
    runs = pd.DataFrame([
        {"engine": "vllm", "org": o, "org_expression": infos[o]["org_expression"]}
        for o in ("s0", "s1", "s1", "s2")] + [{"engine": "sim", "org": "s1", "org_expression": None}])
    sentences = expression_sentences(runs)
    assert len(sentences) == 2                          # S1 and S2 on vllm, once each; no S0, no sim
    assert sentences[0].startswith("S1 on vllm is allocator policy at vLLM's page size")
