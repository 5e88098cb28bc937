"""The operation trace: a small busy run records, round-trips through a file,
and replays through all four organizations with their invariants intact."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from benchmarks.org_trace import (
    ALLOCATE,
    COMMIT,
    FINISH,
    LOOKUP,
    OP_NAMES,
    RecordingOrg,
    Trace,
    build_org,
    record_trace,
    replay,
    trace_config,
)
from harness.config import ORG_NAMES
from harness.model_configs import preset
from harness.orgs import build_organization, layout_for
from harness.orgs.keys import chain_keys

REQUESTS = 20


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "retention"])
def trace(request) -> Trace:
    # seed 1: busy enough that both variants preempt under the admission rule
    config = dataclasses.replace(trace_config(REQUESTS, 4.5, org="s0", seed=1),
                                 retention=request.param)
    return record_trace(config)


def test_trace_holds_every_request_once(trace):
    counts = trace.op_counts()
    assert (counts["retain"] > 0) == trace.meta["config"]["retention"]
    assert counts["finish"] == REQUESTS
    assert counts["lookup"] >= REQUESTS
    assert counts["allocate"] >= counts["commit"] > 0
    assert counts["preempt"] > 0          # busy enough that replays exercise preemption
    assert set(np.unique(trace.ops[trace.ops[:, 0] == FINISH, 1])) == set(range(REQUESTS))
    # one key list per request, stored once
    assert len(trace.key_offsets) == REQUESTS + 1


def test_trace_round_trips_through_a_file(trace, tmp_path):
    back = Trace.load(trace.save(tmp_path / "t.npz"))
    assert np.array_equal(back.ops, trace.ops)
    assert np.array_equal(back.key_data, trace.key_data)
    assert back.headrooms == trace.headrooms
    assert back.meta == trace.meta


@pytest.mark.parametrize("org_name", ORG_NAMES)
def test_replay_through_each_org_keeps_invariants(trace, org_name):
    org = build_org(org_name, trace)
    stats = replay(trace, org)
    org.check_invariants()
    assert org.holds_no_references()
    assert stats.ops == len(trace)
    # every first admission is either accepted or refused, never lost
    assert stats.admitted + stats.refused >= REQUESTS


def test_replay_on_the_recording_org_admits_everything_it_did(trace):
    org = build_org("s0", trace)
    stats = replay(trace, org)
    recorded_admissions = int(np.sum((trace.ops[:, 0] == ALLOCATE) & (trace.ops[:, 5] >= 0)))
    assert stats.admitted == recorded_admissions
    assert (stats.refused, stats.forced_preemptions, stats.skipped) == (0, 0, 0)


def test_replay_skips_commits_of_requests_it_did_not_admit():
    """A hand-made trace whose one admission does not fit: nothing is committed."""
    org = build_organization(layout_for("s0", preset("falcon-h1-7b")), (3,))
    keys = chain_keys(list(range(2048)))
    ops = np.array([
        (LOOKUP, -1, 0, 2047, 0, len(keys), 0),
        (ALLOCATE, 7, 0, 2048, 2048, len(keys), 2),   # 4 blocks + checkpoints > 3 pages
        (COMMIT, 7, 0, 2048, 2048, len(keys), 0),
        (FINISH, 7, -1, 0, 0, -1, 0),
    ], dtype=np.int64)
    t = Trace(ops, np.array(keys, dtype=np.int64), np.array([0, len(keys)]), (0.0,),
              {"config": {}})
    stats = replay(t, org)
    assert (stats.admitted, stats.refused, stats.skipped, stats.finish_as_abandon) == (0, 1, 1, 1)
    org.check_invariants()
    assert org.holds_no_references()


def test_replay_preempts_a_request_whose_continuation_does_not_fit():
    org = build_organization(layout_for("s0", preset("falcon-h1-7b")), (3,))
    keys = chain_keys(list(range(1536)))
    n = len(keys)
    ops = np.array([
        (LOOKUP, -1, 0, 1535, 0, n, 0),
        (ALLOCATE, 7, 0, 512, 512, n, 2),       # block + live state + spare: 3 pages
        (COMMIT, 7, 0, 512, 512, n, 0),
        (ALLOCATE, 7, -1, 1536, 512, -1, 2),    # 2 more blocks: only 1 cached page is free
        (COMMIT, 7, 0, 1536, 512, n, 0),
        (FINISH, 7, -1, 0, 0, -1, 0),
    ], dtype=np.int64)
    t = Trace(ops, np.array(keys, dtype=np.int64), np.array([0, n]), (0.0,), {"config": {}})
    stats = replay(t, org)
    assert (stats.admitted, stats.forced_preemptions, stats.skipped) == (1, 1, 1)
    assert stats.finish_as_abandon == 1      # releases the pin the preemption left
    org.check_invariants()
    assert org.holds_no_references() and not org.pinned_checkpoints()


def test_recording_proxy_rejects_a_hit_it_did_not_return():
    org = RecordingOrg(build_organization(layout_for("s2", preset("falcon-h1-7b")), (40,)))
    keys = chain_keys(list(range(64)))
    stale = org.lookup(keys, 63)
    org.lookup(keys, 63)
    with pytest.raises(AssertionError, match="PrefixHit"):
        org.allocate(1, 64, 64, keys, stale)


def test_op_names_cover_every_code():
    assert len(OP_NAMES) == 10 and OP_NAMES[LOOKUP] == "lookup" and OP_NAMES[FINISH] == "finish"
