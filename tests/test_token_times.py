"""Token times summed up as requests finish give the same numbers as kept ones."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.metrics import per_request_table, summarize
from harness.records import EngineRun, RequestRecord
from harness.token_times import GapPool, counted_percentiles, drop_token_times, percentiles

QS = (0, 1, 10, 25, 50, 90, 99, 99.9, 100)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _same(a: float, b: float) -> bool:
    """Equal bits (a zero's sign aside: which of 0.0 and -0.0 sorts first is not fixed)."""
    return (np.isnan(a) and np.isnan(b)) or (a == b and (a != 0 or b != 0) and
                                             np.float64(a).tobytes() == np.float64(b).tobytes()) \
        or (a == 0 and b == 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(min_value=0, max_value=50)), min_size=1,
                max_size=40),
       st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=5))
def test_counted_percentiles_are_numpys_on_the_repeated_sample(pairs, qs):
    values = np.array([v for v, _ in pairs])
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    sample = np.repeat(values, counts)
    got = counted_percentiles(values, counts, qs)
    if not sample.size:
        assert all(np.isnan(g) for g in got)
        return
    for q, g in zip(qs, got, strict=True):
        assert _same(g, float(np.percentile(sample, q))), (q, g, np.percentile(sample, q))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=60))
def test_percentiles_are_numpys(values):
    for q, g in zip(QS, percentiles(values, QS), strict=True):
        assert _same(g, float(np.percentile(np.asarray(values), q)))


def test_counted_percentiles_with_nan_are_those_of_the_made_sample():
    values, counts = [1.0, np.nan, 2.0, 0.5], [2, 1, 3, 1]
    got = counted_percentiles(values, counts, (10, 50))
    made = percentiles(np.repeat(values, counts), (10, 50))
    assert all(_same(g, m) for g, m in zip(got, made, strict=True))


def test_gap_pool_keeps_every_gap_across_segments(monkeypatch):
    monkeypatch.setattr(GapPool, "SEGMENT", 7)
    rng = np.random.default_rng(3)
    pool, held = GapPool(), []
    for _ in range(20):
        gaps = rng.choice([0.01, 0.02, 0.035], size=int(rng.integers(0, 9)))
        pool.add(gaps)
        held.append(gaps)
    values, counts = pool.counted()
    sample = np.concatenate(held)
    assert counts.sum() == sample.size
    assert np.array_equal(np.sort(np.repeat(values, counts)), np.sort(sample))


def _records(rng) -> list[RequestRecord]:
    out = []
    steps = np.cumsum(rng.uniform(0.01, 0.05, size=400))
    for rid in range(30):
        first = int(rng.integers(0, 300))
        n = int(rng.integers(0, 60))
        times = steps[first:first + n]
        status = "failed" if rid % 11 == 5 else "finished"
        out.append(RequestRecord(
            request_id=rid, arrival_s=float(steps[first] - 0.1), prompt_tokens=100,
            target_output_tokens=n, status=status,
            first_token_s=float(times[0]) if n else None,
            finish_s=float(times[-1]) if n else None, token_times=times, output_tokens=n,
            warmup=rid < 3))
    return out


def test_dropped_token_times_give_the_same_summary_and_table():
    rng = np.random.default_rng(7)
    kept = EngineRun(requests=_records(rng), steps=[], window_start_s=0.0, window_end_s=30.0)
    rng = np.random.default_rng(7)
    records = _records(rng)
    pool = GapPool()
    for r in records:
        if r.status == "finished":     # a failed request keeps its times, as in the engine loop
            drop_token_times(r, pool)
    dropped = EngineRun(requests=records, steps=[], window_start_s=0.0, window_end_s=30.0,
                        itl_pool=pool)
    assert all(r.token_times.size == 0 for r in records if r.status == "finished")
    a, b = summarize(kept), summarize(dropped)
    assert a.keys() == b.keys()
    for k in a:
        if k != "validity":
            assert _same(a[k], b[k]) if isinstance(a[k], float) else a[k] == b[k], k
    assert per_request_table(kept).equals(per_request_table(dropped))
