"""Read-only views of an organization: placement, capacity, usage, invariants.

A real engine keeps every pool of `capacity()` as one preallocated tensor of
pages (u0's and e0's pools as one region, `region()`, split while serving);
these queries let it map attention blocks, live recurrent states and
cached checkpoints to (pool, page, byte range) and learn the state copies
that `allocate` and `commit` ask of it (see `harness.orgs.protocol` for the
picture). `usage`, `step_memory` and `check_invariants` delegate to
`harness.orgs.audit`.
None of these changes anything. `Organization` mixes them in; they read its
pools, request table, attention index, checkpoint store and pins.
"""

from __future__ import annotations

from harness.orgs import audit
from harness.orgs.entries import ATTN_ENTRY, CKPT_ENTRY
from harness.orgs.keys import KEY_TOKENS, key_at
from harness.orgs.values import (
    Capacity,
    PageRef,
    PoolInfo,
    RegionCapacity,
    StateCopy,
    StatePlacement,
    Usage,
)


class ReadOnlyViews:
    def block_table(self, rid) -> tuple[PageRef, ...]:
        """The attention blocks of running request ``rid`` in token order."""
        return self.attn.block_table(self.reqs[rid].attn)

    def live_state(self, rid) -> StatePlacement:
        """Where running request ``rid``'s live recurrent state is."""
        return self.ckpts.placement(self.reqs[rid].live)

    def checkpoint_at(self, keys, position: int) -> StatePlacement | None:
        """Where the valid checkpoint of the prefix [0, position) of ``keys`` is."""
        if position <= 0 or position % self.grid or position // KEY_TOKENS > len(keys):
            return None
        e = self.ckpts.map.get(key_at(keys, position))
        return None if e is None else self.ckpts.placement(e)

    def copies(self) -> tuple[StateCopy, ...]:
        """The state copies the last `allocate` or `commit` asks of the engine."""
        place = self.ckpts.placement
        return tuple(StateCopy(reason, j, place(src), place(dst))
                     for reason, j, src, dst in self._copies)

    def page_state(self, ref: PageRef) -> str:
        """``"empty"``, ``"cached"`` or ``"referenced"`` (see `harness.orgs.pool`)."""
        pool = self.pools[ref.pool]
        if not pool.is_free(ref.page):
            return "referenced"
        return "cached" if ref.page in pool.lru else "empty"

    def page_lifecycle(self, pool: int) -> tuple[tuple[int, ...], frozenset[int]]:
        """``(generation of every page, the empty pages)`` of pool ``pool``.

        A page's generation grows each time it is handed out, so a page whose
        generation changed between two calls was handed out again (its old
        content is gone, even if it was reclaimed from the cache); a page that
        became empty was freed or its last cached entry invalidated. An engine
        that holds real memory reads this to poison storage no entry describes.
        """
        p = self.pools[pool]
        return tuple(p.generation), frozenset(p.empty)

    def capacity(self) -> Capacity:
        """The pools now and the token grids: the pools to preallocate when
        `region` is None (their sizes are then fixed for the org's life)."""
        return Capacity(tuple(PoolInfo(p.name, p.num_pages, p.page_bytes) for p in self.pools),
                        self.attn_block_tokens, self.grid)

    def region(self) -> RegionCapacity | None:
        """The one region whose split between the pools changes while serving
        (u0, e0: `harness.orgs.region`), what an engine preallocates instead of
        `capacity`'s pools; None when the pools keep their sizes."""
        return None

    def outside_pages(self, pool: int) -> frozenset[int]:
        """Page ids of pool ``pool`` that are not in it now (an elastic pool's,
        `harness.orgs.region.ElasticPool`; none for a pool of fixed size)."""
        return frozenset(self.pools[pool].outside)

    def page_slots(self, kind: int) -> tuple[int, ...] | None:
        """Page ids of pool ``kind`` by slot from the pool's end, when the
        organization places them itself in one region (u0); None lets an
        engine place them."""
        return None

    @property
    def invalidations(self) -> int:
        return self.table.invalidations

    def watch_invalidations(self, log: list | None) -> None:
        """From now on append every entry invalidated to reclaim a page to ``log``
        (its ``kind`` and prefix ``key`` say what was lost); None stops."""
        self.table.watch = log

    def available_pages(self) -> tuple[int, ...]:
        """Pages per pool an allocation could take now: empty plus evictable cached."""
        return tuple(p.available for p in self.pools)

    def pinned_checkpoints(self) -> dict:
        """Preempted request id -> token position of the checkpoint its preemption pinned."""
        return {rid: e.pos for rid, e in self.pins.checkpoints.items()}

    def retained_checkpoints(self) -> dict:
        """Prefix key -> retention holds, for each published checkpoint retention keeps."""
        return {k: e.retains for k, e in self.ckpts.map.items() if e.retains}

    @property
    def invalidations_by_kind(self) -> dict[str, int]:
        """Cached entries destroyed to reclaim a page: ``{"attention": n, "checkpoint": n}``."""
        by_kind = self.table.invalidations_by_kind
        return {"attention": by_kind[ATTN_ENTRY], "checkpoint": by_kind[CKPT_ENTRY]}

    def region_counters(self, layers: int) -> dict:
        """Counters of an organization whose pools share one region (u0, e0:
        `harness.orgs.region`), bytes whole model for ``layers`` pool layers;
        none for fixed pools."""
        return {}

    def policy_counters(self) -> dict:
        """What the checkpoint policies decided over the run: with
        ``--utility-alpha auto`` the tuned alpha and when
        (`harness.orgs.alpha_tuning.AlphaTuner.counters`); none otherwise."""
        tuner = getattr(self.table.evict, "tuner", None)
        return {} if tuner is None else tuner.counters()

    @property
    def moved_capacity_bytes(self) -> int:
        """Bytes per pool layer moved between pools so far (e0; 0 for pools
        that never move capacity). An engine that prices moves reads it
        before and after planning a step."""
        return 0

    @property
    def compacted_bytes(self) -> int:
        """Bytes per pool layer copied by compaction so far (u0; 0 for pools
        that never move a page with content)."""
        return 0

    @property
    def published_count(self) -> int:
        return self.ckpts.published_count

    def check_invariants(self) -> None:
        """Raise AssertionError with the broken values if any invariant fails."""
        audit.check_invariants(self)

    def usage(self) -> Usage:
        """Blocks and bytes by state kind and state, waste, slab occupancy."""
        return audit.usage(self)

    def step_memory(self, layers: int) -> audit.StepMemory:
        """A sampler of `usage`'s figures as a step table records them, whole
        model for ``layers`` pool layers, with their peaks (`audit.StepMemory`)."""
        return audit.StepMemory(self, layers)

    def holds_no_references(self) -> bool:
        """True when no request is admitted and no page has an execution reference
        (pages are free or cached; pins of preempted requests may remain)."""
        return not self.reqs and all(r == 0 for p in self.pools for r in p.ref)
