"""S1 and S2 inside vLLM's block pool: checkpoints that own member pages.

`MemberPagesMixin` goes in front of vLLM's ``BlockPool`` (and, in the unit
tests, in front of a small fake pool with the same methods). While the Mamba
manager allocates (``with pool.carrier_allocation():``), every block it gets
is a *carrier*: the block id the kernel reads a full state from. The mixin
takes the organization's member pages for it from the same free queue and,
for S2, a slot in a 16-slot slab page:

    carrier c ──members──> [m1, m2, m3]        S1 at Falcon-H1 proportions: 4 pages
    carrier c ──members──> [m1, m2] + slab s[slot]   S2: 3 pages + 1/16 slab

Rules (what ``check_invariants`` verifies):
- Reference counts move together: every member's ``ref_cnt`` equals its
  carrier's; touching (a prefix hit) or freeing a carrier does the same to
  its members.
- LRU order moves together: a cached carrier freed to the queue's tail is
  followed there by its members; an uncached one gives its members and slot
  back at once (nothing can hit it).
- Atomic invalidation: when any member page, or the carrier itself, is handed
  out again by ``get_new_blocks``, the carrier's hash is evicted (no lookup
  can hit it any more), the reverse links are cleared and the slot released,
  all before the block reaches its new owner.
- A slab page is held while any slot in it is used and freed with its last
  slot; a checkpoint without a slot maps to no slot (``None``), never slot 0.

Ownership: only this mixin touches ``members``/``owner``/``slots``/``slabs``;
vLLM's code sees carriers as ordinary blocks.

The negative control (``alias_states``, `plan.ENV_STATE_ALIAS`): the pages
are taken, held and evicted exactly as above, but the kernel is handed, for
every checkpoint, the carrier page of the oldest live checkpoint
(`placed_id`; `hooks.place_states` maps the ids vLLM sends its worker). Live
states then share one page, as they would if a checkpoint's state were
written through a member or slot link that points at another owner's page,
and outputs must change: `hbench verify` proves with it that its equality
check can fail for S1 and S2.
"""

from __future__ import annotations

import math
from collections import Counter
from contextlib import contextmanager

from adapters.vllm_plugin.plan import PageLayout


class MemberPagesMixin:
    """Carrier + member pages (+ S2 slab slot) on a vLLM-style block pool."""

    layout: PageLayout | None = None      # None until the Mamba manager configures it
    _carrier_depth = 0

    def org_setup(self, layout: PageLayout, alias_states: bool = False) -> None:
        """Start enforcing ``layout`` (as its negative control with
        ``alias_states``); call before the first carrier allocation."""
        layout.check()
        self.layout = layout
        self.alias_states = alias_states
        self.placement: dict[int, int] = {}       # carrier id -> page its state is placed at
        self.members: dict[int, list] = {}        # carrier id -> member blocks
        self.carriers: dict[int, object] = {}     # carrier id -> carrier block
        self.owner: dict[int, int] = {}           # member id -> carrier id (reverse index)
        self.slots: dict[int, tuple[int, int]] = {}   # carrier id -> (slab id, slot)
        self.slabs: dict[int, tuple[object, set[int]]] = {}  # slab id -> (block, used slots)
        self.counters: Counter = Counter()
        self._carrier_depth = 0

    # -- asking ---------------------------------------------------------------
    @property
    def extra_pages(self) -> int:
        return self.layout.pages_per_checkpoint - 1

    def free_slots(self) -> int:
        slots = self.layout.slab_slots
        return sum(slots - len(used) for _, used in self.slabs.values())

    def pages_needed(self, carriers: int) -> int:
        """Pages ``carriers`` new carriers take, members and new slabs included.

        An upper bound that changes nothing, so the scheduler can ask first."""
        if carriers <= 0:
            return carriers
        pages = carriers * self.layout.pages_per_checkpoint
        if self.layout.uses_slabs:
            pages += math.ceil(max(0, carriers - self.free_slots()) / self.layout.slab_slots)
        return pages

    def slot_of(self, carrier_id: int) -> tuple[int, int] | None:
        """(slab block id, slot) holding ``carrier_id``'s conv state, or None."""
        return self.slots.get(carrier_id)

    def placed_id(self, block_id: int) -> int:
        """The block id the kernel is handed for ``block_id``: itself, except
        for a live checkpoint under the negative control (module docstring)."""
        return self.placement.get(block_id, block_id)

    # -- acting ---------------------------------------------------------------
    @contextmanager
    def carrier_allocation(self):
        """Blocks handed out inside this context are checkpoint carriers."""
        self._carrier_depth += 1
        try:
            yield self
        finally:
            self._carrier_depth -= 1

    def get_new_blocks(self, num_blocks: int) -> list:
        if self.layout is None:
            return super().get_new_blocks(num_blocks)
        if not self._carrier_depth:
            return self._take(num_blocks)
        if self.pages_needed(num_blocks) > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} checkpoints "
                             f"({self.pages_needed(num_blocks)} pages) from the pool")
        carriers = []
        for _ in range(num_blocks):
            carrier = self._take(1)[0]
            members = self._take(self.extra_pages)
            self.carriers[carrier.block_id] = carrier
            self.members[carrier.block_id] = members
            for m in members:
                self.owner[m.block_id] = carrier.block_id
            if self.layout.uses_slabs:
                self._assign_slot(carrier.block_id)
            if self.alias_states:
                self._place_on_oldest(carrier.block_id)
            self.counters["checkpoints_allocated"] += 1
            carriers.append(carrier)
        self._peaks()
        return carriers

    def touch(self, blocks) -> None:
        super().touch(blocks)
        if self.layout is None:
            return
        for block in blocks:
            for m in self.members.get(block.block_id, ()):
                if m.ref_cnt == 0:
                    self.free_block_queue.remove(m)
                m.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        ordered = list(ordered_blocks)
        super().free_blocks(ordered)
        if self.layout is None:
            return
        released_cached, released_uncached = [], []
        for block in ordered:
            members = self.members.get(block.block_id)
            if members is None or block.is_null:
                continue
            for m in members:
                m.ref_cnt -= 1
            if block.ref_cnt == 0:
                (released_cached if block.block_hash is not None else released_uncached).append(block)
        for carrier in released_uncached:
            # Nothing can hit an uncached state: its pages are plain free pages again.
            members = self._unlink(carrier.block_id)
            self.free_block_queue.prepend_n(members)
        for carrier in released_cached:
            # Cached: members follow the carrier to the LRU tail, links kept.
            self.free_block_queue.append_n(self.members[carrier.block_id])

    # -- internals --------------------------------------------------------------
    def _take(self, n: int) -> list:
        """Pop ``n`` pages; invalidate every checkpoint whose page is among them."""
        blocks = super().get_new_blocks(n)
        for b in blocks:
            if b.block_id in self.members:          # a carrier's own page is reused
                self._unlink(b.block_id)
                self.counters["invalidations_carrier"] += 1
            elif b.block_id in self.owner:          # a member page is reused
                carrier = self.carriers[self.owner[b.block_id]]
                self._maybe_evict_cached_block(carrier)   # remove from lookup first
                self._unlink(carrier.block_id)
                self.counters["invalidations_member"] += 1
        return blocks

    def _place_on_oldest(self, carrier_id: int) -> None:
        """The negative control: ``carrier_id``'s state goes to the page of the
        oldest live checkpoint (its own page when it is the only one)."""
        oldest = next(iter(self.carriers))
        self.placement[carrier_id] = oldest
        if oldest != carrier_id:
            self.counters["states_placed_elsewhere"] += 1

    def _unlink(self, carrier_id: int) -> list:
        members = self.members.pop(carrier_id)
        self.carriers.pop(carrier_id)
        self.placement.pop(carrier_id, None)
        for m in members:
            del self.owner[m.block_id]
        self._release_slot(carrier_id)
        return members

    def _assign_slot(self, carrier_id: int) -> None:
        for slab_id in sorted(self.slabs):
            used = self.slabs[slab_id][1]
            if len(used) < self.layout.slab_slots:
                break
        else:
            slab = self._take(1)[0]
            slab_id = slab.block_id
            self.slabs[slab_id] = (slab, set())
            self.counters["slab_pages_allocated"] += 1
        used = self.slabs[slab_id][1]
        slot = min(set(range(self.layout.slab_slots)) - used)
        used.add(slot)
        self.slots[carrier_id] = (slab_id, slot)

    def _release_slot(self, carrier_id: int) -> None:
        where = self.slots.pop(carrier_id, None)
        if where is None:
            return
        slab_id, slot = where
        slab, used = self.slabs[slab_id]
        used.discard(slot)
        if not used:
            del self.slabs[slab_id]
            super().free_blocks([slab])     # last slot gone: the slab page is free
            self.counters["slab_pages_freed"] += 1

    def _peaks(self) -> None:
        c = self.counters
        c["member_pages_peak"] = max(c["member_pages_peak"], len(self.owner))
        c["slab_pages_peak"] = max(c["slab_pages_peak"], len(self.slabs))
        c["slab_slots_peak"] = max(c["slab_slots_peak"], len(self.slots))

    # -- reporting ----------------------------------------------------------------
    def snapshot(self) -> dict:
        """Counters and current occupancy (JSON-ready)."""
        out = dict(self.counters)
        out.update(org=self.layout.org, pages_per_checkpoint=self.layout.pages_per_checkpoint,
                   checkpoints_live=len(self.members), member_pages=len(self.owner),
                   slab_pages=len(self.slabs), slab_slots_used=len(self.slots),
                   free_pages=self.get_num_free_blocks())
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError, showing the broken values, if the links disagree."""
        for cid, members in self.members.items():
            carrier = self.carriers[cid]
            assert len(members) == self.extra_pages, (
                f"carrier {cid} has {len(members)} members, expected {self.extra_pages}")
            for m in members:
                assert self.owner.get(m.block_id) == cid, (
                    f"member {m.block_id} of {cid} maps back to {self.owner.get(m.block_id)}")
                assert m.ref_cnt == carrier.ref_cnt, (
                    f"member {m.block_id} ref {m.ref_cnt} != carrier {cid} ref {carrier.ref_cnt}")
            if self.layout.uses_slabs:
                assert cid in self.slots, f"s2 carrier {cid} has no conv slot"
        assert len(self.owner) == sum(len(m) for m in self.members.values()), (
            f"reverse index has {len(self.owner)} entries for "
            f"{sum(len(m) for m in self.members.values())} members")
        assert set(self.placement) <= set(self.carriers), (
            f"states placed for dead checkpoints: {set(self.placement) - set(self.carriers)}")
        seen = Counter(self.slots.values())
        assert all(n == 1 for n in seen.values()), f"slots shared: {seen}"
        for slab_id, (slab, used) in self.slabs.items():
            assert used and slab.ref_cnt == 1, f"slab {slab_id} used={used} ref={slab.ref_cnt}"
            want = {s for (sid, s) in self.slots.values() if sid == slab_id}
            assert used == want, f"slab {slab_id} marks {used}, carriers hold {want}"
