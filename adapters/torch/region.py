"""U0's and e0's pools in one preallocated buffer: the region, two typed ends.

A region organization (`harness.orgs.region`) splits ``R`` bytes per pool
layer between an attention pool of ``A``-byte pages and a checkpoint pool of
``C``-byte pages, and moves the split while serving. The engine allocates the
region once, ``R x layers`` elements of storage, and lays the pages of both
pools into it page-major, a page spanning every layer as in a fixed pool
(`adapters.torch.pools`): attention pages from the low end, checkpoint
pages from the high end::

    0                                                               R x layers
    | slot 0 | slot 1 | .. | slot nA-1 |  . . free . . | slot nC-1 | .. | slot 0 |
      attention pages [layers, A]                       checkpoint pages [layers, C]

Each end is one ordinary tensor ``[pages, layers, page_elems]`` (a view of
the buffer), so K/V blocks, gathers, scatters and the state kernels address
a page of a region exactly as a page of a fixed pool. The organization's
page ids stay fixed while the pages in each pool change; `RegionSlots`
keeps, per pool, which slot each page id in the pool occupies, the pages
dense from their end (slots ``0 .. n-1``), so the two ends never overlap
while ``nA x A + nC x C <= R``, which the organization's own region
invariant keeps (`RegionOrganization.check_region`).

After each organization call that may change the pools (`sync`):

* a page that left its pool (retired) frees its slot (filled with NaN when
  the engine poisons, `poison`); the pool's last pages fill the holes below
  the new end, a page holding content (cached or referenced) copied into
  the hole (a relocation, counted);
* a page that joined the pool takes the next slot at its end.

U0 places its pages itself (`page_slots`, `harness.orgs.u0`): it compacts
a side by moving the pages above its holes into them, and `sync` copies each
page with content whose slot changed (the relocations, as many as the
organization's ``compaction_moved_pages``). E0 moves free pages of its choice between
the pools, as a virtual-memory mapping would move physical pages; without
such a mapping, a page leaving the middle of a pool costs one page copy
here (the simulator, which models the mapping, charges a move nothing).
"""

from __future__ import annotations

import torch

from harness.orgs.protocol import OrganizationProtocol
from harness.orgs.values import PageRef, RegionCapacity


def region_views(storage: torch.Tensor, region: RegionCapacity, layers: int,
                 unit: int) -> list[torch.Tensor]:
    """The attention end and the checkpoint end of ``storage`` (``R x layers``
    elements, ``unit`` bytes each) as ``[page ids, layers, page_elems]`` views:
    attention slot ``s`` is row ``s`` of the first, checkpoint slot ``s`` row
    ``ids - 1 - s`` of the second (slot 0 at the buffer's end)."""
    total = storage.numel()
    views = []
    for k, pool in enumerate(region.pools):
        elems = pool.page_bytes // unit
        span = pool.pages * layers * elems
        part = storage[:span] if k == 0 else storage[total - span:]
        views.append(part.view(pool.pages, layers, elems))
    return views


class RegionSlots:
    """Where each page of a region organization's two pools lies in the
    region's views (module docstring). ``org`` is read through its views only."""

    def __init__(self, org: OrganizationProtocol, views: list[torch.Tensor],
                 region: RegionCapacity):
        self.org = org
        self.views = views
        self.region = region
        self.outside = [org.outside_pages(k) for k in range(len(views))]
        # per pool: page id -> slot, and slot -> page id (dense from the end)
        self.slot: list[dict[int, int]] = []
        self.at: list[list[int]] = []
        for k, pool in enumerate(region.pools):
            inside = [p for p in range(pool.pages) if p not in self.outside[k]]
            self.slot.append({p: s for s, p in enumerate(inside)})
            self.at.append(inside)
        self.relocations = 0          # pages copied into a hole
        # pools placed by the organization: page generations at the last sync
        self.gens = [org.page_lifecycle(k)[0] if org.page_slots(k) is not None else ()
                     for k in range(len(views))]
        self.poison = False           # NaN into each retired page's slot
        self.poisoned = 0
        self.grown = [0] * len(views)
        self.given_back = [0] * len(views)
        self._check()

    def row(self, pool: int, page: int) -> int | None:
        """The row of ``views[pool]`` holding page ``page``; None when the page
        is not in the pool now."""
        s = self.slot[pool].get(page)
        return None if s is None else self._row(pool, s)

    def _row(self, pool: int, slot: int) -> int:
        return slot if pool == 0 else self.views[pool].shape[0] - 1 - slot

    def sync(self) -> None:
        """Follow the pools' changes since the last call: retirements first (the
        holes they leave filled from the end), then the pages grown. A pool
        whose organization places its pages (`page_slots`, u0) is followed
        page for page instead (`_follow`)."""
        now = [self.org.outside_pages(k) for k in range(len(self.views))]
        for k in range(len(self.views)):
            placed = self.org.page_slots(k)
            if placed is not None:
                self._follow(k, placed, now[k] - self.outside[k])
                continue
            retired = now[k] - self.outside[k]
            if retired:
                self._retire(k, retired)
        for k in range(len(self.views)):
            if self.org.page_slots(k) is not None:
                continue
            grown = sorted(self.outside[k] - now[k])
            for page in grown:
                self.slot[k][page] = len(self.at[k])
                self.at[k].append(page)
            self.grown[k] += len(grown)
        self.outside = now
        self._check()

    def _follow(self, k: int, placed: tuple[int, ...], retired: frozenset[int]) -> None:
        """Put pool ``k``'s pages where the organization placed them: every page
        with content, not handed out anew since the last sync, whose slot
        changed is copied from its old slot (all read before any is written),
        a retired page's old slot poisoned first."""
        old_slot, old_gens = self.slot[k], self.gens[k]
        gens, empty = self.org.page_lifecycle(k)
        src, dst = [], []
        for s, page in enumerate(placed):
            was = old_slot.get(page)
            if (was is not None and was != s and page not in empty
                    and gens[page] == old_gens[page]):
                src.append(self._row(k, was))
                dst.append(self._row(k, s))
        self.gens[k] = gens
        if self.poison and retired:
            for p in retired:
                self.views[k][self._row(k, old_slot[p])] = float("nan")
            self.poisoned += len(retired)
        if src:
            view = self.views[k]
            view[torch.tensor(dst)] = view[torch.tensor(src)]
            self.relocations += len(src)
        self.given_back[k] += len(retired)
        self.grown[k] += sum(1 for p in placed if p not in old_slot)
        self.slot[k] = {p: s for s, p in enumerate(placed)}
        self.at[k] = list(placed)

    def _retire(self, k: int, retired: frozenset[int]) -> None:
        at, slot = self.at[k], self.slot[k]
        end = len(at) - len(retired)
        holes = sorted(slot[p] for p in retired if slot[p] < end)
        movers = [p for p in at[end:] if p not in retired]
        if self.poison:
            for p in retired:
                self.views[k][self._row(k, slot[p])] = float("nan")
            self.poisoned += len(retired)
        for hole, page in zip(holes, movers, strict=True):
            if self.org.page_state(PageRef(k, page)) != "empty":
                self._copy(k, slot[page], hole)
                self.relocations += 1
            slot[page] = hole
            at[hole] = page
        for p in retired:
            del slot[p]
        del at[end:]
        self.given_back[k] += len(retired)

    def _copy(self, pool: int, src: int, dst: int) -> None:
        """Page in slot ``src`` into slot ``dst`` (every layer)."""
        self.views[pool][self._row(pool, dst)] = self.views[pool][self._row(pool, src)]

    def _check(self) -> None:
        used = sum(len(at) * p.page_bytes for at, p in zip(self.at, self.region.pools, strict=True))
        assert used <= self.region.region_bytes, (
            f"region pages {[len(at) for at in self.at]} hold {used} B > region "
            f"{self.region.region_bytes} B: the two ends overlap")

    def counters(self) -> dict:
        """What the region did: pages grown into and given back by each pool,
        pages relocated (the engine's stats)."""
        names = [p.name for p in self.region.pools]
        return {"region_pages_grown": dict(zip(names, self.grown, strict=True)),
                "region_pages_given_back": dict(zip(names, self.given_back, strict=True)),
                "region_relocations": self.relocations}
