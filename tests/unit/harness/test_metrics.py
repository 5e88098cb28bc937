"""Summary and per-request metrics on tiny hand-built runs with hand-computed answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from harness.attribution import SUMMARY_KEYS as ATTRIBUTION_KEYS
from harness.metrics import SUMMARY_KEYS, percentile, percentiles, summarize, weighted_median
from harness.per_request import REQUEST_COLUMNS, TURN_COLUMNS, per_request_table, request_columns
from harness.records import CANCELLED, FAILED, EngineRun, RequestRecord
from harness.request_table import RequestTable
from tests.support.compare import same


def make_request(rid, arrival, token_times=(), **kw):
    times = list(token_times)
    defaults = dict(
        prompt_tokens=32,
        target_output_tokens=max(len(times), 1),
        token_times=times,
        output_tokens=len(times),
        first_token_s=times[0] if times else None,
        finish_s=times[-1] if times else None,
    )
    defaults.update(kw)
    return RequestRecord(request_id=rid, arrival_s=arrival, **defaults)


def warmup_request():
    # Extreme values everywhere: any leak into a metric changes it visibly.
    return make_request(
        99, -5.0, [-4.0, -1.0], warmup=True, dispatch_s=100.0, preemptions=7,
        reused_tokens=100, initial_input_tokens=100, recomputed_tokens=100,
        j_adopt=1000, r_max=1000, attn_depth=1000,
    )


def make_run(requests, steps=None, **kw):
    fields = dict(
        window_start_s=0.0,
        window_end_s=4.0,
        peak_memory={"attention": 1000, "ssm": 2000, "conv": 300},
        counters={"invalidations_attention": 3, "invalidations_checkpoint": 2,
                  "rounding_waste_bytes": {"attention": 10, "ssm": 5}},
        engine_info={"attn_block_tokens": 16},
    )
    fields.update(kw)
    if steps is None:
        steps = [
            {"waiting": 2, "running": 1, "slab_occupancy": 0.5},
            {"waiting": 0, "running": 3, "slab_occupancy": 0.75},
            {"waiting": 1, "running": 2},
        ]
    return EngineRun(requests=RequestTable.of(requests), steps=steps, **fields)


def three_requests():
    """Three finished requests with explicit token times plus one failure.

    r0: arrival 0.0, tokens 1.0 1.5 2.5 -> ttft 1.0, e2e 2.5, gaps .5 1.0, tpot .75
    r1: arrival 0.5, tokens 1.5 2.0     -> ttft 1.0, e2e 1.5, gap .5,     tpot .5
    r2: arrival 1.0, tokens 3.0         -> ttft 2.0, e2e 2.0, no gap,     no tpot
    r3: arrival 2.0, failed after some cache work, no tokens
    """
    return [
        make_request(0, 0.0, [1.0, 1.5, 2.5], dispatch_s=0.25, preemptions=1,
                     reused_tokens=16, initial_input_tokens=10, recomputed_tokens=8,
                     j_adopt=16, r_max=32, attn_depth=16),
        make_request(1, 0.5, [1.5, 2.0], dispatch_s=0.5, reused_tokens=16,
                     initial_input_tokens=20, j_adopt=16, r_max=16, attn_depth=32),
        make_request(2, 1.0, [3.0], initial_input_tokens=30),
        make_request(3, 2.0, [], status=FAILED, error="boom", preemptions=1,
                     reused_tokens=4, initial_input_tokens=5),
    ]


def test_summary_has_exactly_the_contract_keys():
    summary = summarize(make_run(three_requests()))
    assert tuple(summary) == SUMMARY_KEYS
    assert len(set(SUMMARY_KEYS)) == len(SUMMARY_KEYS) == 50   # 38 + delivered rate, validity, 10 TTFT parts


def test_summary_hand_computed_values():
    s = summarize(make_run(three_requests() + [warmup_request()]), weights_bytes=10_000)
    expected = {
        "output_tokens": 6,
        "throughput_ledger_tok_s": 6 / 4.0,    # window 0..4, first measured arrival 0.0
        "throughput_span_tok_s": 6 / 3.0,      # last completion 3.0 - first arrival 0.0
        # TTFT sorted [1, 1, 2]: p90 at index 1.8 -> 1.8
        "ttft_p50_s": 1.0, "ttft_p90_s": 1.8, "ttft_p99_s": 1.98,
        # pooled gaps sorted [.5, .5, 1.0]
        "itl_p50_s": 0.5, "itl_p90_s": 0.9, "itl_p99_s": 0.99,
        # TPOT sorted [.5, .75]
        "tpot_p50_s": 0.625, "tpot_p90_s": 0.725, "tpot_p99_s": 0.7475,
        # E2E sorted [1.5, 2.0, 2.5]
        "e2e_p50_s": 2.0, "e2e_p90_s": 2.4, "e2e_p99_s": 2.49,
        # no per-step byte columns: per-kind peaks of the run, never summed
        "peak_mem_total_bytes": math.nan,
        "peak_mem_attention_bytes": 1000, "peak_mem_ssm_bytes": 2000, "peak_mem_conv_bytes": 300,
        # no durations: every row weighs the same (waiting [2, 0, 1], running [1, 3, 2])
        "waiting_median": 1.0, "running_median": 2.0,
        # no step counts the invalidations: the counters, 3 blocks x 16 tokens
        "preemptions": 2, "invalidations_attention": 3, "invalidations_checkpoint": 2,
        "invalidated_tokens": 48,
        # rows with a slab occupancy [.5, .75]; no waste columns: the counter's parts summed
        "slab_occupancy_mean": 0.625, "rounding_waste_bytes": 15,
        "initial_input_tokens": 65, "reused_tokens": 36, "recomputed_tokens": 8,
        "j_adopt_mean": 8.0, "r_max_mean": 12.0, "attn_depth_mean": 12.0,
        "finished": 3, "failed": 1, "cancelled": 0, "requests": 4,
        # lags [0.25, 0.0] sorted [0, .25]
        "dispatch_lag_p99_s": 0.2475,
    }
    # validity and TTFT attribution are checked in tests/cli/test_validity.py / tests/unit/analysis/test_attribution.py
    answers = {"delivered_rate_req_s", "validity", *ATTRIBUTION_KEYS}
    assert set(expected) == set(SUMMARY_KEYS) - answers
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, nan_ok=True), key


def test_integer_metrics_are_python_ints():
    s = summarize(make_run(three_requests()))
    for key in ("output_tokens", "preemptions", "finished", "requests", "invalidations_attention",
                "invalidated_tokens", "rounding_waste_bytes"):
        assert type(s[key]) is int, key


def test_warmup_requests_are_excluded_from_every_metric():
    base = summarize(make_run(three_requests()))
    with_warmup = summarize(make_run([warmup_request()] + three_requests()))
    differing = [k for k in SUMMARY_KEYS if not same(base[k], with_warmup[k])]
    assert differing == []


def test_output_tokens_conserve_finished_requests_tokens():
    reqs = three_requests() + [
        make_request(4, 2.5, [3.5, 3.9], status=CANCELLED),  # partial tokens not served
        warmup_request(),
    ]
    s = summarize(make_run(reqs))
    table = per_request_table(make_run(reqs)).to_pandas()
    served = table[(table.status == "finished") & ~table.warmup].output_tokens.sum()
    assert s["output_tokens"] == served == 6
    assert s["cancelled"] == 1 and s["requests"] == 5


def test_no_finished_requests_gives_nan_latencies_and_zero_tokens():
    s = summarize(make_run([make_request(0, 0.0, [], status=FAILED)], steps=[]))
    assert s["output_tokens"] == 0
    assert s["throughput_ledger_tok_s"] == 0.0
    for key in ("throughput_span_tok_s", "ttft_p50_s", "itl_p99_s", "tpot_p90_s", "e2e_p99_s",
                "waiting_median", "running_median", "slab_occupancy_mean", "dispatch_lag_p99_s"):
        assert math.isnan(s[key]), key


def test_empty_window_gives_nan_ledger_throughput():
    s = summarize(make_run(three_requests(), window_start_s=2.0, window_end_s=2.0))
    assert math.isnan(s["throughput_ledger_tok_s"])


def test_missing_memory_kinds_and_missing_counters_are_unknown_not_zero():
    s = summarize(make_run(three_requests(), peak_memory={"attention": 64}, counters={},
                           engine_info={}))
    # one reported kind: its peak is the total; the kinds not reported are null
    assert (s["peak_mem_total_bytes"], s["peak_mem_attention_bytes"]) == (64, 64)
    assert math.isnan(s["peak_mem_ssm_bytes"]) and math.isnan(s["peak_mem_conv_bytes"])
    for key in ("invalidations_attention", "invalidations_checkpoint", "invalidated_tokens",
                "rounding_waste_bytes"):
        assert math.isnan(s[key]), key


def served_requests(cached=(16, 16, 0, None)):
    """`three_requests` as a served engine's client records them
    (`adapters.client.dispatch.request_record`): the server's cached tokens
    (None where it sent no count) and None for what the client cannot see."""
    out = three_requests()
    for r, c in zip(out, cached, strict=True):
        r.reused_tokens = r.j_adopt = c
        r.initial_input_tokens = None if c is None else r.prompt_tokens - c
        r.recomputed_tokens = r.preemptions = r.r_max = r.attn_depth = None
    return out


def test_a_served_run_reports_what_its_server_cannot_show_as_unknown():
    """vLLM's pool mixes kinds (one kv_pool peak) and the client sees J_adopt,
    not the server's deepest checkpoint, attention depth, preemptions or
    recomputed tokens: null, not 0; the reuse it saw is summed over the
    requests whose count the server sent."""
    s = summarize(make_run(served_requests(), peak_memory={"kv_pool": 4096}, counters={},
                           engine_info={"launched": True}))
    assert s["peak_mem_total_bytes"] == 4096
    for key in ("peak_mem_attention_bytes", "peak_mem_ssm_bytes", "peak_mem_conv_bytes",
                "r_max_mean", "attn_depth_mean", "recomputed_tokens", "preemptions"):
        assert math.isnan(s[key]), key
    assert s["j_adopt_mean"] == pytest.approx(32 / 3)
    assert (s["reused_tokens"], s["initial_input_tokens"]) == (32, 3 * 32 - 32)


def test_a_server_that_reports_no_cached_tokens_leaves_reuse_not_observed():
    s = summarize(make_run(served_requests((None,) * 4), counters={},
                           engine_info={"launched": True}))
    for key in ("reused_tokens", "initial_input_tokens", "j_adopt_mean"):
        assert math.isnan(s[key]), key


def test_a_served_runs_table_has_nulls_where_the_simulators_has_counts():
    """requests.parquet: int64 columns, null where the client saw nothing;
    a simulated run's records keep their counts, no null."""
    served = per_request_table(make_run(served_requests(), engine_info={"launched": True}))
    for name in ("recomputed_tokens", "preemptions", "r_max", "attn_depth"):
        assert served.schema.field(name).type == pa.int64(), name
        assert served.column(name).null_count == 4, name
    assert served.column("reused_tokens").to_pylist() == [16, 16, 0, None]
    simulated = per_request_table(make_run(three_requests()))
    for name in ("reused_tokens", "recomputed_tokens", "preemptions", "r_max", "attn_depth"):
        assert simulated.schema.field(name).type == pa.int64(), name
        assert simulated.column(name).null_count == 0, name
    assert simulated.column("r_max").to_pylist()[0] == 32


def test_slab_occupancy_counter_is_used_when_steps_have_no_column():
    run = make_run(three_requests(), steps=[{"waiting": 0, "running": 1}],
                   counters={"slab_occupancy_mean": 0.9})
    assert summarize(run)["slab_occupancy_mean"] == 0.9


def test_weighted_median_is_the_median_of_a_gauge_sampled_at_a_fixed_interval():
    # equal weights: numpy's median (odd and even counts)
    assert weighted_median([3, 1, 2], [1, 1, 1]) == 2
    assert weighted_median([4, 1, 3, 2], [1, 1, 1, 1]) == 2.5
    # value 1 held for 2 s, 3 and 5 for 1 s each: sampled every second the gauge
    # reads [1, 1, 3, 5], whose median is (1 + 3) / 2 = 2
    assert weighted_median([5, 1, 3], [1, 2, 1]) == 2
    # one 0.6 s prefill step at 4 outweighs twenty 20 ms decode steps at 30
    # (0.6 s of 1.0 s): the unweighted median would say 30
    assert weighted_median([4] + [30] * 20, [0.6] + [0.02] * 20) == 4
    # zero-weight rows do not count; nothing left is NaN
    assert weighted_median([7, 1], [0.0, 1.0]) == 1
    assert math.isnan(weighted_median([], []))


def hand_step_table():
    """A warm-up step, then four measured steps (the first measured arrival is 2.0).

    start  dur   wait run  mem attn/ssm/conv   total  waste a/s/c  sum  inval a/c  slab
    0.00   2.00   9    9   9000/9000/900      18900  999/999/999 2997   0/0     .10   warm-up
    2.00   0.60   1    1    100/ 500/ 10        610    5/  1/  0    6   4/1     .50
    2.60   0.02   0    2    400/ 200/ 20        620    2/  2/  2    6   6/1     .70
    2.62   0.02   0    2    300/ 350/  5        655    0/  0/  7    7  10/2     .60
    2.64   0.10   3    1     50/  50/ 50        150    1/  1/  1    3  10/3     .60
    (invalidations are cumulative before each step; the run ends with 12/3)
    """
    table = [
        (0.00, 2.00, 9, 9, (9000, 9000, 900), (999, 999, 999), (0, 0), 0.10),
        (2.00, 0.60, 1, 1, (100, 500, 10), (5, 1, 0), (4, 1), 0.50),
        (2.60, 0.02, 0, 2, (400, 200, 20), (2, 2, 2), (6, 1), 0.70),
        (2.62, 0.02, 0, 2, (300, 350, 5), (0, 0, 7), (10, 2), 0.60),
        (2.64, 0.10, 3, 1, (50, 50, 50), (1, 1, 1), (10, 3), 0.60),
    ]
    rows = []
    for start, dur, wait, run, mem, waste, inval, slab in table:
        row = {"start_s": start, "time_s": start + dur, "duration_s": dur,
               "waiting": wait, "running": run, "slab_occupancy": slab,
               "invalidations_attention": inval[0], "invalidations_checkpoint": inval[1]}
        for kind, b, w in zip(("attention", "ssm", "conv"), mem, waste, strict=True):
            row[f"mem_{kind}_bytes"] = b
            row[f"waste_{kind}_bytes"] = w
        rows.append(row)
    return rows


def hand_run():
    reqs = [
        make_request(0, 0.0, [1.0, 1.9], warmup=True),
        make_request(1, 2.0, [3.0, 4.0]),
        make_request(2, 2.5, [3.5, 5.0]),
    ]
    return make_run(reqs, steps=hand_step_table(), window_start_s=0.0, window_end_s=6.0,
                    peak_memory={"attention": 9000, "ssm": 9000, "conv": 900},
                    counters={"invalidations_attention": 12, "invalidations_checkpoint": 3,
                              "rounding_waste_bytes": {"budget": 100, "pages": 2997}},
                    engine_info={"attn_block_tokens": 16})


def test_ledger_window_starts_at_the_first_measured_arrival():
    s = summarize(hand_run())
    # 4 measured tokens; ledger 2.0 .. 6.0 (not 0.0 .. 6.0); span 2.0 .. 5.0
    assert s["throughput_ledger_tok_s"] == pytest.approx(4 / 4.0)
    assert s["throughput_span_tok_s"] == pytest.approx(4 / 3.0)


def test_queue_medians_are_time_weighted_over_the_measured_steps():
    s = summarize(hand_run())
    # waiting: 1 for 0.6 s, 0 for 0.04 s, 3 for 0.1 s (of 0.74 s): half is 0.37 s,
    # reached inside the value 1 (0.04 < 0.37 <= 0.64). Unweighted over the measured
    # rows it would be median[1, 0, 0, 3] = 0.5.
    assert s["waiting_median"] == 1.0
    # running: 1 for 0.7 s, 2 for 0.04 s -> 1 (unweighted median[1, 2, 2, 1] = 1.5;
    # with the 9-running warm-up step it would be 2)
    assert s["running_median"] == 1.0


def test_idle_time_between_steps_counts_as_an_empty_queue():
    # two 0.1 s steps with 3 running, then 0.4 s idle (nothing waiting or running),
    # then a 0.1 s step with 1 running. A gauge read every 0.1 s over the 0.7 s
    # sees [3, 3, 0, 0, 0, 0, 1]: median 0 (the steps alone, weighted or not,
    # would say 3)
    rows = [{"start_s": 0.0, "duration_s": 0.1, "waiting": 0, "running": 3},
            {"start_s": 0.1, "duration_s": 0.1, "waiting": 0, "running": 3},
            {"start_s": 0.6, "duration_s": 0.1, "waiting": 0, "running": 1}]
    s = summarize(make_run([make_request(0, 0.0, [0.7])], steps=rows))
    assert s["running_median"] == 0.0
    # with a 0.3 s gap the gauge sees [3, 3, 0, 0, 0, 1]: median (0 + 1) / 2
    rows[2]["start_s"] = 0.5
    s = summarize(make_run([make_request(0, 0.0, [0.6])], steps=rows))
    assert s["running_median"] == 0.5


def test_peak_memory_is_the_largest_per_step_total_in_the_measured_period():
    s = summarize(hand_run(), weights_bytes=10_000)
    # per-step totals 610, 620, 655, 150 -> 655 (the per-kind peaks 400 + 500 + 50 =
    # 950 never coexisted; the warm-up step's 18,900 is outside the period)
    assert s["peak_mem_total_bytes"] == 655 + 10_000
    assert (s["peak_mem_attention_bytes"], s["peak_mem_ssm_bytes"],
            s["peak_mem_conv_bytes"]) == (400, 500, 50)


def test_rounding_waste_is_budget_loss_plus_the_largest_per_step_total():
    # budget 100 + max(6, 6, 7, 3); summing per-kind peaks would give 100 + 5 + 2 + 7
    assert summarize(hand_run())["rounding_waste_bytes"] == 107


def test_invalidations_are_per_kind_and_in_tokens_over_the_measured_period():
    s = summarize(hand_run())
    # attention: 12 at the end - 4 before the first measured step = 8 blocks of 16 tokens
    assert s["invalidations_attention"] == 8
    assert s["invalidated_tokens"] == 8 * 16
    # checkpoints: 3 - 1 = 2 (counted by kind only)
    assert s["invalidations_checkpoint"] == 2


def test_slab_occupancy_is_the_mean_over_the_measured_steps():
    assert summarize(hand_run())["slab_occupancy_mean"] == pytest.approx((.5 + .7 + .6 + .6) / 4)


def test_per_request_table_columns_and_derived_values():
    df = per_request_table(make_run(three_requests() + [warmup_request()])).to_pandas()
    assert list(df.columns) == list(REQUEST_COLUMNS)
    assert len(df) == 5
    r0 = df.iloc[0]
    assert r0.ttft_s == 1.0 and r0.e2e_s == 2.5 and r0.tpot_s == 0.75
    assert r0.itl_mean_s == pytest.approx(0.75)
    assert r0.itl_p50_s == pytest.approx(0.75)
    assert r0.itl_p99_s == pytest.approx(0.995)
    assert r0.itl_max_s == 1.0 and r0.n_token_times == 3 and r0.dispatch_s == 0.25
    r2 = df.iloc[2]
    assert math.isnan(r2.tpot_s) and math.isnan(r2.itl_mean_s) and r2.n_token_times == 1
    r3 = df.iloc[3]
    assert r3.status == "failed" and r3.error == "boom"
    assert math.isnan(r3.first_token_s) and math.isnan(r3.ttft_s) and math.isnan(r3.dispatch_s)
    assert df.warmup.tolist() == [False, False, False, False, True]


def _turns():
    return [make_request(0, 0.0, [1.0], session=0, turn=0),
            make_request(1, 2.0, [3.0], session=0, turn=1, error=None)]


@pytest.mark.parametrize("requests, columns", [
    ([], REQUEST_COLUMNS),
    (three_requests() + [warmup_request()], REQUEST_COLUMNS),
    ([make_request(0, 0.0, [1.0], error=None)], REQUEST_COLUMNS),
    (_turns(), {**REQUEST_COLUMNS, **TURN_COLUMNS}),
    (served_requests(), REQUEST_COLUMNS),
], ids=["empty", "records", "no-error-text", "turns", "served"])
def test_per_request_table_is_the_table_pandas_wrote_of_its_frame(requests, columns):
    """requests.parquet used to be written by pandas from a frame of these
    dtypes; built without pandas, the table is the same: the same types
    (text as string, or null when no row has any), a missing time a null."""
    run = make_run(requests, engine_info={"grid_tokens": 16})
    table = per_request_table(run)
    frame = pd.DataFrame(request_columns(run)).astype(columns)
    assert table.schema.names == list(columns)
    assert table.equals(pa.Table.from_pandas(frame, preserve_index=False)
                        .replace_schema_metadata(None))


def test_a_served_runs_preemptions_come_from_the_servers_counter():
    """A served engine's client cannot see preemptions (its records say 0):
    the summary takes the server's counter; an in-process run keeps its
    per-request count."""
    reqs = [make_request(0, 0.0, [1.0, 2.0]), make_request(1, 0.5, [1.5, 2.5])]
    served = make_run(reqs, counters={"preemptions": 3.0},
                      engine_info={"launched": True})
    assert summarize(served)["preemptions"] == 3
    assert summarize(make_run(reqs, counters={"preemptions": 3.0}))["preemptions"] == 0
    reqs[0].preemptions = 2
    assert summarize(make_run(reqs, counters={"preemptions": 5}))["preemptions"] == 2


def test_a_served_stream_whose_tokens_arrive_in_bursts_is_not_valid():
    """Tokens one by one (gaps near TPOT) pass; the same request span with its
    tokens in two bursts (most gaps 10 us) fails the ``stream`` check. The
    simulator's runs carry no such check."""
    steady = [make_request(i, 0.1 * i, [1.0 + 0.1 * i + 0.04 * k for k in range(20)])
              for i in range(3)]
    bursty = [make_request(i, 0.1 * i, [1.0 + 0.1 * i + (0.4 if k >= 10 else 0.0) + 1e-5 * k
                                        for k in range(20)]) for i in range(3)]
    served = {"launched": True}
    ok = summarize(make_run(steady, engine_info=served))["validity"]["checks"]["stream"]
    assert ok["status"] == "pass"
    bad = summarize(make_run(bursty, engine_info=served))["validity"]
    assert bad["checks"]["stream"]["status"] == "fail" and "stream" in bad["reasons"]
    assert "bursts" in bad["checks"]["stream"]["detail"]
    assert "stream" not in summarize(make_run(bursty))["validity"]["checks"]


PERCENTS = (0, 1, 5, 10, 25, 33.3, 50, 66.7, 90, 95, 99, 99.9, 100)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["uniform", "exponential", "ties", "wide", "tiny"])
def test_percentiles_are_numpys_bit_for_bit(kind):
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 4 if kind == "tiny" else 800))
        sample = {"uniform": rng.random, "exponential": lambda k: rng.exponential(0.03, k),
                  "ties": lambda k: np.round(rng.random(k), 1),
                  "wide": lambda k: rng.normal(0, 1e5, k), "tiny": rng.random}[kind](n)
        want = [np.float64(np.percentile(sample, q)).tobytes() for q in PERCENTS]
        assert [np.float64(v).tobytes() for v in percentiles(sample, PERCENTS)] == want, n
        assert np.float64(percentile(list(sample), 99)).tobytes() == want[PERCENTS.index(99)]


def test_percentiles_of_nothing_and_of_nan():
    assert all(math.isnan(v) for v in percentiles([], (50, 99)))
    assert math.isnan(percentile([1.0, float("nan"), 3.0], 50))
    assert percentiles([3.0, 1.0, 2.0], (0, 50, 100)) == (1.0, 2.0, 3.0)
