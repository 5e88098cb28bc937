"""A transient progress bar that appears with the first piece of work.

Commands hand `progress_bar`'s ``update`` to a long call as its progress
callback. The bar starts only when the call reports work, so a refusal before
any work (a bad flag, a missing file) prints its one ``Error:`` line and
nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar() -> Iterator[Callable[..., None]]:
    """Yields ``update(description, completed=None, total=None)``; the bar is
    removed when the block ends."""
    from rich.console import Console
    from rich.progress import Progress

    bar: Progress | None = None
    task = None

    def update(description: str, completed: float | None = None,
               total: float | None = None) -> None:
        nonlocal bar, task
        if bar is None:
            bar = Progress(transient=True, console=Console(stderr=True))   # stdout stays the answer
            bar.start()
            task = bar.add_task(description, total=total)
        bar.update(task, description=description, completed=completed, total=total)

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()
