"""The organization protocol and the machinery all four organizations share.

A scheduler talks to an organization in request ids and token positions only;
it never sees a page. Per step it asks, then acts:

    hit = org.lookup(keys, max_tokens)              # pure: J_adopt, R_max, attention depth
    d   = org.demand(rid, end, prefill_until, keys, hit)   # pure: pages per pool
    if org.can_allocate(d, headroom):               # pure
        org.allocate(rid, end, prefill_until, keys, hit)   # adopts on first call
    ... the engine computes tokens ...
    org.commit(rid, keys, computed, prefill_until)  # registers blocks, publishes checkpoints
    org.finish(rid) | org.preempt(rid) | org.abandon(rid)

Logical objects are `Entry`s: an attention block (one page of the attention
pool) or a checkpoint (SSM + conv state at one token position, laid out as
the organization lays out checkpoints). A running request owns one *live*
checkpoint-sized object; when its computed tokens reach a grid boundary
during prefill, the live object becomes the published checkpoint for that
prefix and a spare reserved in `allocate` becomes the new live object.

Holds. ``Entry.refs`` are execution references (owner, adopters) and are
mirrored as member-level page reference counts. ``pins`` (a preempted
request's checkpoint, a correctness requirement) and ``retains`` (a policy)
are separate counters; while either is non-zero the entry puts one *hold* on
each member page. A page is reclaimable only with zero references and zero
holds, and reclaiming follows invalidate-before-free: freeze the dependent
entries, remove them from lookup, clear their reverse links, then hand the
page out.
"""

from __future__ import annotations

import itertools

from harness.layout import OrgLayout
from harness.orgs import audit
from harness.orgs.keys import KEY_TOKENS, key_at
from harness.orgs.pool import ATTN, CONV, SSM, PagePool
from harness.orgs.slabs import NO_SLOT, SlabTable
from harness.orgs.values import (
    ATTN_ENTRY,
    CKPT_ENTRY,
    Demand,
    Entry,
    PrefixHit,
    RequestState,
    Usage,
)


class Organization:
    """Shared machinery; subclasses choose the layout of checkpoints and pools."""

    name = "base"

    def __init__(self, layout: OrgLayout, pool_pages: tuple[int, ...]):
        self.layout = layout
        self.B = layout.attn_block_tokens
        self.grid = layout.grid_tokens
        assert self.B % KEY_TOKENS == 0 and self.grid % self.B == 0, (self.B, self.grid)
        if layout.dual_pool:
            self.pools = [PagePool("attention", pool_pages[0], layout.attn_page_bytes),
                          PagePool("checkpoint", pool_pages[1], layout.ckpt_page_bytes)]
            self.ckpt_pool = 1
        else:
            self.pools = [PagePool("shared", pool_pages[0], layout.attn_page_bytes)]
            self.ckpt_pool = 0
        self.slabs = SlabTable(layout.slab_slots) if layout.conv_slots else None
        self.entries: dict[int, Entry] = {}
        self.attn_map: dict[int, Entry] = {}
        self.ckpt_map: dict[int, Entry] = {}
        self.reqs: dict[object, RequestState] = {}
        self.pinned: dict[object, Entry] = {}
        self._ids = itertools.count()
        self.invalidations = 0
        self.invalidations_by_kind = {ATTN_ENTRY: 0, CKPT_ENTRY: 0}   # entries, by Entry.kind
        self.published_count = 0
        self._headroom: dict[float, tuple[int, ...]] = {}

    # ================= queries: change nothing =================================
    def lookup(self, keys, max_tokens: int) -> PrefixHit:
        """Deepest reusable prefix of ``keys`` no longer than ``max_tokens``."""
        limit = min(max_tokens, len(keys) * KEY_TOKENS)
        step = self.B // KEY_TOKENS
        blocks = 0
        attn_map = self.attn_map
        for k in keys[step - 1:limit // KEY_TOKENS:step]:
            if k not in attn_map:
                break
            blocks += 1
        depth = blocks * self.B
        j_adopt = r_max = 0
        for j in range(limit - limit % self.grid, 0, -self.grid):
            if key_at(keys, j) in self.ckpt_map:
                if not r_max:
                    r_max = j
                if j <= depth:
                    j_adopt = j
                    break
        pages, slabs = self._adoption_cost(keys, j_adopt)
        return PrefixHit(j_adopt=j_adopt, r_max=r_max, attn_depth=depth,
                         version=self.version(), adopt_pages=pages, adopt_slabs=slabs)

    def version(self) -> int:
        """Changes whenever any page changes state (pools count their transitions)."""
        return sum(p.version for p in self.pools)

    def _adoption_cost(self, keys, j: int) -> tuple[tuple[int, ...], frozenset]:
        """Free (cached) pages per pool that adopting the prefix [0, j) takes out of
        the free queues, and the cached slabs it would make referenced."""
        pages = [0] * len(self.pools)
        slabs: set[int] = set()
        if j > 0:
            step = self.B // KEY_TOKENS
            attn_pool = self.pools[0]
            ref, hold, attn_map = attn_pool.ref, attn_pool.hold, self.attn_map
            for k in keys[step - 1:j // KEY_TOKENS:step]:
                page = attn_map[k].members[0][1]
                if ref[page] == 0 and hold[page] == 0:
                    pages[0] += 1
            ck = self.ckpt_map[key_at(keys, j)]
            cpool = self.pools[self.ckpt_pool]
            for _, page in ck.members:
                if cpool.is_free(page):
                    pages[self.ckpt_pool] += 1
            if ck.slot is not NO_SLOT and cpool.is_free(ck.slot.slab):
                pages[self.ckpt_pool] += 1
                slabs.add(ck.slot.slab)
        return tuple(pages), frozenset(slabs)

    def _new_objects(self, st: RequestState | None, start: int, end: int,
                     prefill_until: int) -> tuple[int, int]:
        """(attention blocks, checkpoint objects) needed to cover tokens up to ``end``."""
        if st is None:
            have_blocks, reserved, live = start // self.B, start, 1   # + the live state
        else:
            have_blocks, reserved, live = len(st.attn), st.reserved_until, 0
        blocks = -(-end // self.B) - have_blocks
        last = end if end < prefill_until else prefill_until
        ckpts = last // self.grid - reserved // self.grid
        return (blocks if blocks > 0 else 0), (ckpts if ckpts > 0 else 0) + live

    def demand(self, rid, end: int, prefill_until: int, keys=None,
               hit: PrefixHit | None = None) -> Demand:
        """Pages per pool that ``allocate`` with the same arguments would take."""
        st = self.reqs.get(rid)
        adopt_pages: tuple[int, ...] = (0,) * len(self.pools)
        adopted_slabs: frozenset = frozenset()
        start = 0
        if st is None and hit is not None and hit.j_adopt:
            start = hit.j_adopt
            if hit.version == self.version():
                adopt_pages, adopted_slabs = hit.adopt_pages, hit.adopt_slabs
            else:
                adopt_pages, adopted_slabs = self._adoption_cost(keys, start)
        blocks, ckpts = self._new_objects(st, start, end, prefill_until)
        pages = list(adopt_pages)
        pages[0] += blocks
        pages[self.ckpt_pool] += ckpts * self.layout.ckpt_pages
        if self.slabs is not None:
            pages[self.ckpt_pool] += self._slot_pages(ckpts, adopted_slabs)
        return Demand(tuple(pages))

    def _slot_pages(self, n: int, also_referenced: set[int]) -> int:
        """Pages that placing ``n`` conv slots costs, following `SlabTable.choose`."""
        if n == 0:
            return 0
        pool = self.pools[self.ckpt_pool]
        ref_room, cached_rooms = 0, []
        for slab in self.slabs.occupants:
            room = self.slabs.free_slots(slab)
            if not pool.is_free(slab) or slab in also_referenced:
                ref_room += room
            elif room:
                cached_rooms.append(room)
        rem = n - ref_room
        pages = 0
        for room in sorted(cached_rooms, reverse=True):
            if rem <= 0:
                break
            rem -= room
            pages += 1
        if rem > 0:
            pages += -(-rem // self.slabs.slots)
        return pages

    def headroom_pages(self, fraction: float) -> tuple[int, ...]:
        """H = floor(f x B) per pool (pool sizes are fixed, so this is memoized)."""
        h = self._headroom.get(fraction)
        if h is None:
            h = self._headroom[fraction] = tuple(int(fraction * p.num_pages) for p in self.pools)
        return h

    def can_allocate(self, demand: Demand, headroom: float = 0.0) -> bool:
        """True iff every pool keeps at least floor(headroom x pages) free afterwards."""
        return all(p.available - d >= h for p, d, h in
                   zip(self.pools, demand.pages, self.headroom_pages(headroom), strict=True))

    def is_admitted(self, rid) -> bool:
        return rid in self.reqs

    def _adoptable(self, keys, j: int) -> list[Entry]:
        if j <= 0:
            return []
        step = self.B // KEY_TOKENS
        attn_map = self.attn_map
        out = [attn_map[k] for k in keys[step - 1:j // KEY_TOKENS:step]]
        out.append(self.ckpt_map[key_at(keys, j)])
        return out

    # ================= actions ==================================================
    def allocate(self, rid, end: int, prefill_until: int, keys=None,
                 hit: PrefixHit | None = None) -> bool:
        """Make room for tokens up to ``end``; False (nothing changed) if it does not fit.

        On the first call for ``rid`` the request adopts ``hit.j_adopt`` tokens of
        cached attention and the checkpoint at J, gets its live state, and any pin
        from an earlier preemption is released. Grid boundaries up to
        ``min(end, prefill_until)`` get a spare checkpoint object for publication.
        """
        st = self.reqs.get(rid)
        if st is not None and self._new_objects(st, 0, end, prefill_until) == (0, 0):
            return True        # room already reserved (most decode steps)
        if not self.can_allocate(self.demand(rid, end, prefill_until, keys, hit)):
            return False
        if st is None:
            st = self.reqs[rid] = RequestState()
            j = hit.j_adopt if hit else 0
            adopted = self._adoptable(keys, j)
            attn_pool = self.pools[0]
            for e in adopted[:-1]:        # attention blocks: one page each
                e.refs += 1
                attn_pool.incref(e.members[0][1])
            if adopted:
                self._ref(adopted[-1])    # the checkpoint: all its members
            if adopted:
                st.attn = adopted[:-1]
                st.adopted = adopted[-1]
                st.on_path.append(adopted[-1])
            st.computed = st.reserved_until = j
            st.live = self._new_ckpt()
            self._ref(st.live)
            old_pin = self.pinned.pop(rid, None)
            if old_pin is not None:
                self._unpin(old_pin)
        n_blocks = -(-end // self.B) - len(st.attn)
        if n_blocks > 0:
            st.attn.extend(self._new_attn_referenced(n_blocks))
        last = min(end, prefill_until)
        while (st.reserved_until // self.grid + 1) * self.grid <= last:
            e = self._new_ckpt()
            self._ref(e)
            st.spares.append(e)
            st.reserved_until = (st.reserved_until // self.grid + 1) * self.grid
        return True

    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]:
        """Tokens up to ``computed`` are done: register full attention blocks and
        publish checkpoints at grid boundaries reached during prefill. Returns the
        positions of newly published checkpoints."""
        st = self.reqs[rid]
        assert computed <= len(st.attn) * self.B, (computed, len(st.attn), self.B)
        for b in range(st.computed // self.B, computed // self.B):
            e = st.attn[b]
            if e.key is None:
                k = key_at(keys, (b + 1) * self.B)
                e.pos = (b + 1) * self.B
                if k not in self.attn_map:
                    e.key = k
                    self.attn_map[k] = e
        published = []
        last = min(computed, prefill_until)
        j = (st.computed // self.grid + 1) * self.grid
        while j <= last:
            spare = st.spares.pop(0)
            k = key_at(keys, j)
            if k in self.ckpt_map:
                self._drop_owned(spare)   # someone published this prefix already
                st.on_path.append(self.ckpt_map[k])
            else:
                ck = st.live
                ck.key, ck.pos = k, j
                self.ckpt_map[k] = ck
                st.published.append(ck)
                self._unref(ck)
                st.live = spare
                published.append(j)
                self.published_count += 1
            j += self.grid
        if st.adopted is not None and computed > st.computed:
            self._unref(st.adopted)   # consumed into the live state
            st.adopted = None
        st.computed = max(st.computed, computed)
        return published

    def retain(self, rid, position: int, keys) -> bool:
        """Policy hold on the request's published checkpoint at ``position``."""
        st = self.reqs[rid]
        e = self.ckpt_map.get(key_at(keys, position))
        if e is None or e in st.retained:
            return False
        if not e.held:
            self._hold(e)
        e.retains += 1
        st.retained.append(e)
        return True

    def finish(self, rid) -> None:
        """Release everything the request holds; its registered blocks stay cached."""
        st = self.reqs.pop(rid)
        for e in st.retained:
            self._unretain(e)
        if st.adopted is not None:
            self._unref(st.adopted)
        attn_pool = self.pools[0]
        for e in reversed(st.attn):   # tail first, so LRU evicts a prefix's tail first
            if e.key is not None:
                e.refs -= 1               # attention blocks have one page: _unref inlined
                attn_pool.decref(e.members[0][1])
            else:
                self._drop_owned(e)
        for e in [st.live, *st.spares]:
            if e is not None:
                self._drop_owned(e)

    def preempt(self, rid) -> None:
        """Recompute-style preemption: release, pinning the deepest valid checkpoint
        on the request's own path, whether it published it, adopted it, or found
        it already published at one of its boundaries."""
        st = self.reqs[rid]
        latest = None
        for e in [*st.published, *st.on_path]:
            if e is not None and e.valid and (latest is None or e.pos > latest.pos):
                latest = e
        if latest is not None:
            if not latest.held:
                self._hold(latest)
            latest.pins += 1
        self.finish(rid)
        if latest is not None:
            self.pinned[rid] = latest

    def abandon(self, rid) -> None:
        """Cancel: release what the request holds and any pin it left behind."""
        if rid in self.reqs:
            self.finish(rid)
        pin = self.pinned.pop(rid, None)
        if pin is not None:
            self._unpin(pin)

    # ================= entry and page plumbing ==================================
    def _take_page(self, pool_idx: int) -> int:
        pool = self.pools[pool_idx]
        page = pool.take_empty()
        if page is not None:
            return page
        page = pool.lru_victim()
        if page is None:
            raise AssertionError(f"{self.name}: pool {pool.name} exhausted after can_allocate")
        self._evict(pool_idx, page)
        pool.claim(page)
        return page

    def _evict(self, pool_idx: int, page: int) -> None:
        """Invalidate everything stored in a cached page (and, through the reverse
        index, only that); afterwards the page holds nothing."""
        pool = self.pools[pool_idx]
        assert pool.is_free(page), f"{self.name}: evicting referenced or held page {page}"
        for eid in list(pool.dependents[page]):
            self._invalidate(self.entries[eid])

    def _register_members(self, e: Entry) -> None:
        self.entries[e.id] = e
        for pool, page in e.members:
            self.pools[pool].dependents[page].add(e.id)
        e.pages = tuple(e.members) + (
            ((self.ckpt_pool, e.slot.slab),) if e.slot is not NO_SLOT else ())
        e.generations = tuple(self.pools[pool].generation[page] for pool, page in e.pages)

    def _new_attn_referenced(self, n: int) -> list[Entry]:
        """``n`` new attention blocks, each referenced once by its owner: the same
        as `_new_attn` + `_ref`, inlined because D0 makes one per 16 tokens. A
        page fresh from `_take_page` is in no free queue, so taking the reference
        is just the count."""
        pool = self.pools[0]
        ref, gen, deps, entries = pool.ref, pool.generation, pool.dependents, self.entries
        out = []
        for _ in range(n):
            page = self._take_page(0)
            pool.set_kind(page, ATTN)
            e = Entry(next(self._ids), ATTN_ENTRY, [(0, page)])
            entries[e.id] = e
            deps[page].add(e.id)
            e.pages = ((0, page),)
            e.generations = (gen[page],)
            e.refs = 1
            ref[page] += 1
            pool.version += 1
            out.append(e)
        return out

    def _new_attn(self) -> Entry:
        """An attention block on one page (the hot path: D0 makes one per 16 tokens)."""
        pool = self.pools[0]
        page = self._take_page(0)
        pool.set_kind(page, ATTN)
        e = Entry(next(self._ids), ATTN_ENTRY, [(0, page)])
        self.entries[e.id] = e
        pool.dependents[page].add(e.id)
        e.pages = ((0, page),)
        e.generations = (pool.generation[page],)
        return e

    def _new_ckpt(self) -> Entry:
        lay, cp = self.layout, self.ckpt_pool
        pool = self.pools[cp]
        eid = next(self._ids)
        slot = NO_SLOT
        if self.slabs is not None:     # place the slot first: a chosen cached slab
            slab = self.slabs.choose(lambda p: not pool.is_free(p))   # is then referenced
            if slab is None:
                slab = self._take_page(cp)
                pool.set_kind(slab, CONV)
                self.slabs.open(slab)
            slot = self.slabs.place(slab, eid)
            pool.dependents[slab].add(eid)
        members = []
        for i in range(lay.ckpt_pages):
            page = self._take_page(cp)
            pool.set_kind(page, SSM if i < lay.ssm_pages else CONV)
            members.append((cp, page))
        e = Entry(eid, CKPT_ENTRY, members, slot)
        self._register_members(e)
        return e

    def _ref(self, e: Entry) -> None:
        assert e.valid, f"{self.name}: referencing invalid {e}"
        e.refs += 1
        for pool, page in e.pages:
            self.pools[pool].incref(page)

    def _unref(self, e: Entry) -> None:
        assert e.refs > 0, f"{self.name}: {e} reference count would go negative"
        e.refs -= 1
        for pool, page in e.pages:
            self.pools[pool].decref(page)

    def _hold(self, e: Entry) -> None:
        for pool, page in e.pages:
            self.pools[pool].add_hold(page)

    def _drop_hold(self, e: Entry) -> None:
        for pool, page in e.pages:
            self.pools[pool].drop_hold(page)

    def _unpin(self, e: Entry) -> None:
        assert e.pins > 0, f"{self.name}: unpin of unpinned {e}"
        e.pins -= 1
        if not e.held:
            self._drop_hold(e)

    def _unretain(self, e: Entry) -> None:
        assert e.retains > 0, f"{self.name}: unretain of unretained {e}"
        e.retains -= 1
        if not e.held:
            self._drop_hold(e)

    def _unlink(self, e: Entry) -> None:
        """Remove ``e`` from lookup and the reverse index (it must be unreferenced)."""
        e.valid = False
        if e.key is not None:
            m = self.attn_map if e.kind == ATTN_ENTRY else self.ckpt_map
            if m.get(e.key) is e:
                del m[e.key]
        for pool, page in e.pages:
            self.pools[pool].dependents[page].discard(e.id)
        if e.slot is not NO_SLOT:
            self.slabs.vacate(e.slot, e.id)   # an emptied slab is dissolved
        del self.entries[e.id]

    def _invalidate(self, e: Entry) -> None:
        """Invalidate-before-free for a cached entry whose page is being reclaimed."""
        assert e.refs == 0 and not e.held, f"{self.name}: reclaiming a page of live {e}"
        self._unlink(e)
        for pool, page in e.pages:
            self.pools[pool].forget_content(page)
        self.invalidations += 1
        self.invalidations_by_kind[e.kind] += 1

    def _drop_owned(self, e: Entry) -> None:
        """Free an object only its owner references (live state, spare, private block)."""
        assert e.refs == 1 and not e.held, f"{self.name}: dropping shared {e}"
        pages = list(e.pages)
        self._unlink(e)
        e.refs = 0
        for pool, page in pages:
            self.pools[pool].decref(page)

    # ================= invariants and usage (harness/orgs/audit.py) =============
    def check_invariants(self) -> None:
        """Raise AssertionError with the broken values if any invariant fails."""
        audit.check_invariants(self)

    def usage(self) -> Usage:
        """Blocks and bytes by state kind and state, waste, slab occupancy."""
        return audit.usage(self)

    def holds_no_references(self) -> bool:
        """True when no request is admitted and no page has an execution reference
        (pages are free or cached; pins of preempted requests may remain)."""
        return not self.reqs and all(r == 0 for p in self.pools for r in p.ref)
