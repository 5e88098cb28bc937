"""Token times without 8 bytes a token: exact percentiles from counted values.

A request's token times feed two things: its row of the per-request table
(token count and the mean, p50, p99 and max of its inter-token gaps,
`token_time_stats`) and the summary's ITL percentiles over the gaps of every
finished measured request (`harness.metrics.summarize`). Both are taken as
the request's row goes into its run's `harness.request_table.RequestTable`:
its statistics into the row, its gaps into the table's `GapPool` of
(value, count) pairs, and the token times are not kept. The requests of one
batch decode in the same steps, so their gaps are the same few values, and
the pool holds a small fraction of the bytes.

`percentiles` and `counted_percentiles` give what ``np.percentile``'s
default (linear) method gives, bit for bit (numpy's virtual index and its
``_lerp``), the second from (value, count) pairs without making the sample.
Free of pandas: the engine loop imports it.
"""

from __future__ import annotations

import math

import numpy as np

NAN = float("nan")


def inter_token_gaps_of(times) -> np.ndarray:
    """Gaps between consecutive token times (empty with fewer than two)."""
    return np.diff(np.asarray(times, dtype=float))


def _spots(n: int, qs) -> list[tuple[int, int, float]]:
    """Per q (0..100) of a sample of ``n`` values: the positions of the two
    order statistics ``np.percentile``'s linear method interpolates between
    and its ``gamma``, as numpy computes them (the virtual index ``(n - 1)
    q``; past the end numpy's index -1 stands for n - 1)."""
    spots = []
    for q in qs:
        q = q / 100
        virtual = (n - 1) * q                           # numpy's virtual index for "linear"
        if virtual >= n - 1:
            lo = hi = n - 1
            gamma = virtual + 1                         # numpy's index -1 stands for n - 1
        elif virtual < 0:
            lo = hi = 0
            gamma = virtual
        else:
            lo = math.floor(virtual)
            hi, gamma = lo + 1, virtual - lo
        spots.append((lo, hi, gamma))
    return spots


def _lerp(a: float, b: float, gamma: float) -> float:
    """numpy's ``_lerp``: from the nearer of ``a`` and ``b``."""
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def percentiles(values, qs) -> tuple[float, ...]:
    """The ``qs``-th percentiles of ``values``, each what ``np.percentile``'s
    default (linear) method gives, bit for bit: the same virtual index
    ``(n - 1) q``, the neighbouring order statistics (the last one beyond
    the end) and its interpolation from the nearer one. One partition
    serves every q, and no call costs NumPy's generic quantile machinery
    (~25 us; a run's per-request table asks twice per request). NaN if
    ``values`` is empty; a sample holding NaN goes to ``np.percentile``."""
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n == 0:
        return (NAN,) * len(qs)
    spots = _spots(n, qs)
    part = np.partition(arr, sorted({i for lo, hi, _ in spots for i in (lo, hi)}))
    if math.isnan(part[n - 1]):   # partitioning puts NaNs last
        return tuple(float(np.percentile(arr, q)) for q in qs)
    return tuple(_lerp(float(part[lo]), float(part[hi]), gamma) for lo, hi, gamma in spots)


def counted_percentiles(values, counts, qs) -> tuple[float, ...]:
    """`percentiles` of the sample in which ``values[i]`` occurs ``counts[i]``
    times (``np.repeat(values, counts)``), bit for bit, without making it:
    the same order statistics, read off the cumulative counts of the values
    in order, and the same interpolation. NaN if the sample is empty; one
    holding NaN is made and goes to `percentiles`."""
    values = np.asarray(values, dtype=float)
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if n == 0:
        return (NAN,) * len(qs)
    if np.isnan(values[counts > 0]).any():
        return percentiles(np.repeat(values, counts), qs)
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(counts[order])

    def at(k: int) -> float:     # the k-th smallest (0-based) of the sample
        return float(values[int(np.searchsorted(cum, k, side="right"))])

    return tuple(_lerp(at(lo), at(hi), gamma) for lo, hi, gamma in _spots(n, qs))


class GapPool:
    """Inter-token gaps of many requests as (value, count) pairs: the sample
    the summary's ITL percentiles are over (`counted_percentiles`), without
    8 bytes per token. The simulator's requests decode in shared steps, so
    the gaps of one stretch of time are a few values repeated once per
    request in the batch; gaps are buffered and, every `SEGMENT` of them,
    reduced to their distinct values and counts (one segment each)."""

    SEGMENT = 1 << 22

    def __init__(self):
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._segments: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, gaps: np.ndarray) -> None:
        if gaps.size:
            self._buffer.append(gaps)
            self._buffered += gaps.size
            if self._buffered >= self.SEGMENT:
                self._reduce()

    def add_counted(self, values, counts) -> None:
        """Gaps already counted: ``values[i]`` occurs ``counts[i]`` times."""
        values = np.asarray(values, dtype=np.float64)
        if values.size:
            self._segments.append((values, np.asarray(counts, dtype=np.int64)))

    def _reduce(self) -> None:
        if self._buffer:
            values, counts = np.unique(np.concatenate(self._buffer), return_counts=True)
            self._segments.append((values, counts))
            self._buffer, self._buffered = [], 0

    def counted(self) -> tuple[np.ndarray, np.ndarray]:
        """Every gap added, as (values, counts) arrays (a value may repeat)."""
        self._reduce()
        if not self._segments:
            return np.empty(0), np.empty(0, dtype=np.int64)
        return (np.concatenate([v for v, _ in self._segments]),
                np.concatenate([c for _, c in self._segments]).astype(np.int64))


def token_time_stats(times, gaps: np.ndarray | None = None) -> tuple:
    """A request's token count and the mean, p50, p99 and max of its
    inter-token gaps (NaN without gaps): what its row of the per-request
    table says. ``gaps``: its `inter_token_gaps_of`, where made already."""
    gaps = inter_token_gaps_of(times) if gaps is None else gaps
    if not gaps.size:
        return (len(times), NAN, NAN, NAN, NAN)
    p50, p99 = percentiles(gaps, (50, 99))
    return (len(times), float(gaps.mean()), p50, p99, float(gaps.max()))
