"""Marconi's online tuning of the utility eviction's alpha (``--utility-alpha auto``).

Marconi (Pan et al., MLSys'25, arXiv 2411.19379, section 4.2) weighs FLOPs
saved per byte against recency with one coefficient alpha and sets it from
the workload itself: serve with alpha 0 until the first eviction (after n0
requests), then at request 5 x n0 replay that bootstrap window once per
candidate alpha through a fresh copy of the same organization and keep the
one that saves the most prefill FLOPs. `AlphaTuner` does so as Marconi's
artifact does, except that the replay keeps as many requests running as were
running at each admission (hbench's pools hold running requests' pages, the
pressure a one-at-a-time replay would miss). The steps and every difference:
docs/experiments.md, "Marconi's alpha, tuned online".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

#: Marconi's grid of candidate alphas (the artifact's config tuner).
CANDIDATES = tuple(i / 10 for i in range(21))
#: The bootstrap window in multiples of the requests seen before the first
#: eviction (the artifact's default; it uses 15 for its LMSys traces).
BOOTSTRAP_MULTIPLIER = 5
#: The alpha served with until the window has been replayed (recency only).
INITIAL_ALPHA = 0.0


class AlphaTuner:
    """The bootstrap window and the replay (module docstring).

    ``flops(j)`` is the FLOPs of a prefix of j tokens; ``build(alpha)``, given
    by `bind`, is a fresh empty organization evicting by utility with that
    alpha. `seen` is told of every request's first admission, `evicting` of
    every reclaimed page; `seen` returns the tuned alpha once, when the window
    is full, else None."""

    def __init__(self, flops: Callable[[int], float]):
        self.flops = flops
        self.build: Callable[[float], object] | None = None
        # (rid, prompt keys, prompt length, requests running when it was admitted)
        self.window: list[tuple[object, tuple, int, int]] = []
        self._rids: set = set()
        self.before_eviction: int | None = None   # n0: requests seen at the first eviction
        self.tuned_alpha: float | None = None
        self.tuned_at: int | None = None          # requests seen when tuned
        self.scores: dict[float, tuple[float, int, int]] = {}

    @property
    def window_size(self) -> int | None:
        n0 = self.before_eviction
        return None if n0 is None else BOOTSTRAP_MULTIPLIER * n0

    def evicting(self) -> None:
        """A cached page is being reclaimed: the first time, the window's size is set."""
        if self.before_eviction is None:
            self.before_eviction = max(1, len(self.window))

    def seen(self, rid, keys, prompt_len: int, running: int) -> float | None:
        """Request ``rid`` (prefix keys ``keys``, ``prompt_len`` prompt tokens) is
        admitted while ``running`` others run; the tuned alpha when this request
        completes the window."""
        if self.tuned_alpha is not None or rid in self._rids or keys is None:
            return None
        self._rids.add(rid)
        self.window.append((rid, tuple(keys[:prompt_len // 16]), prompt_len, running))
        if self.window_size is None or len(self.window) < self.window_size:
            return None
        self.scores = {alpha: self.replay(alpha) for alpha in CANDIDATES}
        best = max(CANDIDATES, key=lambda a: (self.scores[a][0], -a))
        self.tuned_alpha, self.tuned_at = best, len(self.window)
        self.window = []            # tuning happens once; the window is not needed again
        return best

    def replay(self, alpha: float) -> tuple[float, int, int]:
        """(FLOPs saved, tokens hit, requests hit) of serving the window through a
        fresh organization evicting with ``alpha``, as many requests live as ran
        when each was admitted (module docstring)."""
        assert self.build is not None, "AlphaTuner.replay before the organization set build"
        org = self.build(alpha)
        live: deque = deque()
        flops = tokens = hits = 0
        for rid, keys, n, running in self.window:
            while len(live) > running:
                org.finish(live.popleft())
            hit = org.lookup(keys, n - 1)
            while not org.allocate(rid, n, n, keys, hit, n):
                if not live:
                    break           # larger than the whole cache: nothing to replay
                org.finish(live.popleft())
                hit = org.lookup(keys, n - 1)
            else:
                if hit.j_adopt:
                    flops += self.flops(hit.j_adopt)
                    tokens += hit.j_adopt
                    hits += 1
                org.commit(rid, keys, n, n)
                org.end_step()
                live.append(rid)
        return flops, tokens, hits

    def counters(self) -> dict:
        """``utility_alpha_tuned`` (None until tuned) and
        ``utility_alpha_tuned_at`` (the requests seen then)."""
        return {"utility_alpha_tuned": self.tuned_alpha,
                "utility_alpha_tuned_at": self.tuned_at}
