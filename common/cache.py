"""Where hbench keeps what it can recompute: ``$HBENCH_CACHE_DIR`` if set,
else ``$XDG_CACHE_HOME/hbench``, else ``~/.cache/hbench``.

Everything under it (the parsed ShareGPT pairs, derived workloads, the KS
test p-values of arrival streams, the simulator's source digest, downloaded
datasets) is a cache: deleting it costs time, never a result.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("HBENCH_CACHE_DIR"):
        return Path(os.environ["HBENCH_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hbench"
