"""A walk of a directory tree that any depth of nesting cannot break.

`os.walk` and `pathlib.Path.rglob` recurse once per level (Python 3.11), so
a results tree nested a thousand directories deep ends a reader in a
RecursionError traceback. `walk` keeps its own stack: as deep as the file
system allows, in constant Python stack. Like ``os.walk(top)`` it yields
``(dirpath, dirnames, filenames)`` top-down, a caller prunes by editing
``dirnames`` in place, and symbolic links to directories are listed among
``dirnames`` but never entered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator


def walk(top: str | os.PathLike,
         onerror: Callable[[OSError], None] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)``'s answers without its recursion; ``onerror`` gets the
    OSError of a directory that cannot be listed (skipped when None)."""
    stack = [os.fspath(top)]
    while stack:
        dirpath = stack.pop()
        dirnames, filenames, linked = [], [], set()
        try:
            with os.scandir(dirpath) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    (dirnames if is_dir else filenames).append(entry.name)
                    if is_dir and entry.is_symlink():
                        linked.add(entry.name)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        yield dirpath, dirnames, filenames
        # entered in order, after the caller pruned: the stack takes them reversed
        stack.extend(os.path.join(dirpath, d) for d in reversed(dirnames) if d not in linked)
