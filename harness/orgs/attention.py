"""The attention index: block keys, the depth walk and block lifetimes.

Every organization keeps attention the same way, only the block size differs
(512 tokens, or 16 for D0): block b of a request covers tokens
[b B, (b + 1) B) and lives in one page of pool 0. A computed full block is
registered under the key of the prefix it ends (`harness.orgs.keys`), so a
later request with the same prefix finds it by walking keys in steps of B.

A block is one page and nothing else, so the index keeps blocks by page
instead of as `Entry` objects: per page of pool 0 the id of the block it
holds (-1: none), its registered key (None: private) and the page's
generation when the block was built; a request's block list and the lookup
map hold pages. D0 makes one block per 16 tokens (~36,000 in a study-sized
run), so the loops here are the hot path: no block costs an object, and
this is the one module besides the entry table that knows both a pool's
lists and the table's: `adopt`, `new_blocks`, `release` and `invalidate`
perform `PagePool`'s and `EntryTable`'s transitions on their lists directly
(each docstring names the methods it inlines; with the calls instead, D0's
engine time grows by a fifth or more). The page's reverse index
(`PagePool.dependents`) holds the block's id like any entry's, so the pool's
free-queue rules and `EntryTable.take_page` treat a block page as any other.
"""

from __future__ import annotations

from itertools import takewhile
from typing import NamedTuple

from harness.orgs.entries import ATTN_ENTRY, EntryTable, unmap_copy
from harness.orgs.keys import KEY_TOKENS
from harness.orgs.pool import ATTN, EMPTY
from harness.orgs.values import PageRef


class EvictedBlock(NamedTuple):
    """A cached block invalidated to reclaim its page, as an invalidation log
    (`Organization.watch_invalidations`) reports it: the kind and the prefix
    key of what was lost, as an invalidated `Entry` reports them."""

    kind: str
    key: int


class AttentionIndex:
    def __init__(self, table: EntryTable, block_tokens: int, cache_duplicates: bool = False):
        assert block_tokens % KEY_TOKENS == 0, block_tokens
        self.table = table
        # vLLM paging: a block computed again for a registered prefix is cached
        # too (vLLM keeps every block under its hash): prefix key -> the pages of
        # such copies, oldest first, each taking over when the one before goes
        # (`unmap_copy`); the study keeps such a block private
        self.cache_duplicates = cache_duplicates
        self.duplicates: dict[int, list[int]] = {}
        self.block_tokens = block_tokens
        self.step = block_tokens // KEY_TOKENS   # keys per block
        self.map: dict[int, int] = {}            # prefix key -> page of the registered block
        self.pool = table.pools[0]
        n = len(self.pool.ref)                   # page ids (an elastic pool's, all of them)
        self.block_id = [-1] * n                 # per page: the id of its block, -1: none
        self.key: list[int | None] = [None] * n  # per page: its block's key, None: private
        self.built = [0] * n                     # per page: its generation when the block was built
        self.registrations = 0                   # blocks ever entered in the map
        self.own_pool = len(table.pools) > 1     # pool 0 holds blocks only (D0's dual pools)
        table.blocks = self

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
        pages = map(self.map.__getitem__, keys[self.step - 1:j // KEY_TOKENS:self.step])
        return sum(map(self.pool.lru.__contains__, pages))

    @staticmethod
    def block_table(blocks: list[int]) -> tuple[PageRef, ...]:
        return tuple(PageRef(0, page) for page in blocks)

    # ---- actions ---------------------------------------------------------------
    def adopt(self, keys, j: int) -> list[int]:
        """Reference the registered blocks of [0, j) (`PagePool.incref` of each page,
        inlined). A registered block's page is a dependent's, so it is in the
        LRU queue exactly when unreferenced and not held (only a preemption's
        joint pin holds a block, under vLLM paging)."""
        pool = self.pool
        ref, hold, lru = pool.ref, pool.hold, pool.lru
        out = [self.map[k] for k in keys[self.step - 1:j // KEY_TOKENS:self.step]]
        pool.version += len(out)
        cached = 0
        for page in out:
            if not ref[page] and not hold[page]:
                del lru[page]
                cached += 1
            ref[page] += 1
        pool.cached_pages[ATTN] -= cached
        return out

    def new_blocks(self, n: int) -> list[int]:
        """The pages of ``n`` new private blocks, each referenced once by its owner.
        A page fresh from the empty set or from `EntryTable.take_page` is in no
        free queue, of no kind and unreferenced, so the reference is just the
        count and the kind is set directly (`PagePool.take_empty` and
        `PagePool.set_kind`, inlined); each block takes an entry id, as every
        object does.

        With no empty page the least recently released cached page is
        reclaimed; when that page holds a cached block (always in a pool of
        blocks only, D0's attention pool: there the front of the LRU queue is
        taken without a look), `EntryTable.take_page` is inlined too: the block is
        invalidated (`invalidate`: a cached block is registered, and its key
        finds it) and the page claimed (`PagePool.claim`), with the same
        counters, versions and generations. Anything else goes through the
        table."""
        table, pool = self.table, self.pool
        ref, hold, gen, deps, lru, empty, kind = pool.ref, pool.hold, pool.generation, \
            pool.dependents, pool.lru, pool.empty, pool.kind
        block_id, key, built, attn_map, ids = self.block_id, self.key, self.built, self.map, \
            table.ids
        watch, dups = table.watch, self.duplicates
        own_pool = self.own_pool
        pop_front = lru.popitem
        out = []
        append = out.append
        versions = reclaimed = 0
        for _ in range(n):
            if empty:
                versions += 2              # taken, referenced
                page = empty.popitem()[0]
                g = gen[page] = gen[page] + 1
                kind[page] = ATTN
                deps[page].add(eid := next(ids))
            elif lru and (own_pool or block_id[next(iter(lru))] >= 0):   # a cached block's page
                page = pop_front(False)[0]
                assert ref[page] == 0 and hold[page] == 0, \
                    f"{table.name}: reclaiming the page of live block {page}"
                # the empty set tried, the content forgotten, claimed, referenced
                versions += 4
                k = key[page]
                if dups:                   # vLLM paging: it may be a copy, or have one
                    unmap_copy(attn_map, dups, k, page)
                else:
                    del attn_map[k]
                key[page] = None
                reclaimed += 1
                if watch is not None:
                    watch.append(EvictedBlock(ATTN_ENTRY, k))
                g = gen[page] = gen[page] + 1   # claimed; still a block's page (kind)
                d = deps[page]
                d.clear()                  # the old block's id, its only dependent
                d.add(eid := next(ids))
            else:
                versions += 1              # referenced
                page = table.take_page(0)
                g = gen[page]
                kind[page] = ATTN
                deps[page].add(eid := next(ids))
            built[page] = g
            block_id[page] = eid
            ref[page] = 1
            append(page)
        pool.version += versions
        pool.kind_pages[ATTN] += n - reclaimed   # a reclaimed page held a block already
        if reclaimed:
            pool.cached_pages[ATTN] -= reclaimed
            table.invalidations += reclaimed
            table.invalidations_by_kind[ATTN_ENTRY] += reclaimed
        return out

    def register(self, blocks: list[int], keys, first: int, last: int) -> None:
        """Blocks ``first`` .. ``last - 1`` are computed: key each for lookup unless
        an equal prefix is registered already (then it stays private, or is
        cached as a copy with ``cache_duplicates``)."""
        attn_map, key, step = self.map, self.key, self.step
        for page, k in zip(blocks[first:last], keys[(first + 1) * step - 1:last * step:step],
                           strict=True):
            if key[page] is None:
                if k not in attn_map:
                    key[page] = k
                    attn_map[k] = page
                    self.registrations += 1
                elif self.cache_duplicates:
                    key[page] = k
                    self.duplicates.setdefault(k, []).append(page)

    def release(self, blocks: list[int]) -> None:
        """Drop a finished request's blocks, tail first so LRU evicts a prefix's
        tail first; registered ones stay cached, private ones are freed.

        `PagePool.decref` and `EntryTable.drop_owned` inlined: a registered
        block's page that loses its last reference enters the LRU queue; a
        private block (its owner's only) leaves the reverse index and its page,
        then described by nothing, becomes empty. Only a registered block can
        be held (a preemption's joint pin under vLLM paging): its page enters
        the queue when the hold is dropped (`PagePool.drop_hold`)."""
        pool = self.pool
        ref, hold, deps, kind, lru, empty = pool.ref, pool.hold, pool.dependents, pool.kind, \
            pool.lru, pool.empty
        key, block_id = self.key, self.block_id
        cached = freed = 0
        pool.version += len(blocks)
        for page in reversed(blocks):
            left = ref[page] - 1
            ref[page] = left
            if key[page] is not None:      # registered: the page keeps it as a dependent
                if not left:
                    if not hold[page]:
                        lru[page] = None
                        cached += 1
                elif left < 0:
                    raise AssertionError(f"pool {pool.name}: page {page} ref would go negative")
                continue
            assert left == 0, f"{self.table.name}: dropping the shared block at page {page}"
            deps[page].clear()             # the block's id, its only dependent
            block_id[page] = -1
            kind[page] = EMPTY
            empty[page] = None
            freed += 1
        pool.cached_pages[ATTN] += cached
        pool.kind_pages[ATTN] -= freed

    def invalidate(self, page: int) -> None:
        """`EntryTable.invalidate` for the cached block at ``page``: out of the
        lookup map and the reverse index, then the page, free and described by
        nothing, becomes empty (`PagePool.forget_content`, inlined)."""
        pool, table = self.pool, self.table
        assert pool.ref[page] == 0 and pool.hold[page] == 0, \
            f"{table.name}: reclaiming the page of live block {page}"
        k = self.key[page]
        if k is not None:
            unmap_copy(self.map, self.duplicates, k, page)
        self.key[page] = None
        pool.dependents[page].discard(self.block_id[page])
        self.block_id[page] = -1
        if not pool.dependents[page] and page in pool.lru:
            pool.version += 1
            del pool.lru[page]
            pool.cached_pages[ATTN] -= 1
            pool.kind_pages[ATTN] -= 1
            pool.kind[page] = EMPTY
            pool.empty[page] = None
        table.invalidations += 1
        table.invalidations_by_kind[ATTN_ENTRY] += 1
        if table.watch is not None:
            table.watch.append(EvictedBlock(ATTN_ENTRY, k))
