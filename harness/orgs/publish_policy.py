"""Where checkpoints are published: one small class per policy, by CLI name.

Under the study's publication (`harness.orgs.publication.Spares`) a request
publishes its state at every grid boundary of its prefill. A publish policy
chooses a subset of those boundaries instead, once, when the request is
admitted (`kept`), so that what the organization is asked to reserve and
what it then reserves are the same boundaries:

    ``--ckpt-publish``  policy     publishes at
    every               `Every`    every grid boundary (the study; the default)
    every-k             `EveryK`   every k-th grid boundary (k x grid, 2k x grid, ...)
    marconi             `Marconi`  likely reuse points (Marconi, MLSys'25): the
                                   deepest boundary of the request's prefix that
                                   another request's prefill already reached (a
                                   branch point of the prefixes seen so far), and
                                   the request's last boundary (its end, which a
                                   later turn of the conversation can resume from)

A boundary left out is passed without a spare: the request's live state
simply continues. Policies read prefix keys (`harness.orgs.keys`) and never
touch pages.
"""

from __future__ import annotations

from harness.orgs.keys import key_at


class PublishPolicy:
    """Chooses the grid boundaries a request publishes."""

    def kept(self, rid, keys, start: int, until: int, grid: int) -> tuple[int, ...]:
        """The boundaries j, ``start`` < j <= ``until``, multiples of ``grid``,
        at which request ``rid`` (prefix keys ``keys``, None if unknown) would
        publish if admitted now, in increasing order. Changes nothing."""
        raise NotImplementedError

    def admitted(self, rid, keys, until: int, grid: int) -> None:
        """Request ``rid`` was admitted to prefill up to ``until``."""


class Every(PublishPolicy):
    """The study: every grid boundary."""

    def kept(self, rid, keys, start, until, grid):
        return tuple(range(start // grid * grid + grid, until // grid * grid + 1, grid))


class EveryK(PublishPolicy):
    """Every k-th grid boundary, counted from the start of the prompt (so every
    request sharing a prefix publishes at the same positions)."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"every-k needs k >= 1, got {k}")
        self.k = k

    def kept(self, rid, keys, start, until, grid):
        step = grid * self.k
        return tuple(range(start // step * step + step, until // grid * grid + 1, step))


class Marconi(PublishPolicy):
    """Marconi's admission: publish where reuse is likely.

    ``reached`` counts, per prefix key of a grid boundary, the distinct
    requests whose prefill reached that boundary (a prefix-hash count, the
    radix tree's branch structure without the tree). At admission, Marconi
    inserts the request speculatively; here the boundaries another request
    reached already are the shared part of the prefix, and the deepest of them
    (the branch point, on the grid) is published. The request's last boundary
    is published too. Counts are kept for requests ever admitted (the prefix
    structure seen so far), once per request: a request preempted and admitted
    again counts only the boundaries it had not reached before."""

    def __init__(self):
        self.reached: dict[int, int] = {}    # prefix key -> distinct requests that reached it
        self.inserted: dict[object, int] = {}   # rid -> deepest boundary counted for it

    def kept(self, rid, keys, start, until, grid):
        last = until // grid * grid
        first = start // grid * grid + grid
        if last < first:
            return ()
        out = []
        if keys is not None:
            own, reached = self.inserted.get(rid, 0), self.reached
            branch = 0
            for j in range(first, last, grid):
                others = reached.get(key_at(keys, j), 0) - (1 if j <= own else 0)
                if others < 1:
                    break                  # keys chain: no deeper boundary is shared
                branch = j
            if branch:
                out.append(branch)
        out.append(last)
        return tuple(out)

    def admitted(self, rid, keys, until, grid):
        if keys is None:
            return
        own, last = self.inserted.get(rid, 0), until // grid * grid
        reached = self.reached
        for j in range(own + grid, last + 1, grid):
            k = key_at(keys, j)
            reached[k] = reached.get(k, 0) + 1
        if last > own:
            self.inserted[rid] = last


#: ``--ckpt-publish`` -> the policy; the one list of publish policies.
PUBLISH_POLICIES: dict[str, type[PublishPolicy]] = {
    "every": Every, "every-k": EveryK, "marconi": Marconi}


def publish_policy_for(name: str, every_k: int) -> PublishPolicy:
    """A fresh policy ``name`` (a key of `PUBLISH_POLICIES`); ``every_k`` is
    `EveryK`'s k."""
    cls = PUBLISH_POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown publish policy {name!r}; choose from {', '.join(PUBLISH_POLICIES)}")
    return EveryK(every_k) if cls is EveryK else cls()
