"""Property-based stateful tests: random serving histories against every organization.

A hypothesis state machine drives each organization as
`harness.scheduler.Scheduler` does, on pools small enough that eviction,
invalidation and allocation failure happen all the time: requests arrive
with shared or private prefixes, allocate in chunks, commit, decode, finish,
get preempted, resume, get failed or cancelled and retain checkpoints. Its
one rule, `step`, is one scheduler step, made of the scheduler's calls, so
it plays no history the scheduler could not:

- arrivals (`Scheduler.add`) and cancellations (`Scheduler.cancel`), which
  may come before `schedule()` and between it and `complete()`;
- `schedule()`: each request acts at most once in the step. First running
  requests: each allocates its next chunk (a decode token, or a prefill
  chunk that ends where `Scheduler._chunk_end` ends one: the rest of the
  prefill, or a grid boundary within the step's room, in place cut short
  where `Organization.chunk_stop` stops it; a failed allocate
  changes nothing, so it may be asked again with a shorter chunk) or, not
  yet planned, is preempted. Then, if nobody was preempted, waiting requests
  are admitted (lookup, ask with the headroom, allocate), or one is failed
  (abandoned) while nothing runs;
- `complete()`: the planned requests commit in plan order; right after its
  commit a request may retain checkpoints that commit published and, if it
  emitted a token, finish. Then the step ends (`end_step`, which the
  scheduler calls when ``retiring``); in vLLM's blocks what a request went
  past in it is released when the request is planned next
  (`Organization.release_retired`, before asking).

After every scheduler call `check_invariants()` runs (capacity conserved,
page refcounts = entry references, holds = pinned/retained entries, reverse
index inverts the member map, no entry's storage handed out again) and the
machine checks, through the public protocol only, what the scheduler and an
engine rely on: asking changes nothing, acting succeeds exactly when asking
said yes, a lookup hit is backed by storage no running request holds, and
placements are sound (no page or conv slot held by two live objects, only
pages the pool counts as used, S2 slots always real slots, S1 checkpoints of
3 SSM + 1 conv page at the 7B geometry, a published checkpoint apart from the
new live object).

The same machine runs each organization under the checkpoint policies
(``--ckpt-publish every-k`` and ``marconi``, each with ``--ckpt-evict
utility``; `harness.orgs.policies`), in the study's pages.

The same machine runs each organization in vLLM's blocks (``paging="vllm"``,
1,664-token blocks), where a block edge's state is published in place: there
the running state at an edge may be the edge's checkpoint (read-only until
the request computes past it, when a copy moves it into a new object, and
the edge is held until the step ends), so a hit or a published checkpoint
may share storage with that one live state.
"""

from __future__ import annotations

import os
from functools import partial

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.model_configs import preset
from harness.orgs import ORGANIZATIONS, CheckpointPolicy, build_organization, layout_for
from harness.orgs.keys import chain_keys, extend_keys
from harness.orgs.values import ConvInline, ConvPages, ConvSlot, PageRef
from harness.prefix_flops import prefix_flops

pytestmark = pytest.mark.slow

GEOM = preset("falcon-h1-7b")
POOLS = {"s0": (14,), "s1": (40,), "s2": (40,), "d0": (420, 6),
         "u0": (1003,), "e0": (420, 6)}   # u0's region: d0's bytes in 16 KiB pages
#: in vLLM's 1,664-token blocks: every object one block, so fewer pages bind
VLLM_POOLS = {"s0": (8,), "s1": (20,), "s2": (18,), "d0": (6, 4), "u0": (10,), "e0": (6, 4)}
#: token budgets left for a chunk (`Scheduler._chunk_end`'s room)
ROOMS = [512, 1024, 1664, 1792, 2048, 3328, 4096]
PREFIXES = [[1000 * (p + 1) + i for i in range(4000)] for p in range(3)]


CONV_KIND = {"s0": ConvInline, "s1": ConvPages, "s2": ConvSlot, "d0": ConvInline,
             "u0": ConvInline, "e0": ConvInline}


def snapshot(org, rids):
    """Everything observable: every page's generation and the empty pages
    (`page_lifecycle`), usage, the state version, the running requests' placements."""
    pages = tuple(org.page_lifecycle(i) for i in range(len(org.capacity().pools)))
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
    policy = CheckpointPolicy()

    @initialize()
    def setup(self):
        pools = (VLLM_POOLS if self.paging == "vllm" else POOLS)[self.org_name]
        self.org = build_organization(layout_for(self.org_name, GEOM, self.paging), pools,
                                      self.policy)
        self.in_place = self.paging == "vllm"    # vLLM's blocks publish edges in place
        self.reqs: dict[int, dict] = {}
        self.next_id = 0

    def _edge_state(self, ck) -> bool:
        """In place: ``ck`` is some running request's live state (its edge)."""
        return self.in_place and any(self.org.live_state(rid) == ck for rid in self._admitted())

    # ---- helpers --------------------------------------------------------------
    def _admitted(self):
        return sorted(r for r in self.reqs if self.org.is_admitted(r))

    def _chunk_end(self, start: int, until: int, room: int) -> int:
        """`Scheduler._chunk_end`: the rest of the prefill if it fits in
        ``room`` tokens, else the furthest grid boundary within it."""
        if until - start <= room:
            return until
        grid = self.org.grid
        return max(start, (start + room) // grid * grid)

    def _plan(self, rid: int, room: int, headroom: float = 0.0) -> int | None:
        """Ask, then allocate ``rid``'s next chunk (admitting it if waiting);
        the chunk's end, or None when it does not fit (nothing changed) or
        the room holds no chunk."""
        r = self.reqs[rid]
        org = self.org
        admitted = org.is_admitted(rid)
        hit = None
        start = r["computed"]
        if admitted:    # in place: what it went past earlier goes first, as vLLM frees it
            org.release_retired(rid)
        else:
            hit = org.lookup(r["keys"], len(r["tokens"]) - 1)
            self._check_hit(r["keys"], hit)
            start = hit.j_adopt
        decode = admitted and start >= len(r["tokens"])
        if decode:
            end = len(r["tokens"]) + 1
        else:   # as the scheduler: in place, a chunk ends where vLLM caches a state
            end = org.chunk_stop(rid, start, self._chunk_end(start, r["prefill_until"], room),
                                 r["prefill_until"], hit, r["prompt_len"])
        if end <= start:
            return None
        before = snapshot(org, self._admitted())
        d = org.pages_needed(rid, end, r["prefill_until"], r["keys"], hit, r["prompt_len"])
        can = org.can_allocate(d, headroom)
        if not admitted:    # admission may also ask for the whole input (admit_whole_input)
            org.can_allocate(org.pages_needed(rid, r["prefill_until"], r["prefill_until"],
                                              r["keys"], hit, r["prompt_len"]), headroom)
        assert snapshot(org, self._admitted()) == before, "asking changed the organization"
        if not can:
            if headroom == 0.0:
                assert not org.allocate(rid, end, r["prefill_until"], r["keys"], hit,
                                        r["prompt_len"])
                assert snapshot(org, self._admitted()) == before, \
                    "a failed allocate changed the organization"
            return None
        if decode and not org.in_place and hasattr(org, "publication"):
            # what `Organization.allocate_all` skips asking: a decode needs no
            # checkpoint-sized object unless commits publish in place
            assert not org.publication.needs_state(org.reqs[rid], end, r["prefill_until"])
        if decode:
            r["tokens"].append(7 + rid * 31 + len(r["tokens"]))
            extend_keys(r["keys"], r["tokens"], r["salt"])
        # as the scheduler, with the original prompt's length (kept edges in place)
        assert org.allocate(rid, end, r["prefill_until"], r["keys"], hit, r["prompt_len"])
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
        return end

    def _commit(self, rid: int, end: int) -> list[int]:
        """Commit ``rid``'s planned chunk up to ``end``; what it published."""
        r = self.reqs[rid]
        org = self.org
        published = org.commit(rid, r["keys"], end, r["prefill_until"])
        copies = org.copies()
        r["computed"] = end
        if self.in_place:
            # the edge a chunk exported from inside (vLLM's prefill checkpoint
            # block), then the edge it ended at, if kept
            exported = [j for j in published if j != end]
            assert copies == () and len(exported) <= 1 and set(published) <= {*exported, end}
            for j in exported:
                assert j < end and j % org.grid == 0
                ck = org.checkpoint_at(r["keys"], j)
                assert ck is not None and ck != org.live_state(rid)
                assert not claims(ck) & claims(org.live_state(rid))
            r["on_edge"] = end % org.grid == 0    # at an edge, published or not
            if end in published:
                assert org.checkpoint_at(r["keys"], end) == org.live_state(rid)
            r["published"] = list(range(org.grid, end + 1, org.grid))
            return published
        assert [c.position for c in copies] == published
        for c in copies:
            assert c.reason == "publish" and c.src == org.checkpoint_at(r["keys"], c.position)
            assert not claims(c.src) & claims(c.dst), "published checkpoint shares the live pages"
        if copies:
            assert copies[-1].dst == org.live_state(rid)
        r["published"] = [j for j in range(org.grid, min(end, r["prefill_until"]) + 1, org.grid)]
        return published

    def _preempt(self, rid: int) -> None:
        self.org.preempt(rid)
        r = self.reqs[rid]
        r["computed"] = 0
        r["prefill_until"] = len(r["tokens"])
        r["on_edge"] = False

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

    # ---- the scheduler's calls -------------------------------------------------
    def _arrive(self, data) -> None:
        """`Scheduler.add`: a request with a shared prefix (or none) and a private tail."""
        prefix = data.draw(st.integers(0, 2), label="prefix")
        plen = data.draw(st.integers(0, 3600), label="prefix tokens")
        tail = data.draw(st.integers(1, 700), label="tail tokens")
        salt = f"iso-{self.next_id}" if data.draw(st.booleans(), label="isolated") else None
        rid = self.next_id
        self.next_id += 1
        tokens = PREFIXES[prefix][:plen] + [50_000 + rid * 1000 + i for i in range(tail)]
        self.reqs[rid] = dict(tokens=tokens, keys=chain_keys(tokens, salt), salt=salt,
                              computed=0, prefill_until=len(tokens), prompt_len=len(tokens),
                              published=[])

    def _cancel(self, data) -> None:
        """`Scheduler.cancel` of any request, now and then."""
        if self.reqs and data.draw(st.integers(0, 7), label="cancel") == 0:
            rid = data.draw(st.sampled_from(sorted(self.reqs)), label="cancelled")
            self.org.abandon(rid)
            del self.reqs[rid]
            assert rid not in self.org.pinned_checkpoints()
            self._consistent()

    def _schedule(self, data) -> list[tuple[int, int]]:
        """`Scheduler.schedule()`: running requests planned or preempted, then,
        if nobody was preempted, admissions (or a failure while nothing runs);
        each request acts at most once. The planned (rid, end) in plan order."""
        org, planned, acted = self.org, [], set()
        running = set(self._admitted())
        admitting = preempted = False
        for _ in range(data.draw(st.integers(0, 6), label="actions")):
            choices = [] if admitting else sorted(running - acted)
            if not preempted:
                choices += sorted(r for r in self.reqs if r not in acted and r not in running)
            if not choices:
                break
            rid = data.draw(st.sampled_from(choices), label="request")
            room = data.draw(st.sampled_from(ROOMS), label="room")
            if rid in running:
                if data.draw(st.integers(0, 3), label="preempt") == 0:
                    self._preempt(rid)
                    acted.add(rid)
                    preempted = True
                elif (end := self._plan(rid, room)) is not None:
                    acted.add(rid)
                    planned.append((rid, end))
            else:
                admitting = True
                if not self._admitted() and data.draw(st.integers(0, 3), label="fail") == 0:
                    org.abandon(rid)          # cannot be admitted with nothing running
                    del self.reqs[rid]
                    assert rid not in org.pinned_checkpoints()
                else:
                    headroom = data.draw(st.sampled_from([0.0, 0.0, 0.2]), label="headroom")
                    if (end := self._plan(rid, room, headroom)) is not None:
                        acted.add(rid)
                        planned.append((rid, end))
        return planned

    def _complete(self, data, planned: list[tuple[int, int]]) -> None:
        """`Scheduler.complete()`: commit in plan order, retain and finish right
        after a request's commit, then end the step."""
        org = self.org
        for rid, end in planned:
            if rid not in self.reqs:
                continue                      # cancelled since `schedule`
            published = self._commit(rid, end)
            for j in published:
                if data.draw(st.booleans(), label="retain"):
                    org.retain(rid, j, self.reqs[rid]["keys"])
            if end >= len(self.reqs[rid]["tokens"]) and data.draw(st.booleans(), label="finish"):
                org.finish(rid)               # emitted its last token
                del self.reqs[rid]
        before = {rid: org.live_state(rid) for rid in self._admitted()}
        if org.retiring:
            org.end_step()
        assert not org.retiring
        assert before == {rid: org.live_state(rid) for rid in self._admitted()}

    @rule(data=st.data())
    def step(self, data):
        """One scheduler step: arrivals and cancellations, `schedule()`, more
        cancellations (between the two calls), `complete()`."""
        for _ in range(data.draw(st.integers(0, 2), label="arrivals")):
            self._arrive(data)
        self._cancel(data)
        planned = self._schedule(data)
        self._consistent()      # what an engine computes on between the two calls
        self._cancel(data)
        self._complete(data, planned)

    # ---- invariants ---------------------------------------------------------
    def _consistent(self):
        self.org.check_invariants()
        self._placements_are_sound()

    @invariant()
    def consistent(self):
        if hasattr(self, "org"):
            self._consistent()

    def _placements_are_sound(self):
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


# Each example is up to 50 scheduler steps. HBENCH_STATEFUL_EXAMPLES raises the
# example count for a deeper local search; the rest (derandomized in CI, no
# deadline) comes from the profile tests/conftest.py loads.
SETTINGS = settings(max_examples=int(os.environ.get("HBENCH_STATEFUL_EXAMPLES", "40")),
                    stateful_step_count=50, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("paging", ["study", "vllm"])
@pytest.mark.parametrize("org_name", list(ORGANIZATIONS))
def test_random_histories_keep_invariants(org_name, paging):
    machine = type(f"Machine_{org_name}_{paging}", (OrgMachine,),
                   {"org_name": org_name, "paging": paging})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()


#: checkpoint policies (`harness.orgs.policies`) beside the study's (every
#: boundary, LRU, above): each publish policy, with the utility eviction
POLICIES = {
    "every-k+utility": dict(publish="every-k", every_k=2, evict="utility", alpha=1.0),
    "marconi+utility": dict(publish="marconi", evict="utility", alpha=0.5),
}
POLICY_SETTINGS = settings(SETTINGS, max_examples=max(SETTINGS.max_examples // 4, 1))


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("org_name", list(ORGANIZATIONS))
def test_random_histories_keep_invariants_under_policies(org_name, policy):
    flops = partial(prefix_flops, GEOM)
    machine = type(f"Machine_{org_name}_{policy}", (OrgMachine,),
                   {"org_name": org_name, "policy": CheckpointPolicy(**POLICIES[policy],
                                                                     flops=flops)})
    machine.TestCase.settings = POLICY_SETTINGS
    machine.TestCase().runTest()
