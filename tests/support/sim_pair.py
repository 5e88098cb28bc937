"""The simulator's two paths side by side: every step planned and completed by
the scheduler (`SimEngine(fast=False)`), and stretches of quiet decode steps
(`fast=True`), which must give identical results on any configuration."""

from __future__ import annotations

import dataclasses

import numpy as np

from adapters.sim.engine import SimEngine
from harness.config import ORG_NAMES, RunConfig
from harness.metrics import summarize
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


def run_both(config: RunConfig):
    workload = build_run_workload(config)
    setup = RunSetup.resolve(config)
    slow = SimEngine(fast=False).run(workload, setup)
    fast = SimEngine(fast=True).run(workload, setup)
    return slow, fast


def assert_identical(slow, fast) -> None:
    assert len(slow.requests) == len(fast.requests)
    for a, b in zip(slow.requests, fast.requests, strict=True):
        da, db = dataclasses.asdict(a), dataclasses.asdict(b)
        ta, tb = da.pop("token_times"), db.pop("token_times")
        ia, ib = da.pop("itl"), db.pop("itl")       # the simulator's summed-up token times
        assert da == db, f"request {a.request_id} differs"
        assert np.array_equal(np.asarray(ta), np.asarray(tb)), f"request {a.request_id} times"
        assert (ia is None) == (ib is None), f"request {a.request_id} itl"
        assert ia is None or all(same(x, y) for x, y in zip(ia, ib, strict=True)), \
            f"request {a.request_id} itl"
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
