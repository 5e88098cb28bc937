"""The organization as the torch engine drives it: copies handed over, frees poisoned.

The scheduler talks to the organization exactly as it does in the simulator;
`TrackedOrg` stands between them and forwards every call unchanged. After
each action it does what an engine holding real memory needs:

0. For an organization that splits one region between its pools (u0, e0),
   the pools' storage follows the pages that joined or left each pool
   (`Pools.sync`, `adapters.torch.region`), before anything reads or
   poisons a page.
1. With a `Poisoner`, it fills with NaN every page that the action freed,
   whose last cached entry it invalidated, or that it handed out again
   (learnt from `page_lifecycle`: empty-set and generation changes). A page
   read after that, by anyone the organization did not give it to, yields
   NaN, and the engine refuses non-finite logits.
2. It hands the state copies the call asked for (`copies()`: ``adopt`` after
   a request's first `allocate`, ``publish`` after `commit`) to the engine
   at once, before the scheduler's next call can free anything they touch.

It never changes what the organization decides: asking still changes
nothing, and every answer is the organization's own.
"""

from __future__ import annotations

from collections.abc import Callable

from adapters.torch.pools import Pools
from harness.orgs.protocol import OrganizationProtocol


class Poisoner:
    """NaN into every page no entry describes any more (all pages at start)."""

    def __init__(self, org: OrganizationProtocol, pools: Pools):
        self.org = org
        self.pools = pools
        self.n_pools = len(pools.tensors)
        self.snap = [org.page_lifecycle(i) for i in range(self.n_pools)]
        pools.poison_all()
        self._poisoned = sum(t.shape[0] for t in pools.tensors)
        if pools.slots is not None:     # a region's pages leaving a pool (`RegionSlots`)
            pools.slots.poison = True

    @property
    def poisoned(self) -> int:
        """Pages filled with NaN so far."""
        return self._poisoned + (self.pools.slots.poisoned if self.pools.slots else 0)

    def _poison(self, pool: int, pages: list[int]) -> None:
        self._poisoned += self.pools.poison(pool, pages)

    def sweep(self) -> None:
        """Poison what changed hands since the last sweep."""
        for i in range(self.n_pools):
            gen, empty = self.org.page_lifecycle(i)
            old_gen, old_empty = self.snap[i]
            pages = set(empty - old_empty)
            if gen != old_gen:
                pages.update(p for p, (a, b) in enumerate(zip(gen, old_gen, strict=True))
                             if a != b)
            self.snap[i] = (gen, empty)
            if pages:
                self._poison(i, sorted(pages))


CopyFn = Callable[[object, tuple], None]


class TrackedOrg:
    """Forwards every call to ``org``; see the module docstring for what it adds.

    ``on_admit(rid, copies)`` follows a request's first `allocate` (its adopt
    copy, if any); ``on_commit(rid, copies)`` follows every `commit` (its
    publish copies, possibly none).
    """

    def __init__(self, org: OrganizationProtocol, on_admit: CopyFn, on_commit: CopyFn,
                 poisoner: Poisoner | None = None, pools: Pools | None = None):
        self._org = org
        self._on_admit = on_admit
        self._on_commit = on_commit
        self._poisoner = poisoner
        self._pools = pools     # its storage follows a region organization's pools

    def __getattr__(self, name):
        return getattr(self._org, name)

    def _moved(self) -> None:
        if self._pools is not None:
            self._pools.sync()
        if self._poisoner is not None:
            self._poisoner.sweep()

    def allocate(self, rid, end: int, prefill_until: int, keys=None, hit=None,
                 prompt_len=None) -> bool:
        new = not self._org.is_admitted(rid)
        ok = self._org.allocate(rid, end, prefill_until, keys, hit, prompt_len)
        self._moved()
        if ok and new:
            self._on_admit(rid, self._org.copies())
        return ok

    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]:
        published = self._org.commit(rid, keys, computed, prefill_until)
        self._moved()
        self._on_commit(rid, self._org.copies())
        return published

    def allocate_all(self, requests) -> bool:
        ok = self._org.allocate_all(requests)
        self._moved()
        return ok

    def end_step(self) -> None:
        self._org.end_step()
        self._moved()

    def retain(self, rid, position: int, keys) -> bool:
        return self._org.retain(rid, position, keys)

    def finish(self, rid) -> None:
        self._org.finish(rid)
        self._moved()

    def preempt(self, rid) -> None:
        self._org.preempt(rid)
        self._moved()

    def abandon(self, rid) -> None:
        self._org.abandon(rid)
        self._moved()
