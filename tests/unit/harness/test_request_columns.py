"""Ended requests kept as columns give the same records, summary and table."""

from __future__ import annotations

import math

import numpy as np

from harness.metrics import measured_start, per_request_table, summarize
from harness.records import EngineRun, RequestColumns, last_finish
from harness.token_times import GapPool, drop_token_times
from tests.support.compare import same_bits
from tests.support.records import finished_records


def _runs():
    rng = np.random.default_rng(11)
    records = finished_records(rng)
    records[4].error, records[4].dispatch_s = "boom", 1.25
    records[7].preemptions, records[7].j_adopt, records[7].r_max = 2, 512, 1024
    pool = GapPool()
    for r in records:
        drop_token_times(r, pool)
    cols = RequestColumns()
    for r in reversed(records):          # they end in another order than their ids
        cols.add(r)
    cols.seal()
    as_records = EngineRun(requests=records, steps=[], window_start_s=0.0, window_end_s=30.0,
                           itl_pool=pool)
    as_columns = EngineRun(requests=cols, steps=[], window_start_s=0.0, window_end_s=30.0,
                           itl_pool=pool)
    return records, as_records, as_columns


def test_columns_read_back_as_the_records_in_request_id_order():
    records, _, run = _runs()
    cols = run.requests
    assert len(cols) == len(records)
    assert [r.request_id for r in cols] == sorted(r.request_id for r in records)
    for got, want in zip(cols, records, strict=True):
        for name, value in vars(want).items():
            if name == "token_times":
                assert got.token_times.size == 0
            elif name == "itl":
                assert all(same_bits(a, b) for a, b in zip(got.itl, value, strict=True))
            else:
                assert same_bits(getattr(got, name), value) if isinstance(value, float) \
                    else getattr(got, name) == value, name
    assert cols[-1].request_id == records[-1].request_id


def test_columns_give_the_records_summary_and_table():
    _, as_records, as_columns = _runs()
    a, b = summarize(as_records), summarize(as_columns)
    assert a.keys() == b.keys()
    for k in a:
        assert same_bits(a[k], b[k]) if isinstance(a[k], float) else a[k] == b[k], k
    ta, tb = per_request_table(as_records), per_request_table(as_columns)
    assert ta.schema == tb.schema
    assert ta.equals(tb)
    assert same_bits(measured_start(as_records), measured_start(as_columns))
    assert last_finish(as_records.requests) == last_finish(as_columns.requests)
    assert not math.isnan(a["itl_p50_s"])


def test_counters_not_observed_stay_null_in_columns_summary_and_table():
    """A counter a record says is None (not observed) reads back as None from
    the columns, and both summaries call it null, not 0; a counter some
    requests observed is summed over those."""
    records, _, _ = _runs()
    for r in records:
        r.recomputed_tokens = r.r_max = r.attn_depth = None
    records[8].reused_tokens = None
    cols = RequestColumns()
    for r in records:
        cols.add(r)
    as_records = EngineRun(requests=records, steps=[], window_start_s=0.0, window_end_s=30.0,
                           itl_pool=_runs()[1].itl_pool)
    as_columns = EngineRun(requests=cols.seal(), steps=[], window_start_s=0.0,
                           window_end_s=30.0, itl_pool=as_records.itl_pool)
    got = {r.request_id: r for r in cols}
    assert got[8].reused_tokens is None and got[9].reused_tokens == records[9].reused_tokens
    assert got[7].r_max is None and got[7].preemptions == 2
    a, b = summarize(as_records), summarize(as_columns)
    for k in ("recomputed_tokens", "r_max_mean", "attn_depth_mean"):
        assert math.isnan(a[k]) and math.isnan(b[k]), k
    assert a["preemptions"] == b["preemptions"] == 2
    assert a["reused_tokens"] == b["reused_tokens"] == 0
    assert per_request_table(as_records).equals(per_request_table(as_columns))
    assert per_request_table(as_columns).column("r_max").null_count == len(records)
