"""Percentiles from a sample or from counted values are numpy's, bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.token_times import GapPool, counted_percentiles, percentiles
from tests.support.compare import same_bits

QS = (0, 1, 10, 25, 50, 90, 99, 99.9, 100)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


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
        assert same_bits(g, float(np.percentile(sample, q))), (q, g, np.percentile(sample, q))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=60))
def test_percentiles_are_numpys(values):
    for q, g in zip(QS, percentiles(values, QS), strict=True):
        assert same_bits(g, float(np.percentile(np.asarray(values), q)))


def test_counted_percentiles_with_nan_are_those_of_the_made_sample():
    values, counts = [1.0, np.nan, 2.0, 0.5], [2, 1, 3, 1]
    got = counted_percentiles(values, counts, (10, 50))
    made = percentiles(np.repeat(values, counts), (10, 50))
    assert all(same_bits(g, m) for g, m in zip(got, made, strict=True))


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
