"""The narrow door between `hbench run` and an engine.

An engine takes a `Workload` and a `RunSetup` (harness/run_setup.py: the
`RunConfig` with its geometry and budget, resolved once per run) and returns
an `EngineRun`
(harness/records.py). It never writes files and never computes summaries:
`harness.results` and `harness.metrics` do that identically for every engine.
``progress`` is called with the number of requests completed so far so the CLI
can draw one progress bar whatever the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from harness.records import EngineRun

ProgressFn = Callable[[int], None]


class Engine(Protocol):
    #: CLI name (``--engine``).
    name: str
    #: organizations this engine can express (subset of ORGANIZATIONS keys).
    supported_orgs: tuple[str, ...]
    #: page layouts it can serve (`harness.layout.PAGINGS`); ("study",) if absent.
    supported_pagings: tuple[str, ...]

    def run(self, workload, setup, progress: ProgressFn | None = None) -> EngineRun: ...

    def version(self) -> str:
        """A string that changes whenever the engine's outputs may change."""
        ...
