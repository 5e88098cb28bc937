"""The checkpoint store: checkpoint-sized objects, their publication and holds.

A checkpoint-sized object is the SSM + conv state at one token position laid
out as the organization's `OrgLayout` says: ``ssm_pages`` SSM member pages,
then ``conv_pages`` dedicated conv pages (S1) or one slot in a slab page (S2);
S0 and D0 keep the conv state inside the single member page, after the SSM
state. A running request owns one such object as its *live* state plus the
*spares* reserved for the grid boundaries it will reach; `publish` turns the
live object into the cached checkpoint of a prefix.

Holds: ``pins`` (a preempted request's checkpoint, a correctness requirement)
and ``retains`` (a policy) are separate counters; while either is non-zero
the entry puts one hold on each of its pages, and neither releases the other.

Slab placement has one policy, `SlabTable`'s ranking: `pages_for` (asking)
and `new` (acting) both use it, so what a scheduler is told an allocation
takes is what it takes.
"""

from __future__ import annotations

from harness.layout import OrgLayout
from harness.orgs.entries import CKPT_ENTRY, Entry, EntryTable
from harness.orgs.pool import CONV, EMPTY, SSM
from harness.orgs.slabs import NO_SLOT
from harness.orgs.values import ConvInline, ConvPages, ConvSlot, StatePlacement


class CheckpointStore:
    def __init__(self, table: EntryTable, layout: OrgLayout, pool_idx: int):
        self.table = table
        self.layout = layout
        self.pool_idx = pool_idx
        self.pool = table.pools[pool_idx]
        self.slabs = table.slabs
        self.map = table.maps[CKPT_ENTRY]        # prefix key -> published checkpoint
        self.pages_per_object = layout.ckpt_pages   # whole pages, a slot not counted
        self.published_count = 0

    # ---- queries ---------------------------------------------------------------
    def free_pages_to_adopt(self, key: int) -> tuple[int, frozenset]:
        """Cached pages that referencing the checkpoint under ``key`` takes out of the
        free queue, and the cached slab it would make referenced."""
        ck, pool = self.map[key], self.pool
        pages = sum(1 for _, page in ck.members if pool.is_free(page))
        if ck.slot is not NO_SLOT and pool.is_free(ck.slot.slab):
            return pages + 1, frozenset((ck.slot.slab,))
        return pages, frozenset()

    def pages_for(self, n: int, also_referenced: frozenset) -> int:
        """Pages ``n`` new objects take: member pages plus slab pages by the slab
        policy (``also_referenced``: cached slabs an adoption references first)."""
        pages = n * self.pages_per_object
        if self.slabs is not None and n:
            ref, hold = self.pool.ref, self.pool.hold   # referenced: not `PagePool.is_free`
            pages += self.slabs.pages_to_place(
                n, lambda p: ref[p] != 0 or hold[p] != 0 or p in also_referenced)
        return pages

    def placement(self, e: Entry) -> StatePlacement:
        """Where ``e``'s bytes are (see `StatePlacement`)."""
        lay = self.layout
        pages = [page for _, page in e.members]
        ssm_pages = pages[:lay.ssm_pages]
        ssm, left = [], lay.ssm_bytes
        for page in ssm_pages:
            n = min(left, lay.ckpt_page_bytes)
            ssm.append((page, n))
            left -= n
        conv: ConvPages | ConvSlot | ConvInline | None = None
        if lay.conv_bytes == 0:
            pass
        elif lay.conv_slots:
            conv = ConvSlot(e.slot.slab, e.slot.slot, lay.slot_bytes)
        elif lay.conv_pages:
            conv = ConvPages(tuple(pages[lay.ssm_pages:]), lay.conv_bytes)
        else:
            conv = ConvInline(ssm_pages[-1], lay.ssm_bytes - (len(ssm_pages) - 1)
                              * lay.ckpt_page_bytes)
        return StatePlacement(self.pool_idx, tuple(ssm), conv)

    # ---- actions ---------------------------------------------------------------
    def new(self) -> Entry:
        """A new object referenced once by its owner. The conv slot is placed first:
        a chosen cached slab is then claimed before member pages are reclaimed."""
        table, lay, cp, pool = self.table, self.layout, self.pool_idx, self.pool
        eid = next(table.ids)
        slot = NO_SLOT
        if self.slabs is not None:
            ref, hold = pool.ref, pool.hold
            slab = self.slabs.choose(lambda p: ref[p] != 0 or hold[p] != 0)
            if slab is None:
                slab = table.take_page(cp)
                pool.set_kind(slab, CONV)
                self.slabs.open(slab)
            slot = self.slabs.place(slab, eid)
            pool.dependents[slab].add(eid)
        # member pages: `EntryTable.take_page`, `PagePool.set_kind`,
        # `EntryTable.register` and `EntryTable.ref` with an empty page's
        # transitions inlined (a page fresh from the empty set is in no free
        # queue and of no kind); a reclaimed page goes through the table
        empty, gen, kind, kind_pages = pool.empty, pool.generation, pool.kind, pool.kind_pages
        deps, ref = pool.dependents, pool.ref
        members = []
        ssm_pages = lay.ssm_pages
        for i in range(self.pages_per_object):
            if empty:
                pool.version += 1
                page = empty.popitem()[0]
                gen[page] += 1
            else:
                page = table.take_page(cp)
            k = SSM if i < ssm_pages else CONV
            old = kind[page]
            if old != EMPTY:
                kind_pages[old] -= 1
            kind_pages[k] += 1
            kind[page] = k
            members.append((cp, page))
        e = Entry(eid, CKPT_ENTRY, members, slot)
        table.entries[eid] = e
        for _, page in members:
            deps[page].add(eid)
        if slot is NO_SLOT:
            e.pages = tuple(members)
        else:
            e.pages = (*members, (cp, slot.slab))
        e.generations = tuple(gen[page] for _, page in e.pages)
        e.refs = 1
        for _, page in e.pages:
            pool.version += 1
            if ref[page] == 0 and pool.hold[page] == 0 and page in pool.lru:
                del pool.lru[page]
                pool.cached_pages[kind[page]] -= 1
            ref[page] += 1
        return e

    def publish(self, live: Entry, key: int, position: int) -> None:
        """``live`` becomes the cached checkpoint of the prefix [0, position)
        (a duplicate if that prefix has one already: vLLM paging only)."""
        live.pos = position
        if key in self.map:
            self.table.add_duplicate(live, key)
        else:
            live.key = key
            self.map[key] = live
        self.table.unref(live)
        self.published_count += 1

    def retain(self, e: Entry) -> None:
        if not e.held:
            self.table.hold(e)
        e.retains += 1

    def unretain(self, e: Entry) -> None:
        assert e.retains > 0, f"{self.table.name}: unretain of unretained {e}"
        e.retains -= 1
        if not e.held:
            self.table.drop_hold(e)
