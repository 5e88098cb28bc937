"""The engine loop's clock: virtual for the simulator, wall for the torch engine.

Only the loop (`harness.engine.loop.EngineLoop`) advances a clock, to the
time of the event it handles; everything else reads ``now``. A virtual clock
is exactly the events' times, so a simulated run is deterministic. A wall
clock counts seconds since the engine started and cannot be moved: advancing
it to a time still ahead sleeps until then (an idle engine waits for its next
arrival), to a time already past leaves it where it is (a step's completion
is handled after the step really ran).
"""

from __future__ import annotations

import time


class VirtualClock:
    """Simulated seconds: ``now`` is the time of the last event handled."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance_to(self, t: float) -> float:
        """The loop handles an event at ``t`` (never before ``now``): now is t."""
        self.now = t
        return t


class WallClock:
    """Seconds since construction by ``timer`` (``time.perf_counter``);
    ``sleep`` (``time.sleep``) waits. Both can be replaced in tests."""

    def __init__(self, timer=time.perf_counter, sleep=time.sleep) -> None:
        self._timer, self._sleep = timer, sleep
        self._t0 = timer()

    @property
    def now(self) -> float:
        return self._timer() - self._t0

    def advance_to(self, t: float) -> float:
        """Sleep until ``t`` if it is still ahead; the time now (at least t)."""
        now = self.now
        while now < t:
            self._sleep(t - now)
            now = self.now
        return now
