"""E0, elastic dual pools: D0's two pools, with capacity moved between them
when one cannot allocate and the other has free space (as AVMP / cachepawl).

E0 starts as D0 does (the budget's split, ``--d0-attn-fraction``): an
attention pool of 16-token blocks of A bytes and a checkpoint pool of
contiguous units of C bytes. When an allocation needs more pages of one pool
than it has free (empty or cached), and the other pool has free pages beyond
what the same allocation takes from it, E0 moves capacity: it takes the
fewest free pages of the donor that, with the bytes left over from earlier
moves, make up the missing pages (empty pages first, then the least
recently released cached ones, whose content is invalidated, never pages
the allocation adopts), and the receiving pool grows by every whole page
those bytes hold; what is left (under one page) waits for the next move.
The two pools live in one region of the budget's allocated bytes, so a move
never changes the total. Moving C bytes of checkpoint pool buys 97 attention
blocks of Falcon-H1-7B (5 KiB left over); a checkpoint unit takes 98 blocks.

Capacity moves as free pages, as a virtual-memory mapping moves physical
pages between two address ranges: no page in use is moved, so a move copies
no state. What a move costs is the remapping: the donor's bytes unmapped
from its range, mapped into the receiver's and given access, priced by the
simulator's cost model per byte moved (`adapters.sim.cost.CostModel.move_s`:
CUDA's unmap + map + set-access time per 2 MiB granule, pro rata) and
charged to the step whose planning moved them (`adapters.sim.moves`). E0
assumes the mapping granule is no larger than an attention block; a coarser
one (CUDA's 2 MiB) would need whole free granules, which is not modelled.
`region_counters` reports the moves and the bytes moved, by direction, with
`RegionOrganization`'s refusals; `moved_capacity_bytes` is the running total
the pricing reads.
"""

from __future__ import annotations

from dataclasses import replace

from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout
from harness.orgs.d0 import D0
from harness.orgs.policies import DEFAULT_POLICY
from harness.orgs.region import ATTN_POOL, ElasticPool, RegionOrganization
from harness.orgs.split import DualPools


class E0(RegionOrganization):
    name = "e0"
    pool_split = DualPools()   # D0's split; capacity moves between the pools later

    @staticmethod
    def layout_for(geom: ModelGeometry, grid: Grid) -> OrgLayout:
        return replace(D0.layout_for(geom, grid), org="e0")

    @staticmethod
    def make_pools(layout: OrgLayout, pool_pages: tuple[int, ...]) -> list:
        """D0's pools, each with page ids for the whole region."""
        a, c = pool_pages
        region = a * layout.attn_page_bytes + c * layout.ckpt_page_bytes
        return [ElasticPool("attention", region // layout.attn_page_bytes, a,
                            layout.attn_page_bytes),
                ElasticPool("checkpoint", region // layout.ckpt_page_bytes, c,
                            layout.ckpt_page_bytes)]

    def __init__(self, layout: OrgLayout, pool_pages: tuple[int, ...], policy=DEFAULT_POLICY):
        super().__init__(layout, pool_pages, policy)
        self.region_bytes = sum(p.num_pages * p.page_bytes for p in self.pools)
        self.leftover = 0                 # bytes of moves no whole page held
        self.moves = 0
        self.moved_bytes = [0, 0]         # bytes moved into each pool

    def unassigned_bytes(self) -> int:
        return self.leftover

    def reach(self, kind: int) -> int:
        other = self.pools[1 - kind]
        movable = self.leftover + other.available * other.page_bytes
        return self.pools[kind].available + movable // self.page_bytes[kind]

    def _plan(self, demand, new):
        """``()`` (no move), ``(pool, donor pages)`` (a move into ``pool``), or None."""
        free = [p.available for p in self.pools]
        short = [max(0, d - f) for d, f in zip(demand, free, strict=True)]
        if not any(short):
            return ()
        if all(short):
            return None
        k = 0 if short[0] else 1
        o = 1 - k
        missing = short[k] * self.page_bytes[k] - self.leftover
        donor = -(-missing // self.page_bytes[o]) if missing > 0 else 0
        if free[o] - demand[o] < donor:
            return None
        return (k, donor)

    def _apply(self, plan) -> None:
        if not plan:
            return
        k, donor = plan
        o = 1 - k
        for _ in range(donor):
            self._give_up_page(o)
        moved = donor * self.page_bytes[o]
        total = self.leftover + moved
        pages, self.leftover = divmod(total, self.page_bytes[k])
        for _ in range(pages):
            self.pools[k].grow()
        if donor:
            self.moves += 1
            self.moved_bytes[k] += moved

    def _give_up_page(self, kind: int) -> None:
        """Take one free page out of pool ``kind``: an empty one, else the least
        recently released cached one the allocation does not adopt, its content
        invalidated first (invalidate before free)."""
        pool = self.pools[kind]
        page = pool.take_empty()
        if page is None:
            keep = self._adopted_pages(kind)
            page = next(p for p in pool.lru if p not in keep)
            if kind == ATTN_POOL:
                self.attn.invalidate(page)
            else:
                for eid in list(pool.dependents[page]):
                    self.table.invalidate(self.table.entries[eid])
            pool.claim(page)
        pool.retire(page)

    @property
    def moved_capacity_bytes(self) -> int:
        return sum(self.moved_bytes)

    def region_counters(self, layers: int) -> dict:
        out = super().region_counters(layers)
        out.update({"capacity_moves": self.moves,
                    "capacity_moved_bytes": sum(self.moved_bytes) * layers,
                    "capacity_moved_to_attention_bytes": self.moved_bytes[0] * layers,
                    "capacity_moved_to_checkpoint_bytes": self.moved_bytes[1] * layers})
        return out
