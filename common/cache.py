"""Where hbench keeps what it can recompute: ``$HBENCH_CACHE_DIR`` if set,
else ``$XDG_CACHE_HOME/hbench``, else ``~/.cache/hbench``.

Everything under it (the parsed ShareGPT pairs, derived workloads, the KS
test p-values of arrival streams, the simulator's source digest, the
installed packages' versions, downloaded datasets) is a cache: deleting it
costs time, never a result.

Small values are kept as one JSON object a file, ``KIND/NAME.json``
(`read_entry`, `write_entry`): the object carries its layout's ``format``,
and a file that is absent, torn, unreadable or of another layout reads as
nothing, so the caller computes the value again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.atomic import atomic_write_text
from common.errors import HbenchError


def cache_dir() -> Path:
    if os.environ.get("HBENCH_CACHE_DIR"):
        return Path(os.environ["HBENCH_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hbench"


def entry_file(kind: str, name: str) -> Path:
    """Where the entry ``name`` of ``kind`` is kept."""
    return cache_dir() / kind / f"{name}.json"


def read_entry(kind: str, name: str, fmt: int) -> dict | None:
    """The JSON object kept as ``kind/name``, if it has layout ``fmt``; else None."""
    try:
        entry = json.loads(entry_file(kind, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):   # absent, unreadable or torn: compute again
        return None
    return entry if isinstance(entry, dict) and entry.get("format") == fmt else None


def write_entry(kind: str, name: str, fmt: int, entry: dict) -> None:
    """Keep ``entry`` (with ``format`` set to ``fmt``) as ``kind/name``, atomically.

    A cache directory that cannot be written only costs the recomputation, so
    that is not an error."""
    try:
        atomic_write_text(entry_file(kind, name), json.dumps({**entry, "format": fmt}))
    except (OSError, HbenchError):   # a read-only or full cache dir only costs speed
        pass
