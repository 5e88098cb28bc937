"""Bounded waits on observable conditions: how tests order events without
sleeping a fixed time (a fixed sleep is too short on a loaded machine and
wasted on an idle one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str,
               interval_s: float = 0.02) -> T:
    """Poll ``condition()`` every ``interval_s`` until it returns something
    true, and return that; AssertionError saying ``what`` was awaited if
    ``timeout_s`` passes first (a bound for a hang, not a speed target)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(interval_s)
    return value
