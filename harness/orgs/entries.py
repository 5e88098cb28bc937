"""Logical entries over physical pages, and the plumbing between the two.

An `Entry` is one logical object: a checkpoint-sized object (member pages,
plus a conv slot for S2). Attention blocks, one page each, are kept by page
in the attention index (`harness.orgs.attention`), which moves their pages
itself; they share the entry ids and the reverse index. The `EntryTable`
moves the pages of checkpoint-sized entries (`CheckpointStore.new` does its
steps inline for pages fresh from the empty set, on the hot path, and says
so): it numbers entries, keeps the pools' reverse index (page -> entry ids) in step
with each entry's pages, mirrors entry references as page reference counts
and entry holds (pins, retains) as page holds, and reclaims cached pages.

Reclaiming follows invalidate-before-free: every entry stored in the page is
frozen (it must have no reference and no hold), removed from its lookup map
and from the reverse index, and only then is the page handed out (a block page's
block by the attention index). The checkpoint store
(`harness.orgs.checkpoints`) owns the checkpoint lookup map's contents; the
table only removes what it invalidates.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from harness.orgs.pool import EMPTY
from harness.orgs.slabs import NO_SLOT, SlabTable

ATTN_ENTRY, CKPT_ENTRY = "attn", "ckpt"


def may_change_lookup(lost, keys) -> bool:
    """Whether invalidating ``lost`` (what `Organization.watch_invalidations`
    logs: its ``kind`` and prefix ``key``) may change a prefix lookup over
    ``keys`` (a set): a checkpoint may (it ends a hit, or frees room a
    refused head needs), an attention block only if the prefix holds its key."""
    return lost.kind != ATTN_ENTRY or lost.key in keys


def unmap_copy(lookup: dict, copies: dict, key: int, item) -> None:
    """Take ``item`` (registered under ``key``, or one of its waiting copies) out
    of ``lookup``: if ``lookup`` finds it, the oldest copy in ``copies[key]`` is
    found from now on. Checkpoints (entries) and attention blocks (pages) keep
    their copies alike (vLLM paging)."""
    waiting = copies.get(key)
    if lookup.get(key) == item:          # an entry compares by identity, a page by number
        if waiting:
            lookup[key] = waiting.pop(0)
        else:
            del lookup[key]
    elif waiting:
        waiting.remove(item)
    if waiting is not None and not waiting:
        del copies[key]


class Entry:
    __slots__ = ("id", "kind", "key", "pos", "members", "slot", "pages", "refs", "pins",
                 "retains", "valid", "generations")

    def __init__(self, eid: int, kind: str, members: list[tuple[int, int]], slot=NO_SLOT):
        self.id = eid
        self.kind = kind
        self.key: int | None = None   # set when registered for lookup
        self.pos = 0                  # tokens covered ([0, pos) prefix)
        self.members = members        # (pool index, page)
        self.slot = slot              # SlotRef or NO_SLOT
        self.pages: tuple[tuple[int, int], ...] = ()   # members + conv slab; set by the table
        self.refs = 0
        self.pins = 0
        self.retains = 0
        self.valid = True
        self.generations: tuple[int, ...] = ()   # of its pages when it was built

    @property
    def held(self) -> bool:
        return self.pins > 0 or self.retains > 0

    def __repr__(self) -> str:
        return (f"Entry({self.id}, {self.kind}, pos={self.pos}, refs={self.refs}, "
                f"pins={self.pins}, retains={self.retains}, valid={self.valid})")


@dataclass
class RequestState:
    """What an organization tracks for one admitted request (private to it)."""

    attn: list[int] = field(default_factory=list)   # page of block i, [i*B, (i+1)*B)
    live: Entry | None = None
    spares: list[Entry] = field(default_factory=list)
    adopted: Entry | None = None
    published: list[Entry] = field(default_factory=list)
    on_path: list[Entry] = field(default_factory=list)   # adopted, or published by another
    retained: list[Entry] = field(default_factory=list)
    reserved_until: int = 0    # grid boundaries <= this have a spare or were published
    at_edge: bool = False      # in place: ``live`` is the state at the block edge ``computed``
    # in place: (position, state) of the states the request went past this step
    # (an edge, the checkpoint it adopted or exported), held past it; after the
    # step they are ``retired``, and its next allocation frees them
    retiring: list[tuple[int, Entry]] = field(default_factory=list)
    retired: list[tuple[int, Entry]] = field(default_factory=list)
    keep: tuple[int, ...] = ()     # in place: the edges whose state is cached (vLLM's retention)
    junction: int = 0              # in place: the shared-prefix junction among them (0: none)
    replay: int = 0                # in place: the replay boundary among them (0: none)
    computed: int = 0


class EntryTable:
    """Entries, their pages and the lookup map they may be registered in."""

    def __init__(self, name: str, pools: list, slabs: SlabTable | None):
        self.name = name
        self.pools = pools
        self.slabs = slabs
        self.entries: dict[int, Entry] = {}
        self.maps: dict[str, dict[int, Entry]] = {CKPT_ENTRY: {}}
        self.blocks = None      # the attention index, which keeps pool 0's block pages
        # vLLM paging: a checkpoint published again for a prefix that has one
        # is cached too (vLLM keeps every block under its hash); lookup finds
        # the oldest, the others wait here in the order they came and the next
        # takes its place when it is reclaimed (`unmap_copy`; attention blocks'
        # copies are the attention index's)
        self.duplicates: dict[str, dict[int, list[Entry]]] = {CKPT_ENTRY: {}}
        self.ids = itertools.count()
        self.invalidations = 0
        self.invalidations_by_kind = {ATTN_ENTRY: 0, CKPT_ENTRY: 0}
        self.watch: list | None = None   # when a list, invalidated entries (and blocks) go here
        # the eviction policy (`harness.orgs.evict_policy`); None: the pool's LRU victim
        self.evict = None

    def take_page(self, pool_idx: int) -> int:
        """An empty page, else the least recently released cached one, or the one
        the eviction policy (``evict``) picks (reclaimed)."""
        pool = self.pools[pool_idx]
        page = pool.take_empty()
        if page is not None:
            return page
        page = pool.lru_victim() if self.evict is None else self.evict.victim(self, pool_idx)
        if page is None:
            raise AssertionError(f"{self.name}: pool {pool.name} exhausted after can_allocate")
        assert pool.is_free(page), f"{self.name}: evicting referenced or held page {page}"
        if pool_idx == 0 and self.blocks.block_id[page] >= 0:
            self.blocks.invalidate(page)
        else:
            for eid in list(pool.dependents[page]):
                self.invalidate(self.entries[eid])
        pool.claim(page)
        return page

    def register(self, e: Entry, slot_pool: int) -> None:
        """Enter ``e`` in the reverse index of its member pages (its slab's entry
        was made when the slot was placed) and remember the pages' generations."""
        self.entries[e.id] = e
        for pool, page in e.members:
            self.pools[pool].dependents[page].add(e.id)
        e.pages = tuple(e.members) + (
            ((slot_pool, e.slot.slab),) if e.slot is not NO_SLOT else ())
        e.generations = tuple(self.pools[pool].generation[page] for pool, page in e.pages)

    def ref(self, e: Entry) -> None:
        assert e.valid, f"{self.name}: referencing invalid {e}"
        e.refs += 1
        for pool, page in e.pages:
            self.pools[pool].incref(page)

    def unref(self, e: Entry) -> None:
        assert e.refs > 0, f"{self.name}: {e} reference count would go negative"
        e.refs -= 1
        for pool, page in e.pages:
            self.pools[pool].decref(page)

    def hold(self, e: Entry) -> None:
        for pool, page in e.pages:
            self.pools[pool].add_hold(page)

    def drop_hold(self, e: Entry) -> None:
        for pool, page in e.pages:
            self.pools[pool].drop_hold(page)

    def add_duplicate(self, e: Entry, key: int) -> None:
        """Cache ``e`` under ``key``, which another entry holds in lookup already."""
        e.key = key
        self.duplicates[e.kind].setdefault(key, []).append(e)

    def pin(self, e: Entry) -> None:
        """A preemption's hold on ``e`` (its pages cannot be reclaimed)."""
        if not e.held:
            self.hold(e)
        e.pins += 1

    def unpin(self, e: Entry) -> None:
        assert e.pins > 0, f"{self.name}: unpin of unpinned {e}"
        e.pins -= 1
        if not e.held:
            self.drop_hold(e)

    def unlink(self, e: Entry) -> None:
        """Remove ``e`` from lookup and the reverse index (it must be unreferenced)."""
        e.valid = False
        if e.key is not None:
            unmap_copy(self.maps[e.kind], self.duplicates[e.kind], e.key, e)
        for pool, page in e.pages:
            self.pools[pool].dependents[page].discard(e.id)
        if e.slot is not NO_SLOT:
            self.slabs.vacate(e.slot, e.id)   # an emptied slab is dissolved
        del self.entries[e.id]

    def invalidate(self, e: Entry) -> None:
        """Invalidate-before-free for a cached entry whose page is being reclaimed."""
        assert e.refs == 0 and not e.held, f"{self.name}: reclaiming a page of live {e}"
        self.unlink(e)
        pools = self.pools
        for pool_idx, page in e.pages:   # `PagePool.forget_content`, inlined
            pool = pools[pool_idx]
            if (pool.ref[page] == 0 and pool.hold[page] == 0 and not pool.dependents[page]
                    and page in pool.lru):
                pool.version += 1
                del pool.lru[page]
                kind = pool.kind[page]
                pool.cached_pages[kind] -= 1
                if kind != EMPTY:
                    pool.kind_pages[kind] -= 1
                pool.kind[page] = EMPTY
                pool.empty[page] = None
        self.invalidations += 1
        self.invalidations_by_kind[e.kind] += 1
        if self.watch is not None:
            self.watch.append(e)

    def drop_owned(self, e: Entry) -> None:
        """Free an object only its owner references (live state, spare, private block)."""
        assert e.refs == 1 and not e.held, f"{self.name}: dropping shared {e}"
        pages = list(e.pages)
        self.unlink(e)
        e.refs = 0
        for pool, page in pages:
            self.pools[pool].decref(page)
