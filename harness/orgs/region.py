"""Two pools carved out of one region of bytes whose split changes while serving.

D0 fixes its attention pool and its checkpoint pool at start; u0 (one
region, a pool growing from each end, `harness.orgs.u0`) and e0 (D0's pools
with capacity moved between them, `harness.orgs.e0`) let the split follow
the load. Every other part of an `Organization` stays unchanged: the pools
are `ElasticPool` s, whose page ids are fixed while the pages in the pool
change, and `RegionOrganization` stages the pages an action needs before
it and settles the region after it:

    allocate(rid, ...)                        (allocate_all alike)
      demand = pages_needed(...)              per pool, as for D0
      plan   = _plan(demand, new pages)       the organization's rule; None:
                                              refused (counted), nothing changed
      _apply(plan)                            pages grown into the pools (u0
                                              evicts and compacts first)
      Organization.allocate(rid, ...)         takes empty pages first, then
                                              evicts cached ones (LRU), as ever
      _settle()                               the region after the action
    commit / end_step / finish / abandon      the action, then _settle()

(In vLLM's blocks `allocate` first releases the state the request went past
in an earlier step, `Organization.release_retired`, and settles.) Asking
(`can_allocate`) runs `_plan` and changes nothing. Headroom is counted in
bytes of the region, since neither pool has a fixed size to take a fraction
of: floor(f x region bytes) must stay free (empty and cached pages of both
kinds, and the bytes no pool holds). What `region_counters` counts as a refusal:
docs/experiments.md, "Beyond the study: u0 and e0 beside d0".
"""

from __future__ import annotations

from harness.orgs.base import Organization
from harness.orgs.keys import KEY_TOKENS, key_at
from harness.orgs.policies import DEFAULT_POLICY
from harness.orgs.pool import PagePool
from harness.orgs.values import Demand, PoolInfo, RegionCapacity

ATTN_POOL, CKPT_POOL = 0, 1


class ElasticPool(PagePool):
    """A `PagePool` of ``ids`` page ids of which ``pages`` are in the pool.

    The others are ``outside``: free, of no kind, in neither free list, with
    no dependents (`PagePool.check` holds them to that). `grow` brings an
    outside id into the empty set (the most recently retired, else the lowest);
    `retire` takes a free page with no content out. ``num_pages`` is the
    pool's size now, so usage and invariants read it as any pool's."""

    def __init__(self, name: str, ids: int, pages: int, page_bytes: int):
        if not 0 <= pages <= ids:
            raise ValueError(f"pool {name}: {pages} pages of {ids} ids")
        super().__init__(name, ids, page_bytes)
        for page in range(ids - 1, pages - 1, -1):   # popped lowest first
            del self.empty[page]
            self.outside[page] = None
        self.num_pages = pages

    def grow(self) -> int:
        """Bring one outside page into the pool (empty); its id."""
        self.version += 1
        page = self.outside.popitem()[0]
        self.empty[page] = None
        self.num_pages += 1
        return page

    def retire(self, page: int) -> None:
        """Take free page ``page``, which holds nothing (empty, or just claimed
        by `EntryTable.take_page`), out of the pool."""
        assert self.is_free(page) and not self.dependents[page] and page not in self.lru, (
            f"pool {self.name}: retiring page {page} ref={self.ref[page]} "
            f"hold={self.hold[page]} deps={self.dependents[page]}")
        self.version += 1
        self.empty.pop(page, None)
        self.outside[page] = None
        self.num_pages -= 1

    @property
    def ids(self) -> int:
        return len(self.ref)


class RegionOrganization(Organization):
    """An organization of two `ElasticPool` s (attention, checkpoint) in one
    region of ``region_bytes`` per pool layer (module docstring). Subclasses
    give `make_pools`, ``region_bytes``, `unassigned_bytes`, `_plan`,
    `_apply`, `reach` and may give `_settle`."""

    region_bytes = 0

    def __init__(self, layout, pool_pages, policy=DEFAULT_POLICY):
        super().__init__(layout, pool_pages, policy)
        self.page_bytes = tuple(p.page_bytes for p in self.pools)
        self.refusals = 0
        self.refusals_with_room = 0
        self.fragmented_peak = 0          # bytes per pool layer
        self.adopting: tuple = (None, 0)  # (keys, J) of the allocation being staged
        self._last_refusal: tuple = ()    # (state version, demand) of the last one counted

    # ---- what a subclass defines ----------------------------------------------
    def unassigned_bytes(self) -> int:
        """Bytes of the region in neither pool now."""
        raise NotImplementedError

    def _plan(self, demand: tuple[int, ...], new: tuple[int, ...]):
        """How the pools get ``demand`` pages each (``new`` of them fresh, the
        rest cached pages an adoption references), or None if they cannot.
        Changes nothing."""
        raise NotImplementedError

    def _apply(self, plan) -> None:
        """Carry out a plan of `_plan` (before the pages are taken)."""
        raise NotImplementedError

    def reach(self, kind: int) -> int:
        """Pages of pool ``kind`` an allocation of that kind alone could take now."""
        raise NotImplementedError

    def _settle(self) -> None:
        """The region after an action (u0 gives back the empty pages at its ends)."""

    # ---- asking ----------------------------------------------------------------
    def free_bytes(self) -> int:
        """Empty and cached pages' bytes of both pools, and the unassigned bytes."""
        return sum(p.available * p.page_bytes for p in self.pools) + self.unassigned_bytes()

    def can_allocate(self, demand: Demand, headroom: float = 0.0) -> bool:
        """True iff `_plan` finds the pages and, with ``headroom`` f, at least
        floor(f x region bytes) stay free afterwards (module docstring)."""
        new = (tuple(d - a for d, a in zip(demand.pages, demand.adopted, strict=True))
               if demand.adopted else demand.pages)
        if self._plan(demand.pages, new) is None:
            return False
        if not headroom:
            return True
        asked = sum(d * b for d, b in zip(demand.pages, self.page_bytes, strict=True))
        return self.free_bytes() - asked >= int(headroom * self.region_bytes)

    def available_pages(self) -> tuple[int, ...]:
        return (self.reach(ATTN_POOL), self.reach(CKPT_POOL))

    # ---- acting ----------------------------------------------------------------
    def _stage(self, demand: tuple[int, ...], new: tuple[int, ...]) -> bool:
        plan = self._plan(demand, new)
        if plan is None:
            self._refused(demand)
            return False
        self._apply(plan)
        return True

    def _refused(self, demand: tuple[int, ...]) -> None:
        key = (self.version(), demand)
        if key == self._last_refusal:
            return            # asked again with nothing changed: the same refusal
        self._last_refusal = key
        self.refusals += 1
        free = self.free_bytes()
        asked = sum(d * b for d, b in zip(demand, self.page_bytes, strict=True))
        if free < asked:
            return
        self.refusals_with_room += 1
        usable = sum(min(d, self.reach(k)) * self.page_bytes[k]
                     for k, d in enumerate(demand) if d)
        self.fragmented_peak = max(self.fragmented_peak, free - usable)

    def allocate(self, rid, end: int, prefill_until: int, keys=None, hit=None,
                 prompt_len: int | None = None) -> bool:
        if self.release_retired(rid):      # first, as `Organization.allocate`
            self._settle()
        st = self.reqs.get(rid)
        if (st is not None and end <= len(st.attn) * self.attn_block_tokens
                and not self.publication.needs_state(st, end, prefill_until)):
            return super().allocate(rid, end, prefill_until)   # reserved: no page moves
        demand = self.pages_needed(rid, end, prefill_until, keys, hit, prompt_len).pages
        j, adopted, _ = self.prefix.adoption(keys, hit if st is None else None)
        self.adopting = (keys, j)
        try:
            staged = self._stage(demand, tuple(d - a for d, a in zip(demand, adopted, strict=True)))
        finally:
            self.adopting = (None, 0)
        if not staged:
            return False
        assert super().allocate(rid, end, prefill_until, keys, hit, prompt_len), \
            f"{self.name}: staged pages did not serve {rid}"
        self._settle()
        return True

    def allocate_all(self, requests) -> bool:
        """`Organization.allocate_all`: all of them or none, asked for all at
        once. When none needs a checkpoint-sized object (a step's decodes
        taking attention blocks) each one's blocks are staged and taken in
        order, and the region settles once after them (for one kind of page,
        what fits together fits one after another). Otherwise (in place, an
        edge crossed) the pages of all are staged at once, so what one takes
        from the region the others' plan already counted."""
        if self.retired:      # as `Organization.allocate_all`
            return False
        bt, reqs, needs_state = self.attn_block_tokens, self.reqs, self.publication.needs_state
        blocks = []
        for rid, end, prefill_until in requests:
            st = reqs[rid]
            if needs_state(st, end, prefill_until):
                return self._allocate_all_staged(requests)
            b = -(-end // bt) - len(st.attn)
            blocks.append(b if b > 0 else 0)
        total = sum(blocks)
        if self._plan((total, 0), (total, 0)) is None:
            return False      # not a refusal: each request's own call is (module docstring)
        self._copies = ()
        if total:
            for (rid, _, _), b in zip(requests, blocks, strict=True):
                if b:
                    assert self._stage((b, 0), (b, 0)), f"{self.name}: {rid} did not fit"
                    reqs[rid].attn.extend(self.attn.new_blocks(b))
            self._settle()
        return True

    def _allocate_all_staged(self, requests) -> bool:
        needs = [self.pages_needed(rid, end, prefill_until).pages
                 for rid, end, prefill_until in requests]
        total = tuple(map(sum, zip(*needs, strict=True))) if needs else (0, 0)
        plan = self._plan(total, total)
        if plan is None:
            return False      # not a refusal (module docstring)
        if not total[CKPT_POOL]:
            for rid, end, prefill_until in requests:
                assert self.allocate(rid, end, prefill_until), \
                    f"{self.name}: {rid} did not fit after all of them did"
            return True
        self._apply(plan)
        for rid, end, prefill_until in requests:
            assert Organization.allocate(self, rid, end, prefill_until), \
                f"{self.name}: staged pages did not serve {rid}"
        self._settle()
        return True

    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]:
        published = super().commit(rid, keys, computed, prefill_until)
        self._settle()
        return published

    def end_step(self) -> None:
        super().end_step()
        self._settle()

    def finish(self, rid) -> None:
        super().finish(rid)
        self._settle()

    def abandon(self, rid) -> None:
        super().abandon(rid)
        self._settle()

    def _adopted_pages(self, kind: int) -> set[int]:
        """Pages of pool ``kind`` the allocation being staged adopts (never given up)."""
        keys, j = self.adopting
        if not j:
            return set()
        if kind == ATTN_POOL:
            step = self.attn.step
            return {self.attn.map[k] for k in keys[step - 1:j // KEY_TOKENS:step]}
        return {page for _, page in self.ckpts.map[key_at(keys, j)].pages}

    # ---- views -------------------------------------------------------------------
    def region(self) -> RegionCapacity:
        return RegionCapacity(self.region_bytes,
                              tuple(PoolInfo(p.name, p.ids, p.page_bytes) for p in self.pools))

    def region_counters(self, layers: int) -> dict:
        """The refusal counters (module docstring); bytes whole model."""
        return {"alloc_refusals": self.refusals,
                "alloc_refusals_with_room": self.refusals_with_room,
                "fragmented_bytes_peak": self.fragmented_peak * layers}

    def check_region(self) -> None:
        """The region's own invariant: its pools and unassigned bytes fill it."""
        held = sum(p.num_pages * p.page_bytes for p in self.pools)
        assert 0 <= self.unassigned_bytes() and held + self.unassigned_bytes() == self.region_bytes, (
            f"{self.name}: pools {[p.num_pages for p in self.pools]} hold {held} B + "
            f"{self.unassigned_bytes()} B unassigned != region {self.region_bytes} B")

    def check_invariants(self) -> None:
        super().check_invariants()
        self.check_region()
