"""Engines by CLI name (``--engine``). Factories import lazily so that the
simulator never pays for HTTP clients and vice versa."""

from __future__ import annotations

import importlib

from harness.errors import HbenchError

# name -> (module, class). Each class implements adapters.base.Engine.
ENGINES: dict[str, tuple[str, str]] = {
    "sim": ("adapters.sim.engine", "SimEngine"),
}


def make_engine(name: str, **kwargs):
    if name not in ENGINES:
        raise HbenchError(f"unknown engine {name!r}; choose from {', '.join(sorted(ENGINES))}")
    module, cls = ENGINES[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)
