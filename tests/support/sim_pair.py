"""The simulator's two paths side by side: every step planned and completed by
the scheduler (`SimEngine(fast=False)`), and stretches of quiet decode steps
(`fast=True`), which must give identical results on any configuration."""

from __future__ import annotations

import numpy as np

from adapters.sim.engine import SimEngine
from harness.config import ORG_NAMES, RunConfig
from harness.metrics import summarize
from harness.request_table import FLOAT_FIELDS, INT_FIELDS
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload
from tests.support.compare import same


def random_config(rng: np.random.Generator) -> RunConfig:
    """A small configuration drawn over organizations, budgets, rates, q, headroom,
    retention, SHARE/ISOLATE, caps, token budgets and seeds (runs in seconds)."""
    return RunConfig(
        org=str(rng.choice(ORG_NAMES)),
        budget=str(rng.choice(["b40", "b63", "b83", "b108"])),
        rate=float(rng.choice([0.8, 3.0, 4.5, 20.0])),
        q=float(rng.choice([0.0, 0.5, 1.0])),
        headroom=float(rng.choice([0.0, 0.1, 0.19, 0.35])),
        retention=bool(rng.integers(2)),
        isolate=bool(rng.integers(2)),
        cap=int(rng.choice([4, 16, 63])),
        token_budget=int(rng.choice([2048, 8192])),
        requests=int(rng.integers(8, 25)),
        mean_input=int(rng.choice([600, 1500, 3332])),
        max_output=int(rng.choice([64, 300, 1024])),
        warmup_requests=int(rng.integers(0, 3)),
        seed=int(rng.integers(0, 10_000)),
    )


def _gap_sample(table) -> list[tuple[float, int]]:
    """The table's ITL sample as (value, count) pairs, each value once, in order."""
    values, counts = table.itl_gaps()
    sample: dict[float, int] = {}
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        sample[v] = sample.get(v, 0) + c
    return sorted(sample.items())


def run_both(config: RunConfig):
    workload = build_run_workload(config)
    setup = RunSetup.resolve(config)
    slow = SimEngine(fast=False).run(workload, setup)
    fast = SimEngine(fast=True).run(workload, setup)
    return slow, fast


def assert_identical(slow, fast) -> None:
    a, b = slow.requests, fast.requests
    assert len(a) == len(b)
    for name in (*INT_FIELDS, *FLOAT_FIELDS, "status", "warmup"):
        x, y = a.array(name), b.array(name)
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f"requests' {name} differ"
    assert a.errors() == b.errors()
    assert _gap_sample(a) == _gap_sample(b), "the ITL samples differ"
    assert len(slow.steps) == len(fast.steps)
    for i, (ra, rb) in enumerate(zip(slow.steps, fast.steps, strict=True)):
        assert list(ra) == list(rb), f"step {i}: columns differ"
        bad = [k for k in ra if not same(ra[k], rb[k])]
        assert not bad, f"step {i}: {bad}"
    assert (slow.window_start_s, slow.window_end_s) == (fast.window_start_s, fast.window_end_s)
    assert slow.counters == fast.counters
    assert slow.peak_memory == fast.peak_memory
    assert slow.engine_info == fast.engine_info
    sa, sb = summarize(slow), summarize(fast)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert same(sa[k], sb[k]), k
