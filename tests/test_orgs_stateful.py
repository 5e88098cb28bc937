"""Property-based stateful tests: random serving histories against every organization.

A hypothesis state machine plays requests that arrive with shared or private
prefixes, allocate in chunks, commit, decode, finish, get preempted, resume,
get cancelled and retain checkpoints, on pools small enough that eviction,
invalidation and allocation failure happen all the time. After every step
`check_invariants()` runs (capacity conserved, page refcounts = entry
references, holds = pinned/retained entries, reverse index inverts the member
map, no entry's storage handed out again) and the machine checks what the
scheduler relies on: asking changes nothing, acting succeeds exactly when
asking said yes, and a lookup hit is backed by valid, unreassigned storage.
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from harness.model_configs import preset
from harness.orgs import build_organization
from harness.orgs.keys import chain_keys, extend_keys, key_at

GEOM = preset("falcon-h1-7b")
POOLS = {"s0": (14,), "s1": (40,), "s2": (40,), "d0": (420, 6)}
PREFIXES = [[1000 * (p + 1) + i for i in range(4000)] for p in range(3)]


def snapshot(org):
    return [(p.available, len(p.empty), len(p.lru), list(p.ref), list(p.hold)) for p in org.pools]


class OrgMachine(RuleBasedStateMachine):
    org_name = "s2"

    @initialize()
    def setup(self):
        self.org = build_organization(self.org_name, GEOM, POOLS[self.org_name])
        self.reqs: dict[int, dict] = {}
        self.next_id = 0

    # ---- helpers --------------------------------------------------------------
    def _step(self, rid: int, chunk: int, headroom: float = 0.0) -> bool:
        r = self.reqs[rid]
        org = self.org
        admitted = org.is_admitted(rid)
        hit = None
        start = r["computed"]
        if not admitted:
            hit = org.lookup(r["keys"], len(r["tokens"]) - 1)
            self._check_hit(r["keys"], hit)
            start = hit.j_adopt
        decode = admitted and start >= len(r["tokens"])
        end = len(r["tokens"]) + 1 if decode else min(start + chunk, r["prefill_until"])
        before = snapshot(org)
        d = org.demand(rid, end, r["prefill_until"], r["keys"], hit)
        can = org.can_allocate(d, headroom)
        assert snapshot(org) == before, "asking changed the organization"
        if not can:
            if headroom == 0.0:
                assert not org.allocate(rid, end, r["prefill_until"], r["keys"], hit)
                assert snapshot(org) == before, "a failed allocate changed the organization"
            return False
        if decode:
            r["tokens"].append(7 + rid * 31 + len(r["tokens"]))
            extend_keys(r["keys"], r["tokens"], r["salt"])
        assert org.allocate(rid, end, r["prefill_until"], r["keys"], hit)
        org.commit(rid, r["keys"], end, r["prefill_until"])
        r["computed"] = end
        r["published"] = [j for j in range(org.grid, min(end, r["prefill_until"]) + 1, org.grid)]
        return True

    def _check_hit(self, keys, hit):
        org = self.org
        assert hit.j_adopt <= hit.attn_depth and hit.j_adopt <= max(hit.r_max, hit.j_adopt)
        if hit.j_adopt:
            e = org.ckpt_map[key_at(keys, hit.j_adopt)]
            assert e.valid
            gens = tuple(org.pools[p].generation[pg] for p, pg in e.pages)
            assert gens == e.generations, "lookup hit a checkpoint whose storage was reassigned"
            for b in range(org.B, hit.j_adopt + 1, org.B):
                assert org.attn_map[key_at(keys, b)].valid

    # ---- rules --------------------------------------------------------------
    @rule(prefix=st.integers(0, 2), plen=st.integers(0, 3600), tail=st.integers(1, 700),
          isolate=st.booleans())
    def arrive(self, prefix, plen, tail, isolate):
        rid = self.next_id
        self.next_id += 1
        tokens = PREFIXES[prefix][:plen] + [50_000 + rid * 1000 + i for i in range(tail)]
        salt = f"iso-{rid}" if isolate else None
        self.reqs[rid] = dict(tokens=tokens, keys=chain_keys(tokens, salt), salt=salt,
                              computed=0, prefill_until=len(tokens), published=[])

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), chunk=st.sampled_from([512, 1024, 1792, 2048, 4096]),
          headroom=st.sampled_from([0.0, 0.0, 0.2]))
    def step(self, data, chunk, headroom):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self._step(rid, chunk, headroom if not self.org.is_admitted(rid) else 0.0)

    @precondition(lambda self: any(self.org.is_admitted(r) for r in self.reqs))
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r in self.reqs if self.org.is_admitted(r))))
        self.org.finish(rid)
        del self.reqs[rid]

    @precondition(lambda self: any(self.org.is_admitted(r) for r in self.reqs))
    @rule(data=st.data())
    def preempt(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r in self.reqs if self.org.is_admitted(r))))
        self.org.preempt(rid)
        r = self.reqs[rid]
        r["computed"] = 0
        r["prefill_until"] = len(r["tokens"])
        pin = self.org.pinned.get(rid)
        assert pin is None or (pin.valid and pin.pins >= 1)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.org.abandon(rid)
        del self.reqs[rid]
        assert rid not in self.org.pinned

    @precondition(lambda self: any(self.org.is_admitted(r) and v["published"]
                                   for r, v in self.reqs.items()))
    @rule(data=st.data())
    def retain(self, data):
        rid = data.draw(st.sampled_from(sorted(
            r for r, v in self.reqs.items() if self.org.is_admitted(r) and v["published"])))
        r = self.reqs[rid]
        j = data.draw(st.sampled_from(r["published"]))
        self.org.retain(rid, j, r["keys"])

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "org"):
            self.org.check_invariants()

    def teardown(self):
        if not hasattr(self, "org"):
            return
        for rid in list(self.reqs):
            self.org.abandon(rid)
        self.org.check_invariants()
        assert self.org.holds_no_references()
        assert not self.org.pinned
        for p in self.org.pools:
            assert all(h == 0 for h in p.hold), "a hold outlived every request"


# HBENCH_STATEFUL_EXAMPLES raises the example count for a deeper local search.
SETTINGS = settings(max_examples=int(os.environ.get("HBENCH_STATEFUL_EXAMPLES", "60")),
                    stateful_step_count=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("org_name", ["s0", "s1", "s2", "d0"])
def test_random_histories_keep_invariants(org_name):
    machine = type(f"Machine_{org_name}", (OrgMachine,), {"org_name": org_name})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()
