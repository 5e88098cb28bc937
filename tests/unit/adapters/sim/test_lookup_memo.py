"""`Organization.lookup` answers a repeated question from its memo only when
nothing it reads changed: at every lookup of small simulated runs (every
organization, shared prefixes, preemptions, retention) the answer equals a
fresh lookup's."""

from __future__ import annotations

import pytest

from adapters.sim.engine import SimEngine
from harness.config import ORG_NAMES, RunConfig
from harness.orgs.base import Organization
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload


@pytest.mark.parametrize("org", ORG_NAMES)
def test_lookup_memo_is_never_stale(org, monkeypatch):
    lookup = Organization.lookup
    answered = {"memo": 0, "all": 0}

    def fields(hit):
        return (hit.j_adopt, hit.r_max, hit.attn_depth, hit.version, hit.adopt_pages,
                hit.adopt_slabs)

    def checked(self, keys, max_tokens):
        memo = self.prefix.memo
        hit = lookup(self, keys, max_tokens)
        answered["all"] += 1
        if memo is not None and self.prefix.memo is memo:   # answered from the memo
            answered["memo"] += 1
        self.prefix.memo = None
        fresh = lookup(self, keys, max_tokens)
        assert fields(fresh) == fields(hit) and fresh is not hit
        return hit

    monkeypatch.setattr(Organization, "lookup", checked)
    config = RunConfig(org=org, budget="b40", rate=20.0, q=0.5, retention=True, requests=40,
                       seed=7)
    run = SimEngine().run(build_run_workload(config), RunSetup.resolve(config))
    assert run.counters["preemptions"] > 0
    assert answered["memo"] > 0
