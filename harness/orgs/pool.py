"""One physical pool of equal-sized pages: reference counts, holds, the free
queue and the reverse index.

A page is in exactly one of three states:

    empty       no content; handed out first
    cached      content that some logical entry still describes, no
                reference and no hold: reusable on a lookup hit, evictable
                in LRU order (``lru``: front = least recently released)
    referenced  ref > 0 (execution references: a running request owns or
                adopted it) or hold > 0 (a pinned or retained entry uses it)

Nothing outside `harness.orgs` touches a pool (engines read it through the
organization's views). Inside, the entry table (`harness.orgs.entries`) keeps
``dependents`` (the reverse index page -> entry ids) in step with each
entry's pages, so reclaiming a cached page costs what depends on it, never a
scan of the cache. The transitions are the methods below; the hot loops that
make and drop objects (`AttentionIndex.new_blocks`, ``adopt``, ``release``
and ``invalidate``, `CheckpointStore.new`, `EntryTable.invalidate`) perform
the same transitions on the lists directly, with the same counters and
versions, and each names the methods it inlines (calling them instead costs
D0, which makes one attention block per 16 tokens, 20 % or more of its
engine time). `check` and `harness.orgs.audit.check_invariants` recount
everything those loops keep.
"""

from __future__ import annotations

from collections import OrderedDict

# What a page holds, for usage figures by state kind.
EMPTY, ATTN, SSM, CONV = "empty", "attention", "ssm", "conv"
KINDS = (ATTN, SSM, CONV)


class PagePool:
    def __init__(self, name: str, num_pages: int, page_bytes: int):
        if num_pages < 0:
            raise ValueError(f"pool {name}: negative page count {num_pages}")
        self.name = name
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.ref = [0] * num_pages
        self.hold = [0] * num_pages
        self.kind = [EMPTY] * num_pages
        # bumped each time a page is handed out: an entry remembers the generation
        # of its pages, so storage reassigned under it is detectable
        self.generation = [0] * num_pages
        self.version = 0   # counts state transitions, so cached answers can be checked
        self.dependents: list[set[int]] = [set() for _ in range(num_pages)]
        # empty pages (insertion-ordered set), popped from the end: page 0 goes first
        self.empty: dict[int, None] = dict.fromkeys(range(num_pages - 1, -1, -1))
        self.lru: OrderedDict[int, None] = OrderedDict()
        # page ids that are not part of the pool's capacity now (an elastic
        # pool's, `harness.orgs.region.ElasticPool`; a fixed pool has none):
        # free, of no kind, in neither free list
        self.outside: dict[int, None] = {}
        self.kind_pages = dict.fromkeys(KINDS, 0)    # pages with content, by kind
        self.cached_pages = dict.fromkeys(KINDS, 0)  # of those, in the LRU queue

    # ---- queries (change nothing) -------------------------------------------
    @property
    def available(self) -> int:
        """Pages an allocation could take now: empty plus evictable cached."""
        return len(self.empty) + len(self.lru)

    def is_free(self, page: int) -> bool:
        return self.ref[page] == 0 and self.hold[page] == 0

    # ---- transitions ---------------------------------------------------------
    def take_empty(self) -> int | None:
        self.version += 1
        if not self.empty:
            return None
        page = self.empty.popitem()[0]
        self.generation[page] += 1
        return page

    def lru_victim(self) -> int | None:
        """The least recently released cached page (not removed)."""
        return next(iter(self.lru), None)

    def set_kind(self, page: int, kind: str) -> None:
        old = self.kind[page]
        if old != EMPTY:
            self.kind_pages[old] -= 1
        if kind != EMPTY:
            self.kind_pages[kind] += 1
        self.kind[page] = kind

    def _leave_free(self, page: int) -> None:
        if page in self.lru:
            del self.lru[page]
            self.cached_pages[self.kind[page]] -= 1

    def _maybe_enter_free(self, page: int) -> None:
        if self.ref[page] == 0 and self.hold[page] == 0:
            if self.dependents[page]:
                self.lru[page] = None
                self.cached_pages[self.kind[page]] += 1
            else:
                self.set_kind(page, EMPTY)
                self.empty[page] = None

    def incref(self, page: int) -> None:
        self.version += 1
        if self.is_free(page):
            self._leave_free(page)
        self.ref[page] += 1

    def decref(self, page: int) -> None:
        self.version += 1
        if self.ref[page] <= 0:
            raise AssertionError(f"pool {self.name}: page {page} ref would go negative")
        self.ref[page] -= 1
        self._maybe_enter_free(page)

    def add_hold(self, page: int) -> None:
        self.version += 1
        if self.is_free(page):
            self._leave_free(page)
        self.hold[page] += 1

    def drop_hold(self, page: int) -> None:
        self.version += 1
        if self.hold[page] <= 0:
            raise AssertionError(f"pool {self.name}: page {page} hold would go negative")
        self.hold[page] -= 1
        self._maybe_enter_free(page)

    def claim(self, page: int) -> None:
        """Hand out a reclaimed page: its dependents are already invalidated, so it
        sits in the LRU queue or (if invalidation emptied it) in the empty set."""
        self.version += 1
        assert not self.dependents[page], f"page {page} still has dependents"
        assert self.is_free(page), f"page {page} ref={self.ref[page]} hold={self.hold[page]}"
        self._leave_free(page)
        self.empty.pop(page, None)
        self.set_kind(page, EMPTY)
        self.generation[page] += 1

    def forget_content(self, page: int) -> None:
        """The last dependent of a free page is gone: move it from cached to empty."""
        if self.is_free(page) and not self.dependents[page] and page in self.lru:
            self.version += 1
            self._leave_free(page)
            self.set_kind(page, EMPTY)
            self.empty[page] = None

    def check(self) -> None:
        """Pool-local invariants; the organization checks the cross-links."""
        n = len(self.ref)   # the page ids; `outside` ones are not in the pool now
        empty = set(self.empty)
        lru = set(self.lru)
        assert not (empty & lru), f"pool {self.name}: pages both empty and cached: {empty & lru}"
        assert not (set(self.outside) & (empty | lru)), (
            f"pool {self.name}: pages outside the pool yet free in it: "
            f"{set(self.outside) & (empty | lru)}")
        assert n - len(self.outside) == self.num_pages, (
            f"pool {self.name}: {n} ids - {len(self.outside)} outside != {self.num_pages} pages")
        for p in range(n):
            assert self.ref[p] >= 0 and self.hold[p] >= 0, (
                f"pool {self.name}: page {p} ref={self.ref[p]} hold={self.hold[p]}")
            free = self.ref[p] == 0 and self.hold[p] == 0
            if p in empty:
                assert free and not self.dependents[p] and self.kind[p] == EMPTY, (
                    f"pool {self.name}: empty page {p} ref={self.ref[p]} hold={self.hold[p]} "
                    f"deps={self.dependents[p]} kind={self.kind[p]}")
            elif p in lru:
                assert free and self.dependents[p], (
                    f"pool {self.name}: cached page {p} ref={self.ref[p]} hold={self.hold[p]} "
                    f"deps={self.dependents[p]}")
            elif p in self.outside:
                assert free and not self.dependents[p] and self.kind[p] == EMPTY, (
                    f"pool {self.name}: page {p} outside the pool ref={self.ref[p]} "
                    f"hold={self.hold[p]} deps={self.dependents[p]} kind={self.kind[p]}")
            else:
                assert not free, f"pool {self.name}: page {p} is free but in no free list"
        counts = dict.fromkeys(KINDS, 0)
        cached = dict.fromkeys(KINDS, 0)
        for p in range(n):
            if self.kind[p] != EMPTY:
                counts[self.kind[p]] += 1
                if p in lru:
                    cached[self.kind[p]] += 1
        assert counts == self.kind_pages, f"pool {self.name}: kind counts {self.kind_pages} != {counts}"
        assert cached == self.cached_pages, (
            f"pool {self.name}: cached counts {self.cached_pages} != {cached}")


def pools_for(layout, pool_pages: tuple[int, ...]) -> list[PagePool]:
    """The pools ``layout`` (an `OrgLayout`) lays its pages out in: one shared
    pool, or (``dual_pool``) an attention pool and a checkpoint pool, with
    ``pool_pages`` pages each."""
    if layout.dual_pool:
        return [PagePool("attention", pool_pages[0], layout.attn_page_bytes),
                PagePool("checkpoint", pool_pages[1], layout.ckpt_page_bytes)]
    return [PagePool("shared", pool_pages[0], layout.attn_page_bytes)]
