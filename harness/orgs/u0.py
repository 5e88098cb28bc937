"""U0, a unified dual-ended pool: one region, attention from one end,
checkpoints from the other (as SGLang's ``--enable-unified-memory``).

D0's units in one region of R bytes: 16-token attention blocks of A bytes
are laid out from the low end, contiguous checkpoint units of C bytes from
the high end, and either side grows into the gap between them until they
meet:

    0                                                                     R
    | a0 | a1 | .. | a(n-1) |  . . . gap . . .  | c(m-1) | .. | c1 | c0 |
                            ^ attention end      ^ checkpoint end

A side takes, in order: an empty page inside it (a hole), then the gap (it
grows by whole pages at its end), then its own least recently released
cached page (evicted, as D0 evicts). After every action a side gives back
the empty pages at its end to the gap; a hole below a page still in use stays
the side's. U0 never evicts one kind's cached pages to make room for the
other: a side shrinks only as its end pages empty. So a checkpoint (C bytes,
contiguous) can be refused while the gap is smaller than C and the free
bytes are holes and cached pages on the attention side: total usage looks
low, yet the allocation fails. `RegionOrganization` counts those refusals
and the free bytes the refused kind could not use.

The budget gives the region as whole attention pages (floor(bytes / A), loss
under one A); both sides start empty.
"""

from __future__ import annotations

from dataclasses import replace

from harness.geometry import ModelGeometry
from harness.layout import OrgLayout
from harness.orgs.d0 import D0
from harness.orgs.policies import DEFAULT_POLICY
from harness.orgs.region import ATTN_POOL, CKPT_POOL, ElasticPool, RegionOrganization


class U0(RegionOrganization):
    name = "u0"

    @staticmethod
    def layout_for(geom: ModelGeometry) -> OrgLayout:
        return replace(D0.layout_for(geom), org="u0", one_region=True)

    @staticmethod
    def make_pools(layout: OrgLayout, pool_pages: tuple[int, ...]) -> list:
        """Both sides empty in a region of ``pool_pages[0]`` attention pages; each
        side's page ids run from its own end (page i of a side is the i-th from it)."""
        region = pool_pages[0] * layout.attn_page_bytes
        return [ElasticPool("attention", region // layout.attn_page_bytes, 0,
                            layout.attn_page_bytes),
                ElasticPool("checkpoint", region // layout.ckpt_page_bytes, 0,
                            layout.ckpt_page_bytes)]

    def __init__(self, layout: OrgLayout, pool_pages: tuple[int, ...], policy=DEFAULT_POLICY):
        super().__init__(layout, pool_pages, policy)
        self.region_bytes = pool_pages[0] * layout.attn_page_bytes

    def unassigned_bytes(self) -> int:
        """The gap between the two ends."""
        return self.region_bytes - sum(p.num_pages * p.page_bytes for p in self.pools)

    def reach(self, kind: int) -> int:
        return self.pools[kind].available + self.unassigned_bytes() // self.page_bytes[kind]

    def _plan(self, demand, new):
        """Pages each side grows into the gap, or None. A side must grow by what
        its holes and cached pages cannot give (both sides from one gap); with
        gap left, it also grows instead of evicting, for the ``new`` pages its
        holes cannot give (checkpoint side first)."""
        gap, size = self.unassigned_bytes(), self.page_bytes
        must = [max(0, d - p.available) for d, p in zip(demand, self.pools, strict=True)]
        gap -= sum(m * b for m, b in zip(must, size, strict=True))
        if gap < 0:
            return None
        grow = list(must)
        for k in (CKPT_POOL, ATTN_POOL):
            extra = min(max(0, new[k] - len(self.pools[k].empty)) - must[k], gap // size[k])
            if extra > 0:
                grow[k] += extra
                gap -= extra * size[k]
        return tuple(grow)

    def _apply(self, plan) -> None:
        for pool, n in zip(self.pools, plan, strict=True):
            for _ in range(n):
                pool.grow()

    def _settle(self) -> None:
        """Each side gives the empty pages at its end back to the gap."""
        for pool in self.pools:
            while pool.num_pages and pool.num_pages - 1 in pool.empty:
                pool.retire(pool.num_pages - 1)

    def check_region(self) -> None:
        """Each side is contiguous from its end: pages [0, n) of a side are in it,
        the rest outside, and its last page is not empty (given back)."""
        super().check_region()
        for p in self.pools:
            assert all(page >= p.num_pages for page in p.outside), (
                f"u0: side {p.name} of {p.num_pages} pages has a page outside below its end: "
                f"{sorted(page for page in p.outside if page < p.num_pages)}")
            assert not p.num_pages or p.num_pages - 1 not in p.empty, (
                f"u0: side {p.name} keeps its empty end page {p.num_pages - 1}")
