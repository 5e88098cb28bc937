"""Property-based stateful tests: random serving histories against every organization.

A hypothesis state machine plays requests that arrive with shared or private
prefixes, allocate in chunks, commit, decode, finish, get preempted, resume,
get cancelled and retain checkpoints, on pools small enough that eviction,
invalidation and allocation failure happen all the time. After every step
`check_invariants()` runs (capacity conserved, page refcounts = entry
references, holds = pinned/retained entries, reverse index inverts the member
map, no entry's storage handed out again) and the machine checks, through the
public protocol only, what the scheduler and an engine rely on: asking
changes nothing, acting succeeds exactly when asking said yes, a lookup hit is
backed by storage no running request holds, and placements are sound (no
page or conv slot held by two live objects, only pages the pool counts as
used, S2 slots always real slots, S1 checkpoints of 3 SSM + 1 conv page at
the 7B geometry, a published checkpoint apart from the new live object).

The same machine runs each organization in vLLM's blocks (``paging="vllm"``,
1,664-token blocks), where a block edge's state is published in place: there
the running state at an edge may be the edge's checkpoint (read-only until
the request computes past it, when a copy moves it into a new object), so a
hit or a published checkpoint may share storage with that one live state.
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from harness.model_configs import preset
from harness.orgs import ORGANIZATIONS, build_organization, layout_for
from harness.orgs.keys import chain_keys, extend_keys
from harness.orgs.values import ConvInline, ConvPages, ConvSlot, PageRef

GEOM = preset("falcon-h1-7b")
POOLS = {"s0": (14,), "s1": (40,), "s2": (40,), "d0": (420, 6)}
#: in vLLM's 1,664-token blocks: every object one block, so fewer pages bind
VLLM_POOLS = {"s0": (8,), "s1": (20,), "s2": (18,), "d0": (6, 4)}
PREFIXES = [[1000 * (p + 1) + i for i in range(4000)] for p in range(3)]


CONV_KIND = {"s0": ConvInline, "s1": ConvPages, "s2": ConvSlot, "d0": ConvInline}


def snapshot(org, rids):
    """Everything observable: each page's state, usage, the running requests' placements."""
    pages = tuple(org.page_state(PageRef(i, p)) for i, pool in enumerate(org.capacity().pools)
                  for p in range(pool.pages))
    u = org.usage()
    return (pages, u.pages, u.pages_by_kind, org.version(),
            {rid: (org.block_table(rid), org.live_state(rid)) for rid in rids})


def claims(place):
    """What a checkpoint-sized object holds exclusively: its pages, or for S2
    its SSM pages and its (slab, slot)."""
    out = {("page", place.pool, p) for p in place.exclusive_pages()}
    if isinstance(place.conv, ConvSlot):
        out.add(("slot", place.pool, place.conv.slab, place.conv.slot))
    return out


class OrgMachine(RuleBasedStateMachine):
    org_name = "s2"
    paging = "study"

    @initialize()
    def setup(self):
        pools = (VLLM_POOLS if self.paging == "vllm" else POOLS)[self.org_name]
        self.org = build_organization(layout_for(self.org_name, GEOM, self.paging), pools)
        self.in_place = self.org.layout.publish_in_place
        self.reqs: dict[int, dict] = {}
        self.next_id = 0

    def _edge_state(self, ck) -> bool:
        """In place: ``ck`` is some running request's live state (its edge)."""
        return self.in_place and any(self.org.live_state(rid) == ck for rid in self._admitted())

    # ---- helpers --------------------------------------------------------------
    def _admitted(self):
        return sorted(r for r in self.reqs if self.org.is_admitted(r))

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
        before = snapshot(org, self._admitted())
        d = org.pages_needed(rid, end, r["prefill_until"], r["keys"], hit)
        can = org.can_allocate(d, headroom)
        assert snapshot(org, self._admitted()) == before, "asking changed the organization"
        if not can:
            if headroom == 0.0:
                assert not org.allocate(rid, end, r["prefill_until"], r["keys"], hit)
                assert snapshot(org, self._admitted()) == before, \
                    "a failed allocate changed the organization"
            return False
        if decode:
            r["tokens"].append(7 + rid * 31 + len(r["tokens"]))
            extend_keys(r["keys"], r["tokens"], r["salt"])
        assert org.allocate(rid, end, r["prefill_until"], r["keys"], hit)
        adopted = org.copies()
        if hit is not None and hit.j_adopt:
            assert [(c.reason, c.position) for c in adopted] == [("adopt", hit.j_adopt)]
            assert adopted[0].dst == org.live_state(rid)
            assert not claims(adopted[0].src) & claims(adopted[0].dst)
        elif r.get("on_edge"):      # in place: continuing past the edge it is at copies it
            assert [(c.reason, c.position) for c in adopted] == [("publish", start)]
            assert adopted[0].dst == org.live_state(rid)
            assert not claims(adopted[0].src) & claims(adopted[0].dst)
        else:
            assert adopted == ()
        published = org.commit(rid, r["keys"], end, r["prefill_until"])
        copies = org.copies()
        r["computed"] = end
        if self.in_place:
            assert copies == () and published in ([], [end])
            r["on_edge"] = end % org.grid == 0    # at an edge, published or not
            if published:
                assert org.checkpoint_at(r["keys"], end) == org.live_state(rid)
            r["published"] = list(range(org.grid, end + 1, org.grid))
            return True
        assert [c.position for c in copies] == published
        for c in copies:
            assert c.reason == "publish" and c.src == org.checkpoint_at(r["keys"], c.position)
            assert not claims(c.src) & claims(c.dst), "published checkpoint shares the live pages"
        if copies:
            assert copies[-1].dst == org.live_state(rid)
        r["published"] = [j for j in range(org.grid, min(end, r["prefill_until"]) + 1, org.grid)]
        return True

    def _check_hit(self, keys, hit):
        org = self.org
        assert hit.j_adopt <= hit.attn_depth and hit.j_adopt <= max(hit.r_max, hit.j_adopt)
        if hit.j_adopt:
            ck = org.checkpoint_at(keys, hit.j_adopt)
            assert ck is not None
            running = set()
            for rid in self._admitted():
                if self._edge_state(ck) and org.live_state(rid) == ck:
                    continue        # an edge published in place: read-only until copied
                running |= claims(org.live_state(rid))
                running |= {("page", ref.pool, ref.page) for ref in org.block_table(rid)}
            assert not claims(ck) & running, "lookup hit storage a running request holds"
            assert all(org.page_state(PageRef(ck.pool, p)) != "empty" for p in ck.pages())

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
    @rule(data=st.data(), chunk=st.sampled_from([512, 1024, 1664, 1792, 2048, 3328, 4096]),
          headroom=st.sampled_from([0.0, 0.0, 0.2]))
    def step(self, data, chunk, headroom):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self._step(rid, chunk, headroom if not self.org.is_admitted(rid) else 0.0)

    @rule()
    def end_step(self):
        """A step ends: in place, edges continued past in it become only cached."""
        before = {rid: self.org.live_state(rid) for rid in self._admitted()}
        self.org.end_step()
        assert not self.org.retiring
        assert before == {rid: self.org.live_state(rid) for rid in self._admitted()}

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
        r["on_edge"] = False

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.org.abandon(rid)
        del self.reqs[rid]
        assert rid not in self.org.pinned_checkpoints()

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

    @invariant()
    def placements_are_sound(self):
        if not hasattr(self, "org"):
            return
        org = self.org
        live_claims: dict = {}                 # claim -> the request whose live state holds it
        blocks = set()
        for rid in self._admitted():
            live = org.live_state(rid)
            assert isinstance(live.conv, CONV_KIND[self.org_name]), live
            if self.org_name == "s1":          # 7B geometry: 3 SSM member pages + 1 conv page
                assert len(live.ssm) == 3 and len(live.conv.pages) == 1
            for c in claims(live):
                assert c not in live_claims, f"{c} held by live states of {live_claims[c]}, {rid}"
                live_claims[c] = rid
            for p in live.pages():
                assert org.page_state(PageRef(live.pool, p)) == "referenced", (rid, p)
            for ref in org.block_table(rid):
                assert org.page_state(ref) == "referenced", (rid, ref)
                blocks.add(("page", ref.pool, ref.page))
        assert not blocks & set(live_claims), "a live state shares a page with a block"
        for r in self.reqs.values():
            for j in r["published"]:
                ck = org.checkpoint_at(r["keys"], j)
                if ck is None:
                    continue
                assert isinstance(ck.conv, CONV_KIND[self.org_name]), ck
                for p in ck.pages():
                    assert org.page_state(PageRef(ck.pool, p)) != "empty", (j, p)
                if self._edge_state(ck):
                    continue        # published in place: it is that request's live state
                shared = claims(ck) & (set(live_claims) | blocks)
                assert not shared, f"checkpoint at {j} shares {shared} with a live object"

    def teardown(self):
        if not hasattr(self, "org"):
            return
        for rid in list(self.reqs):
            self.org.abandon(rid)
        self.org.check_invariants()
        assert self.org.holds_no_references()
        referenced = {n for p in self.org.usage().pages.values() for n in [p["referenced"]]}
        assert referenced == {0}, "a hold outlived every request"


# HBENCH_STATEFUL_EXAMPLES raises the example count for a deeper local search.
SETTINGS = settings(max_examples=int(os.environ.get("HBENCH_STATEFUL_EXAMPLES", "60")),
                    stateful_step_count=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("paging", ["study", "vllm"])
@pytest.mark.parametrize("org_name", list(ORGANIZATIONS))
def test_random_histories_keep_invariants(org_name, paging):
    machine = type(f"Machine_{org_name}_{paging}", (OrgMachine,),
                   {"org_name": org_name, "paging": paging})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()
