"""U0, a unified dual-ended pool: one region, attention from one end,
checkpoints from the other, under SGLang 0.5.23's ``--enable-unified-memory``
rule (paths below under ``sglang/srt/mem_cache/``).

    0                                                                     R
    | a0 | a1 | .. | a(n-1) |  . . . gap . . .  | c(m-1) | .. | c1 | c0 |
      slots of the attention side                 slots of the checkpoint side

Why: the split between attention and checkpoints follows the load instead
of being fixed at start (D0). An allocation, asked and acted by one plan
(`_plan`), takes for each side, the state first: its own holes, then the
gap; then the other side compacted (``unified_sub_pool.py:197``); for a
state short of bytes, cached attention (``unified_radix_cache.py:745-759``);
only then its own cached checkpoints. A page id keeps its identity while
its page moves (`page_slots`). Each step with its SGLang line, and where u0
is not SGLang: docs/experiments.md, "u0's rule, step by step".

The budget gives the region as whole attention pages (floor(bytes / A), loss
under one A); both sides start empty.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout
from harness.orgs.d0 import D0
from harness.orgs.policies import DEFAULT_POLICY
from harness.orgs.region import ATTN_POOL, CKPT_POOL, ElasticPool, RegionOrganization
from harness.orgs.split import OneRegion


@dataclass(frozen=True)
class UnifiedPlan:
    """What an allocation does to the region, in the order `U0._apply` acts:
    per side, whether the other side is compacted first, the cached pages
    evicted, the pages grown into the gap."""

    compact: tuple[bool, bool] = (False, False)   # side k compacted (its holes to the gap)
    donate: int = 0                               # cached attention pages funding states
    evict: tuple[int, int] = (0, 0)               # own cached pages evicted per side
    grow: tuple[int, int] = (0, 0)                # pages each side grows into the gap
    keep: int = 0                                 # checkpoint holes the allocation takes


class U0(RegionOrganization):
    name = "u0"
    pool_split = OneRegion()
    #: blocks taken can compact a side or take cached checkpoints with them, and a
    #: state prefers a hole to cached attention: a refused admission may then fit
    takes_keep_refusals = False

    @staticmethod
    def layout_for(geom: ModelGeometry, grid: Grid) -> OrgLayout:
        return replace(D0.layout_for(geom, grid), org="u0", one_region=True)

    @staticmethod
    def make_pools(layout: OrgLayout, pool_pages: tuple[int, ...]) -> list:
        """Both sides empty in a region of ``pool_pages[0]`` attention pages."""
        region = pool_pages[0] * layout.attn_page_bytes
        return [ElasticPool("attention", region // layout.attn_page_bytes, 0,
                            layout.attn_page_bytes),
                ElasticPool("checkpoint", region // layout.ckpt_page_bytes, 0,
                            layout.ckpt_page_bytes)]

    def __init__(self, layout: OrgLayout, pool_pages: tuple[int, ...], policy=DEFAULT_POLICY):
        super().__init__(layout, pool_pages, policy)
        self.region_bytes = pool_pages[0] * layout.attn_page_bytes
        a, c = self.page_bytes
        self.state_cost = -(-c // a) * a       # bytes a state from the gap is charged
        self.at: list[list[int]] = [[], []]    # per side: slot -> page id
        self.slot: list[dict[int, int]] = [{}, {}]
        self.compactions = 0
        self.moved_pages = [0, 0]              # pages moved by compaction, per side
        self.donated = 0                       # cached attention pages evicted for states
        self.cascaded = 0                      # cached checkpoints that went with their block

    # ---- asking ----------------------------------------------------------------
    def unassigned_bytes(self) -> int:
        """The gap between the two ends."""
        return self.region_bytes - sum(p.num_pages * p.page_bytes for p in self.pools)

    def reach(self, kind: int) -> int:
        """Holes and cached pages of the side, and what the gap, the other
        side's holes (and, for checkpoints, its cached pages) hold in its pages."""
        own, other = self.pools[kind], self.pools[1 - kind]
        extra = len(other.empty) + (len(other.lru) if kind == CKPT_POOL else 0)
        size = self.state_cost if kind == CKPT_POOL else self.page_bytes[kind]
        return own.available + (self.unassigned_bytes() + extra * other.page_bytes) // size

    def _plan(self, demand, new):
        """The `UnifiedPlan` that gives each side its ``new`` fresh pages (the
        rest of ``demand`` are cached pages adopted, never evicted), or None.
        Changes nothing (module docstring, steps 1-4)."""
        a_bytes, c_bytes = self.page_bytes
        pa, pc = self.pools
        holes = [len(pa.empty), len(pc.empty)]
        cached = [len(pa.lru) - (demand[0] - new[0]), len(pc.lru) - (demand[1] - new[1])]
        gap = self.unassigned_bytes()
        compact, evict, grow, donate = [False, False], [0, 0], [0, 0], 0
        # the state side first
        short = max(0, new[1] - holes[1])
        holes[1] -= new[1] - short
        if short and gap < short * self.state_cost:
            compact[0], gap, holes[0] = True, gap + holes[0] * a_bytes, 0
        if short and gap < short * self.state_cost:
            donate = min(cached[0], -(-(short * self.state_cost - gap) // a_bytes))
            cached[0] -= donate
            gap += donate * a_bytes
        if short and gap < short * self.state_cost:
            evict[1] = short - gap // self.state_cost
            if evict[1] > cached[1]:
                return None
            short -= evict[1]
        grow[1] = short
        gap -= short * c_bytes
        # then the attention side
        short = max(0, new[0] - holes[0])
        if short * a_bytes > gap:
            compact[1], gap = True, gap + holes[1] * c_bytes
        if short * a_bytes > gap:
            evict[0] = short - gap // a_bytes
            if evict[0] > cached[0]:
                return None
            short -= evict[0]
        grow[0] = short
        return UnifiedPlan(tuple(compact), donate, tuple(evict), tuple(grow), new[1] - grow[1])

    # ---- acting ----------------------------------------------------------------
    def _apply(self, plan: UnifiedPlan) -> None:
        """Evictions first, then compactions keeping the holes the allocation
        takes, then growth: so no page is moved and then evicted, or moved twice,
        in one action (`plan.donate` implies `plan.compact[0]`)."""
        cascaded = self.cascaded
        if plan.donate:
            self._evict(ATTN_POOL, plan.donate)
            self.donated += plan.donate
        self._evict(ATTN_POOL, plan.evict[0])
        # a block's checkpoint, gone with it, is a hole already
        self._evict(CKPT_POOL, plan.evict[1] - (self.cascaded - cascaded))
        if plan.compact[0]:
            self._compact(ATTN_POOL, keep=plan.evict[0])
        if plan.compact[1]:
            self._compact(CKPT_POOL, keep=plan.keep)
        self._grow(CKPT_POOL, plan.grow[1])
        self._grow(ATTN_POOL, plan.grow[0])

    def _grow(self, kind: int, n: int) -> None:
        at, slot, pool = self.at[kind], self.slot[kind], self.pools[kind]
        for _ in range(n):
            page = pool.grow()
            slot[page] = len(at)
            at.append(page)

    def _evict(self, kind: int, n: int) -> None:
        """Invalidate ``n`` cached pages of side ``kind`` (blocks least recently
        released first, checkpoints as the run's eviction policy picks), never
        one the allocation adopts; each becomes a hole. A block
        takes the cached checkpoint at the position it ends with it, unless a copy
        of the block takes its place or the allocation adopts the checkpoint."""
        if n <= 0:
            return
        pool, keep = self.pools[kind], self._adopted_pages(kind)
        if kind == CKPT_POOL:   # the run's eviction policy chooses, as `take_page` lets it
            policy = self.table.evict
            for _ in range(n):
                page = (policy.victim(self.table, kind, frozenset(keep)) if policy is not None
                        else next((p for p in pool.lru if p not in keep), None))
                assert page is not None, f"u0: {n} cached pages of {pool.name} planned"
                for eid in list(pool.dependents[page]):
                    self.table.invalidate(self.table.entries[eid])
            return
        adopted = self._adopted_pages(CKPT_POOL)
        victims = [p for p in pool.lru if p not in keep][:n]
        assert len(victims) == n, f"u0: {n} cached pages of {pool.name} planned, {len(victims)}"
        for page in victims:
            key = self.attn.key[page]
            self.attn.invalidate(page)
            if key is None or key in self.attn.map:   # private, or a copy takes over
                continue
            e = self.ckpts.map.get(key)
            if (e is not None and e.refs == 0 and not e.held
                    and not any(p in adopted for _, p in e.pages)):
                self.table.invalidate(e)
                self.cascaded += 1

    def _compact(self, kind: int, keep: int = 0) -> None:
        """Give the holes of side ``kind`` but its ``keep`` lowest to the gap: the
        pages above the new end move into the given holes below it (lowest
        hole first, in slot order); a page with content moved is a copy."""
        pool, at, slot = self.pools[kind], self.at[kind], self.slot[kind]
        give = sorted(pool.empty, key=slot.__getitem__)[keep:]
        if not give:
            return
        given = set(give)
        end = len(at) - len(given)
        below = sorted(slot[p] for p in give if slot[p] < end)
        movers = [p for p in at[end:] if p not in given]
        for s, page in zip(below, movers, strict=True):
            slot[page] = s
            at[s] = page
        for page in give:
            pool.retire(page)
            del slot[page]
        del at[end:]
        copied = sum(1 for p in movers if p not in pool.empty)
        if copied:
            self.compactions += 1
            self.moved_pages[kind] += copied

    def _settle(self) -> None:
        """Each side gives the empty pages at its end back to the gap."""
        for pool, at, slot in zip(self.pools, self.at, self.slot, strict=True):
            while at and at[-1] in pool.empty:
                page = at.pop()
                del slot[page]
                pool.retire(page)

    # ---- views -------------------------------------------------------------------
    def page_slots(self, kind: int) -> tuple[int, ...]:
        return tuple(self.at[kind])

    @property
    def compacted_bytes(self) -> int:
        """Bytes per pool layer compaction has copied so far (what the simulator prices)."""
        return sum(n * b for n, b in zip(self.moved_pages, self.page_bytes, strict=True))

    def region_counters(self, layers: int) -> dict:
        out = super().region_counters(layers)
        out.update({"compactions": self.compactions,
                    "compaction_moved_pages": sum(self.moved_pages),
                    "compaction_moved_bytes": self.compacted_bytes * layers,
                    "donated_attention_pages": self.donated,
                    "cascaded_checkpoints": self.cascaded})
        return out

    def check_region(self) -> None:
        """Each side's slots hold exactly its pages, dense from its end, and its
        last slot is not empty (given back)."""
        super().check_region()
        for p, at, slot in zip(self.pools, self.at, self.slot, strict=True):
            inside = set(range(p.ids)) - set(p.outside)
            assert len(at) == p.num_pages and set(at) == inside, (
                f"u0: side {p.name} of {p.num_pages} pages has slots for {sorted(at)}")
            assert all(slot[page] == s for s, page in enumerate(at)), (
                f"u0: side {p.name}: slot map {slot} does not invert {at}")
            assert not at or at[-1] not in p.empty, (
                f"u0: side {p.name} keeps its empty end page {at[-1]}")
