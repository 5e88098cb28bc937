"""U0's compaction under random histories: content follows its pages.

A hypothesis state machine serves requests on a small u0 region (shared and
private prefixes, prompts past the 1,792-token grid, decodes, finishes,
preemptions) so that compaction, cached attention funding states and
blocks taking their checkpoints with them happen all the time. Beside it, a
shadow of the region's two ends plays the engine (as
`adapters.torch.region.RegionSlots` does): a page handed out is written with
its (page, generation) tag at its slot, and after every call each page with
content whose slot changed is copied to its new slot. After every call:

- every page with content reads its own tag at its slot (a move never
  overwrote or lost content, and the copies the engine made are exactly the
  pages u0 counts as moved);
- the invariants (`check_invariants`, the region's slots dense from each end);
- asking changes nothing, and acting succeeds exactly when asking said yes.
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.model_configs import preset
from harness.orgs import build_organization, layout_for
from harness.orgs.keys import chain_keys

pytestmark = pytest.mark.slow

GEOM = preset("falcon-h1-7b")
PREFIXES = [list(range(1000 * g, 1000 * g + 2200)) for g in range(3)]


class U0Machine(RuleBasedStateMachine):
    @initialize(blocks=st.sampled_from([300, 500]))
    def setup(self, blocks):
        self.org = build_organization(layout_for("u0", GEOM), (blocks,))
        self.shadow = [{}, {}]            # side -> slot -> tag written there
        self.slots = [{}, {}]             # side -> page -> slot at the last sync
        self.gens = [{}, {}]              # side -> page -> generation written
        self.copies = 0
        self.reqs: dict[int, tuple[list[int], int]] = {}   # rid -> (tokens, tokens computed)
        self.next_rid = 0
        self._sync()

    # ---- the engine's side ------------------------------------------------------
    def _sync(self):
        org = self.org
        for k in (0, 1):
            gens, empty = org.page_lifecycle(k)
            placed = org.page_slots(k)
            old, shadow = self.slots[k], self.shadow[k]
            moves = [(old[p], s) for s, p in enumerate(placed)
                     if p in old and old[p] != s and p not in empty
                     and self.gens[k].get(p) == gens[p]]
            values = [shadow.get(src) for src, _ in moves]       # all read, then written
            for (_, dst), v in zip(moves, values, strict=True):
                shadow[dst] = v
            self.copies += len(moves)
            self.slots[k] = {p: s for s, p in enumerate(placed)}
            for s, p in enumerate(placed):
                if p not in empty and self.gens[k].get(p) != gens[p]:
                    shadow[s] = (p, gens[p])                     # handed out: written
                    self.gens[k][p] = gens[p]

    def _act(self, call, *args):
        result = call(*args)
        self._sync()
        return result

    # ---- rules ---------------------------------------------------------------------
    @rule(group=st.integers(0, 3), tail=st.integers(16, 1200))
    def arrive(self, group, tail):
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        prefix = PREFIXES[group] if group < len(PREFIXES) else []
        tokens = prefix + list(range(10**6 + 5000 * rid, 10**6 + 5000 * rid + tail))
        keys = chain_keys(tokens, None)
        n = len(tokens) // 16 * 16
        hit = self.org.lookup(keys, n - 1)
        before = (self.org.version(), self.org.available_pages())
        demand = self.org.pages_needed(rid, n, n, keys, hit)
        asked = self.org.can_allocate(demand)
        assert (self.org.version(), self.org.available_pages()) == before, "asking changed u0"
        acted = self._act(self.org.allocate, rid, n, n, keys, hit)
        assert acted == asked, f"asked {asked}, acted {acted} for {demand}"
        if acted:
            self._act(self.org.commit, rid, keys, n, n)
            self._act(self.org.end_step)
            self.reqs[rid] = (tokens[:n], n)

    @rule(data=st.data())
    def decode(self, data):
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        tokens, n = self.reqs[rid]
        demand = self.org.pages_needed(rid, n + 16, n)
        asked = self.org.can_allocate(demand)
        acted = self._act(self.org.allocate, rid, n + 16, n)
        assert acted == asked
        if acted:
            tokens = tokens + [7 * rid + i for i in range(16)]   # 16 generated tokens
            self._act(self.org.commit, rid, chain_keys(tokens, None), n + 16, n)
            self._act(self.org.end_step)
            self.reqs[rid] = (tokens, n + 16)

    @rule(data=st.data(), preempt=st.booleans())
    def leave(self, data, preempt):
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        del self.reqs[rid]
        if preempt:
            self._act(self.org.preempt, rid)
            self._act(self.org.abandon, rid)
        else:
            self._act(self.org.finish, rid)

    # ---- what must hold ---------------------------------------------------------------
    @invariant()
    def content_follows_its_pages(self):
        if not hasattr(self, "org"):
            return
        for k in (0, 1):
            gens, empty = self.org.page_lifecycle(k)
            for s, p in enumerate(self.org.page_slots(k)):
                if p not in empty:
                    assert self.shadow[k].get(s) == (p, gens[p]), (
                        f"side {k} slot {s}: page {p} gen {gens[p]} reads {self.shadow[k].get(s)}")
        assert self.copies == self.org.region_counters(1)["compaction_moved_pages"]

    @invariant()
    def org_invariants_hold(self):
        if hasattr(self, "org"):
            self.org.check_invariants()


SETTINGS = settings(max_examples=int(os.environ.get("HBENCH_STATEFUL_EXAMPLES", "40")),
                    stateful_step_count=50, suppress_health_check=[HealthCheck.too_slow])


def test_u0_content_follows_its_pages_through_compaction():
    U0Machine.TestCase.settings = SETTINGS
    U0Machine.TestCase().runTest()


def test_the_machine_reaches_compaction_and_donation():
    """The histories above are not vacuous: a fixed one (a region of 500
    blocks, every third request finishing) compacts, donates and cascades."""
    machine = U0Machine()
    machine.setup(blocks=500)
    for i in range(16):
        machine.arrive(group=i % 4, tail=300 + 211 * (i % 7))
        if i % 3 == 2:
            rid = min(machine.reqs)
            del machine.reqs[rid]
            machine._act(machine.org.finish, rid)
        machine.content_follows_its_pages()
        machine.org_invariants_hold()
    counters = machine.org.region_counters(1)
    assert counters["compaction_moved_pages"] > 0 and counters["donated_attention_pages"] > 0
