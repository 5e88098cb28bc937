"""The request table: built row by row or from whole columns, it reads back
as the records and gives one summary and one per-request table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.metrics import measured_start, summarize
from harness.per_request import per_request_table
from harness.records import NULLABLE_FIELDS, EngineRun
from harness.request_table import FLOAT_FIELDS, INT_FIELDS, ITL_FIELDS, RequestTable
from harness.token_times import inter_token_gaps_of, token_time_stats
from tests.support.compare import same_bits
from tests.support.records import finished_records


def _records(turns: bool = False):
    records = finished_records(np.random.default_rng(11))
    records[4].error, records[4].dispatch_s = "boom", 1.25
    records[7].preemptions, records[7].j_adopt, records[7].r_max = 2, 512, 1024
    records[8].reused_tokens = None
    if turns:                          # ten sessions of three turns
        for r in records:
            r.session, r.turn = r.request_id // 3, r.request_id % 3
            r.reused_tokens = None if r.reused_tokens is None else 40 * r.turn
    return records


def _by_rows(records) -> RequestTable:
    table = RequestTable()
    for r in reversed(records):          # they end in another order than their ids
        table.append(r)
    return table.seal()


def _by_columns(records) -> RequestTable:
    """The table of ``records`` made column by column, from the records
    alone: their fields, their token-time statistics and the gaps of the
    finished measured ones as (value, count) pairs."""
    stats = [token_time_stats(r.token_times) for r in records]
    columns = {f: [getattr(r, f) for r in records]
               for f in (*INT_FIELDS, *FLOAT_FIELDS, "warmup") if f not in ITL_FIELDS}
    columns.update({f: [s[i] for s in stats] for i, f in enumerate(ITL_FIELDS)})
    columns = {f: np.array([np.nan if v is None else v for v in vs]) for f, vs in columns.items()}
    gaps = [inter_token_gaps_of(r.token_times) for r in records
            if r.status == "finished" and not r.warmup]
    values, counts = np.unique(np.concatenate(gaps), return_counts=True)
    return RequestTable.from_columns(columns, statuses=[r.status for r in records],
                                     errors={r.request_id: r.error for r in records},
                                     gaps=(values, counts))


def _run(table: RequestTable) -> EngineRun:
    return EngineRun(requests=table, steps=[], window_start_s=0.0, window_end_s=30.0,
                     engine_info={"grid_tokens": 16})


def test_rows_read_back_as_the_records_in_request_id_order():
    records = _records()
    table = _by_rows(records)
    assert len(table) == len(records)
    assert [r.request_id for r in table] == sorted(r.request_id for r in records)
    for got, want in zip(table, records, strict=True):
        for name, value in vars(want).items():
            if name == "token_times":
                assert got.token_times.size == 0
            else:
                assert same_bits(getattr(got, name), value) if isinstance(value, float) \
                    else getattr(got, name) == value, name
    assert table[-1].request_id == records[-1].request_id
    assert table.array("n_token_times").tolist() == [len(r.token_times) for r in records]


def test_appending_a_row_leaves_the_record_as_it_was():
    record = _records()[10]
    times = record.token_times.copy()
    RequestTable.of([record])
    assert np.array_equal(record.token_times, times)


@pytest.mark.parametrize("turns", [False, True], ids=["single-turn", "multi-turn"])
def test_a_table_built_by_rows_and_by_columns_gives_one_summary_and_table(turns):
    records = _records(turns)
    rows, cols = _run(_by_rows(records)), _run(_by_columns(records))
    a, b = summarize(rows), summarize(cols)
    assert a.keys() == b.keys()
    assert ("history_tokens" in a) == turns
    for k in a:
        assert same_bits(a[k], b[k]) if isinstance(a[k], float) else a[k] == b[k], k
    ta, tb = per_request_table(rows), per_request_table(cols)
    assert ta.schema == tb.schema
    assert ta.equals(tb)
    assert same_bits(measured_start(rows), measured_start(cols))
    assert rows.requests.last_finish() == cols.requests.last_finish() == max(
        r.finish_s for r in records if r.finish_s is not None)
    assert not math.isnan(a["itl_p50_s"])


def test_the_summarys_itl_is_numpys_over_every_gap_of_the_finished_measured_requests():
    records = _records()
    s = summarize(_run(RequestTable.of(records)))
    gaps = np.concatenate([inter_token_gaps_of(r.token_times) for r in records
                           if r.status == "finished" and not r.warmup])
    for q in (50, 90, 99):
        assert same_bits(s[f"itl_p{q}_s"], float(np.percentile(gaps, q))), q


def test_counters_not_observed_stay_null_in_the_rows_summary_and_table():
    """A counter a record says is None (not observed) reads back as None from
    the table, and the summary calls it null, not 0; a counter some requests
    observed is summed over those."""
    records = _records()
    for r in records:
        r.recomputed_tokens = r.r_max = r.attn_depth = None
    table = RequestTable.of(records)
    got = {r.request_id: r for r in table}
    assert got[8].reused_tokens is None and got[9].reused_tokens == records[9].reused_tokens
    assert got[7].r_max is None and got[7].preemptions == 2
    assert all(np.isnan(table.array(f)).all() for f in ("recomputed_tokens", "r_max"))
    s = summarize(_run(table))
    for k in ("recomputed_tokens", "r_max_mean", "attn_depth_mean"):
        assert math.isnan(s[k]), k
    assert s["preemptions"] == 2 and s["reused_tokens"] == 0
    assert per_request_table(_run(table)).column("r_max").null_count == len(records)
    assert set(NULLABLE_FIELDS) <= set(FLOAT_FIELDS)


def test_no_row_after_seal():
    table = RequestTable.of([])
    with pytest.raises(AssertionError, match="no row after seal"):
        table.append(_records()[0])
