"""The attention index: block keys, the depth walk and block lifetimes.

Every organization keeps attention the same way, only the block size differs
(512 tokens, or 16 for D0): block b of a request covers tokens
[b B, (b + 1) B) and lives in one page of pool 0. A computed full block is
registered under the key of the prefix it ends (`harness.orgs.keys`), so a
later request with the same prefix finds it by walking keys in steps of B.
D0 makes one block per 16 tokens, so the loops here are the hot path and
touch the pool's lists directly instead of going through `EntryTable.ref`.
"""

from __future__ import annotations

from itertools import takewhile
from operator import attrgetter, itemgetter

from harness.orgs.entries import ATTN_ENTRY, Entry, EntryTable
from harness.orgs.keys import KEY_TOKENS, key_at
from harness.orgs.pool import ATTN, EMPTY
from harness.orgs.values import PageRef

# an attention block's page, ``e.members[0][1]``, in C
_MEMBERS, _FIRST, _PAGE = attrgetter("members"), itemgetter(0), itemgetter(1)


class AttentionIndex:
    def __init__(self, table: EntryTable, block_tokens: int, cache_duplicates: bool = False):
        assert block_tokens % KEY_TOKENS == 0, block_tokens
        self.table = table
        # vLLM paging: a block computed again for a registered prefix is cached
        # too (`EntryTable.add_duplicate`); the study keeps it private
        self.cache_duplicates = cache_duplicates
        self.block_tokens = block_tokens
        self.step = block_tokens // KEY_TOKENS   # keys per block
        self.map = table.maps[ATTN_ENTRY]        # prefix key -> registered block
        self.pool = table.pools[0]
        self.registrations = 0                   # blocks ever entered in the map

    # ---- queries ---------------------------------------------------------------
    def depth(self, keys, limit: int) -> int:
        """Tokens of the contiguous registered prefix of ``keys``, at most ``limit``
        (the walk stops at the first key not registered; it runs in C)."""
        step = self.step
        walk = takewhile(self.map.__contains__, keys[step - 1:limit // KEY_TOKENS:step])
        return len(list(walk)) * self.block_tokens

    def free_pages_to_adopt(self, keys, j: int) -> int:
        """Cached pages that adopting the blocks of [0, j) takes out of the free queue.
        A registered block's page has a dependent, so it is free exactly when it
        is in the LRU queue (`PagePool` keeps free pages with content there)."""
        blocks = map(self.map.__getitem__, keys[self.step - 1:j // KEY_TOKENS:self.step])
        pages = map(_PAGE, map(_FIRST, map(_MEMBERS, blocks)))
        return sum(map(self.pool.lru.__contains__, pages))

    @staticmethod
    def block_table(blocks: list[Entry]) -> tuple[PageRef, ...]:
        return tuple(PageRef(0, e.members[0][1]) for e in blocks)

    # ---- actions ---------------------------------------------------------------
    def adopt(self, keys, j: int) -> list[Entry]:
        """Reference the registered blocks of [0, j) (one page each)."""
        pool, attn_map = self.pool, self.map
        ref, hold, lru, cached_pages, kind = pool.ref, pool.hold, pool.lru, pool.cached_pages, \
            pool.kind
        out = [attn_map[k] for k in keys[self.step - 1:j // KEY_TOKENS:self.step]]
        pool.version += len(out)
        for e in out:      # `PagePool.incref`, inlined
            e.refs += 1
            page = e.members[0][1]
            if ref[page] == 0 and hold[page] == 0 and page in lru:
                del lru[page]
                cached_pages[kind[page]] -= 1
            ref[page] += 1
        return out

    def new_blocks(self, n: int) -> list[Entry]:
        """``n`` new private blocks, each referenced once by its owner. A page fresh
        from the empty set or from `EntryTable.take_page` is in no free queue and
        of no kind yet, so the reference is just the count and the kind is set
        directly (`PagePool.take_empty` and `PagePool.set_kind`, inlined).

        With no empty page the least recently released cached page is
        reclaimed; when that page holds one cached attention block (always in
        D0's attention pool), `EntryTable.take_page` is inlined too: the block
        is invalidated (`EntryTable.invalidate`, `PagePool.forget_content`)
        and the page claimed (`PagePool.claim`), with the same counters,
        versions and generations. Anything else goes through the table."""
        table, pool = self.table, self.pool
        ref, hold, gen, deps = pool.ref, pool.hold, pool.generation, pool.dependents
        entries, ids, attn_map = table.entries, table.ids, self.map
        dups = table.duplicates[ATTN_ENTRY]
        empty, kind, kind_pages, lru = pool.empty, pool.kind, pool.kind_pages, pool.lru
        out = []
        append = out.append
        versions = reclaimed = 0
        for _ in range(n):
            if empty:
                versions += 1              # taken
                page = empty.popitem()[0]
                gen[page] += 1
            else:
                page = next(iter(lru), None)
                victim = None
                if page is not None:
                    d = deps[page]
                    if len(d) == 1:
                        (eid,) = d
                        victim = entries[eid]
                        if victim.kind != ATTN_ENTRY:
                            victim = None
                if victim is None:
                    page = table.take_page(0)
                else:
                    assert ref[page] == 0 and hold[page] == 0 and victim.refs == 0 \
                        and not victim.held, f"{table.name}: reclaiming a page of live {victim}"
                    versions += 3          # the empty set tried, the content forgotten, claimed
                    victim.valid = False
                    k = victim.key
                    if k is not None:
                        if attn_map.get(k) is victim and not dups:
                            del attn_map[k]
                        else:
                            table.unmap(victim)
                    d.clear()
                    del entries[eid]
                    del lru[page]
                    old = kind[page]
                    pool.cached_pages[old] -= 1
                    kind_pages[old] -= 1
                    kind[page] = EMPTY
                    reclaimed += 1
                    if table.watch is not None:
                        table.watch.append(victim)
                    gen[page] += 1         # claimed
            versions += 1                  # referenced
            kind[page] = ATTN
            kind_pages[ATTN] += 1
            eid = next(ids)
            e = Entry(eid, ATTN_ENTRY, [(0, page)])
            entries[eid] = e
            deps[page].add(eid)
            e.pages = ((0, page),)
            e.generations = (gen[page],)
            e.refs = 1
            ref[page] += 1
            append(e)
        pool.version += versions
        if reclaimed:
            table.invalidations += reclaimed
            table.invalidations_by_kind[ATTN_ENTRY] += reclaimed
        return out

    def register(self, blocks: list[Entry], keys, first: int, last: int) -> None:
        """Blocks ``first`` .. ``last - 1`` are computed: key each for lookup unless
        an equal prefix is registered already (then it stays private, or is
        cached as a duplicate with ``cache_duplicates``)."""
        attn_map, bt = self.map, self.block_tokens
        for b in range(first, last):
            e = blocks[b]
            if e.key is None:
                k = key_at(keys, (b + 1) * bt)
                e.pos = (b + 1) * bt
                if k not in attn_map:
                    e.key = k
                    attn_map[k] = e
                    self.registrations += 1
                elif self.cache_duplicates:
                    self.table.add_duplicate(e, k)

    def release(self, blocks: list[Entry]) -> None:
        """Drop a finished request's blocks, tail first so LRU evicts a prefix's
        tail first; registered ones stay cached, private ones are freed.

        Each block is one page of pool 0 with no slot, so `PagePool.decref` and
        `EntryTable.drop_owned` are inlined: a registered block whose page
        loses its last reference enters the LRU queue; a private one leaves the
        reverse index and its page, then described by no entry, becomes empty."""
        pool, table = self.pool, self.table
        ref, hold, deps, kind = pool.ref, pool.hold, pool.dependents, pool.kind
        lru, empty, entries = pool.lru, pool.empty, table.entries
        kind_pages, cached_pages = pool.kind_pages, pool.cached_pages
        pool.version += len(blocks)
        for e in reversed(blocks):
            page = e.members[0][1]
            left = ref[page] - 1
            if left < 0:
                raise AssertionError(f"pool {pool.name}: page {page} ref would go negative")
            ref[page] = left
            if e.key is not None:      # registered: the page keeps it as a dependent
                e.refs -= 1
                if left == 0 and hold[page] == 0:
                    lru[page] = None
                    cached_pages[kind[page]] += 1
                continue
            assert e.refs == 1 and not e.held, f"{table.name}: dropping shared {e}"
            e.valid = False
            deps[page].discard(e.id)
            del entries[e.id]
            e.refs = 0
            if left == 0 and hold[page] == 0:
                if deps[page]:
                    lru[page] = None
                    cached_pages[kind[page]] += 1
                else:
                    kind_pages[kind[page]] -= 1
                    kind[page] = EMPTY
                    empty[page] = None
