"""The joint-hit lookup: full-state validity over both halves of an organization.

A cached prefix of length J is reusable only if the attention blocks of
[0, J) AND a checkpoint at exactly J are valid (DESIGN.md section 1).
`PrefixLookup` is the one place that reads the attention index and the
checkpoint store together to answer that, and prices the adoption (the
cached pages an adoption would take out of the free queues), so that the
asks that follow a lookup need not walk the prefix again.

A scheduler asks the same question many times while nothing changes (every
waiting request, every step), so the last answer is kept as a `LookupMemo`
with what it depends on.
"""

from __future__ import annotations

from typing import NamedTuple

from harness.orgs.attention import AttentionIndex
from harness.orgs.checkpoints import CheckpointStore
from harness.orgs.entries import EntryTable
from harness.orgs.keys import KEY_TOKENS, key_at
from harness.orgs.values import PrefixHit


class LookupMemo(NamedTuple):
    """`PrefixLookup.find`'s last answer and what it depends on: the keys (the
    same list, of the same length), the limit and what entered and left the
    lookup maps (``maps``: registering a block changes no page), which the
    depths read; and for the adoption cost only, the pages' state
    (``version``, `PrefixLookup.version`)."""

    keys: object
    n_keys: int
    max_tokens: int
    maps: tuple[int, int, int]
    j_adopt: int
    r_max: int
    depth: int
    version: int
    pages: tuple[int, ...]
    slabs: frozenset


class PrefixLookup:
    """Joint hits of an organization's attention index and checkpoint store on
    its checkpoint grid of ``grid`` tokens."""

    def __init__(self, table: EntryTable, attn: AttentionIndex, ckpts: CheckpointStore,
                 grid: int):
        self.table, self.attn, self.ckpts, self.grid = table, attn, ckpts, grid
        self.pools = table.pools
        self.memo: LookupMemo | None = None

    def version(self) -> int:
        """Changes whenever any page changes state (pools count their transitions)."""
        return sum(p.version for p in self.pools)

    def find(self, keys, max_tokens: int) -> PrefixHit:
        """Deepest reusable prefix of ``keys`` no longer than ``max_tokens``."""
        version = self.version()
        # entries enter the maps by registration or publication and leave them
        # only when invalidated: the depths below read nothing else
        maps = (self.attn.registrations, self.ckpts.published_count, self.table.invalidations)
        memo = self.memo   # the last answer: asked again before the maps changed?
        if (memo is not None and memo.keys is keys and memo.n_keys == len(keys)
                and memo.max_tokens == max_tokens and memo.maps == maps):
            if memo.version != version:   # pages changed state since: only the cost is asked again
                pages, slabs = self.adoption_cost(keys, memo.j_adopt)
                memo = self.memo = memo._replace(version=version, pages=pages, slabs=slabs)
            return PrefixHit(memo.j_adopt, memo.r_max, memo.depth, version, memo.pages,
                             memo.slabs)   # a hit of its own
        limit = min(max_tokens, len(keys) * KEY_TOKENS)
        depth = self.attn.depth(keys, limit)
        ckpt_map, grid = self.ckpts.map, self.grid
        j_adopt = r_max = 0
        for j in range(limit - limit % grid, 0, -grid):
            if key_at(keys, j) in ckpt_map:
                if not r_max:
                    r_max = j
                if j <= depth:
                    j_adopt = j
                    break
        pages, slabs = self.adoption_cost(keys, j_adopt)
        self.memo = LookupMemo(keys, len(keys), max_tokens, maps, j_adopt, r_max, depth,
                               version, pages, slabs)
        return PrefixHit(j_adopt=j_adopt, r_max=r_max, attn_depth=depth, version=version,
                         adopt_pages=pages, adopt_slabs=slabs)

    def adoption(self, keys, hit: PrefixHit | None) -> tuple[int, list[int], frozenset]:
        """(J, cached pages per pool, cached slabs) that adopting ``hit`` takes:
        the cost the lookup priced if no page changed state since, else priced
        again; (0, no pages, none) without a hit."""
        if hit is None or not hit.j_adopt:
            return 0, [0] * len(self.pools), frozenset()
        if hit.version == self.version():
            return hit.j_adopt, list(hit.adopt_pages), hit.adopt_slabs
        pages, slabs = self.adoption_cost(keys, hit.j_adopt)
        return hit.j_adopt, list(pages), slabs

    def adoption_cost(self, keys, j: int) -> tuple[tuple[int, ...], frozenset]:
        """Cached pages per pool that adopting the joint hit at ``j`` takes out of
        the free queues, and the cached slabs it would make referenced."""
        pages = [0] * len(self.pools)
        if j <= 0:
            return tuple(pages), frozenset()
        pages[0] += self.attn.free_pages_to_adopt(keys, j)
        n, slabs = self.ckpts.free_pages_to_adopt(key_at(keys, j))
        pages[-1] += n
        return tuple(pages), slabs
