"""Engines by CLI name (``--engine``). Factories import lazily so that the
simulator never pays for HTTP clients and vice versa."""

from __future__ import annotations

import importlib

from common.errors import HbenchError

# name -> (module, class). Each class implements adapters.base.Engine.
ENGINES: dict[str, tuple[str, str]] = {
    "sim": ("adapters.sim.engine", "SimEngine"),
    "vllm": ("adapters.vllm", "VllmEngine"),
    "sglang": ("adapters.sglang", "SglangEngine"),
    "torch": ("adapters.torch.engine", "TorchEngine"),
}


def make_engine(name: str, **kwargs):
    if name not in ENGINES:
        raise HbenchError(f"unknown engine {name!r}; choose from {', '.join(sorted(ENGINES))}")
    module, cls = ENGINES[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)


def engines_supporting(org: str) -> list[str]:
    """CLI names of registered engines whose ``supported_orgs`` include ``org``
    (engines whose optional dependencies fail to import are left out)."""
    names = []
    for name, (module, cls) in sorted(ENGINES.items()):
        try:
            engine_cls = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue
        if org in getattr(engine_cls, "supported_orgs", ()):
            names.append(name)
    return names


def check_expressible(engine: str, supported: tuple[str, ...], org: str) -> None:
    """One-line error when ``engine`` cannot express organization ``org``."""
    if org not in supported:
        others = engines_supporting(org)
        raise HbenchError(f"organization {org} is not expressible on {engine}; engines that can "
                          f"run it: {', '.join(others) if others else 'none'}")


def check_paging(engine, paging: str) -> None:
    """One-line error when ``engine`` cannot lay pages out as ``paging``
    (`harness.layout.PAGINGS`); an engine lists what it can in
    ``supported_pagings`` (the study's pages when it says nothing)."""
    supported = getattr(engine, "supported_pagings", ("study",))
    if paging not in supported:
        raise HbenchError(f"--paging {paging} is not expressible on {engine.name}, which lays "
                          f"pages out as {' or '.join(supported)}; use --paging "
                          f"{supported[0]} or --engine sim")
