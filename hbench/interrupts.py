"""Interrupts end a command cleanly: SIGINT (Ctrl-C), SIGTERM and SIGHUP.

While a command runs (`signals_interrupt`, entered by the CLI around every
command) each of the three raises `Interrupted`, a `KeyboardInterrupt`, in
the main thread, so the command unwinds as from Ctrl-C: its ``finally`` and
``except BaseException`` blocks stop a sweep's workers, remove their cell
locks and the temporaries they and the command were writing, and record
what was done (sweep.json). The CLI then prints one line and exits with the
shell's code for the signal (128 + its number: 130, 143, 129). Nothing
partial is kept, so running the same command again picks up where it
stopped (a sweep skips its finished cells).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The signals that interrupt a command.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The command was interrupted by ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def message(self) -> str:
        return (f"interrupted by {signal.Signals(self.signum).name}: stopped, nothing partial "
                "kept; run the same command again to resume")


#: Signals received in the current block. Python swallows an exception raised
#: where it cannot propagate (a finalizer, logging's lock handlers around a
#: fork): a signal that lands there is kept here, for `raise_if_received`.
_RECEIVED: list[int] = []


def _raise(signum, frame):
    _RECEIVED.append(signum)
    raise Interrupted(signum)


def raise_if_received() -> None:
    """Raise `Interrupted` for a signal received in the block whose exception
    was swallowed where it was raised; a long command calls this between its
    steps (a sweep, as each cell ends)."""
    if _RECEIVED:
        raise Interrupted(_RECEIVED[-1])


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, `SIGNALS` raise `Interrupted` (main thread only: a
    signal handler can be set nowhere else); the previous handlers after. A
    block that ends normally after a signal whose exception was swallowed
    raises it then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    outer = list(_RECEIVED)
    _RECEIVED.clear()
    try:
        yield
        raise_if_received()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _RECEIVED[:] = outer + _RECEIVED


def as_interrupted(exc: KeyboardInterrupt) -> Interrupted:
    """``exc`` as an `Interrupted` (a bare KeyboardInterrupt is Ctrl-C's)."""
    return exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
