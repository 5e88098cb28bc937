"""Which cached checkpoint is evicted: one small class per policy, by CLI name.

When an allocation needs a page and no empty one is left, the entry table
(`EntryTable.take_page`) reclaims a cached page. The eviction policy picks it:

    ``--ckpt-evict``  policy     reclaims
    lru               `LRU`      the least recently released cached page (the
                                 study; the default): attention block or checkpoint
    utility           `Utility`  when that page belongs to a checkpoint, the cached
                                 checkpoint of lowest utility instead (Marconi,
                                 MLSys'25); an attention page is reclaimed as by LRU

Marconi's utility of a checkpoint at depth J is

    alpha x norm(FLOPs saved / state bytes) + norm(recency)

over the candidates, each term scaled to [0, 1] by its minimum and maximum
over them (0 when all are equal). FLOPs saved are `harness.prefix_flops`'s
FLOPs of the prefix of J tokens; every checkpoint of an organization has the
same bytes, so the first term is the normalized FLOPs. Recency is the
checkpoint's place in the pool's LRU queue (its first member page's: the
oldest is 0, the newest 1). Candidates are the cached checkpoints, i.e. those
no request references and no pin or retention holds (Marconi restricts
eviction to radix nodes with at most one child; here nothing depends on a
checkpoint but requests). Ties go to the least recently released. Alpha is
fixed by ``--utility-alpha A``, or tuned online as Marconi tunes it with
``--utility-alpha auto`` (`harness.orgs.alpha_tuning`: recency only until
a bootstrap window of requests has been seen, then the alpha whose replay of
that window saved the most FLOPs).

Evicting one member page invalidates the whole checkpoint (invalidate before
free: `EntryTable.invalidate`), so its other pages become empty and the next
pages an allocation takes come from them.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.orgs.alpha_tuning import AlphaTuner
from harness.orgs.entries import CKPT_ENTRY
from harness.orgs.pool import ATTN


class EvictPolicy:
    """Chooses the cached page `EntryTable.take_page` reclaims."""

    def victim(self, table, pool_idx: int, exclude: frozenset = frozenset()) -> int | None:
        """A cached page of pool ``pool_idx`` not in ``exclude`` (None if none is
        cached). Changes nothing in the cache. ``exclude``: pages an allocation
        adopts, when an organization evicts before it adopts (u0)."""
        raise NotImplementedError

    def admitted(self, rid, keys, prompt_len: int, running: int) -> None:
        """Request ``rid`` (prefix keys ``keys``) was admitted for the first time,
        while ``running`` other requests were admitted."""


class LRU(EvictPolicy):
    """The least recently released cached page."""

    def victim(self, table, pool_idx, exclude=frozenset()):
        pool = table.pools[pool_idx]
        if not exclude:
            return pool.lru_victim()
        return next((p for p in pool.lru if p not in exclude), None)


class Utility(EvictPolicy):
    """Marconi's FLOP-aware utility over cached checkpoints (module docstring)."""

    def __init__(self, alpha: float, flops: Callable[[int], float], tuner: AlphaTuner | None = None):
        if alpha < 0:
            raise ValueError(f"utility alpha must be >= 0, got {alpha}")
        self.alpha = alpha
        self._flops = flops
        self._memo: dict[int, float] = {}
        #: Marconi's online tuning (``--utility-alpha auto``); None: alpha is fixed
        self.tuner = tuner

    def admitted(self, rid, keys, prompt_len, running):
        if self.tuner is not None:
            tuned = self.tuner.seen(rid, keys, prompt_len, running)
            if tuned is not None:
                self.alpha = tuned

    def flops(self, position: int) -> float:
        f = self._memo.get(position)
        if f is None:
            f = self._memo[position] = self._flops(position)
        return f

    def candidates(self, table, pool) -> list:
        """The cached checkpoints of ``pool``, least recently released first
        (by their first member page's place in the LRU queue)."""
        out, entries = [], table.entries
        kind, deps = pool.kind, pool.dependents
        for page in pool.lru:
            if kind[page] == ATTN:
                continue
            for eid in deps[page]:
                e = entries.get(eid)   # a slab's new occupant is not in the table yet
                if e is None or e.kind != CKPT_ENTRY or e.members[0][1] != page:
                    continue
                assert e.refs == 0 and not e.held, f"cached page {page} of live {e}"
                out.append(e)
        return out

    def victim(self, table, pool_idx, exclude=frozenset()):
        pool = table.pools[pool_idx]
        page = (pool.lru_victim() if not exclude
                else next((p for p in pool.lru if p not in exclude), None))
        if self.tuner is not None and page is not None:
            self.tuner.evicting()
        if page is None or pool.kind[page] == ATTN:
            return page
        cands = self.candidates(table, pool)
        if exclude:
            cands = [e for e in cands if e.members[0][1] not in exclude]
        if not cands:
            return page
        flops = [self.flops(e.pos) for e in cands]
        lo, span, n = min(flops), max(flops) - min(flops), len(cands)
        best, best_score = 0, None
        for i, f in enumerate(flops):
            score = (self.alpha * ((f - lo) / span if span > 0 else 0.0)
                     + (i / (n - 1) if n > 1 else 0.0))
            if best_score is None or score < best_score:   # ties: the older one
                best, best_score = i, score
        return cands[best].members[0][1]


#: ``--ckpt-evict`` -> the policy; the one list of eviction policies.
EVICT_POLICIES: dict[str, type[EvictPolicy]] = {"lru": LRU, "utility": Utility}
