"""The part of a run's ``engine_info`` every in-process engine reports.

The manifest's ``engine_info`` says what served a run; an in-process engine
serves with an organization built from the run's budget, so the pools, the
organization's token grids and the cache state are the same keys for the
simulator and the torch engine. Each engine adds its own (hardware and poll
interval; device, dtype and measured memory).
"""

from __future__ import annotations

from harness.orgs.protocol import OrganizationProtocol


def engine_info(name: str, setup, org: OrganizationProtocol) -> dict:
    """``engine_info``'s shared keys for engine ``name`` serving ``setup`` with ``org``."""
    capacity = org.capacity()
    return {
        "engine": name, "pool_layers": setup.geometry.pool_layers,
        "pools": [{"name": p.name, "pages": p.pages, "page_bytes": p.page_bytes}
                  for p in setup.budget.pools],
        "attn_block_tokens": capacity.attn_block_tokens,
        "grid_tokens": capacity.grid_tokens,
        "cache_state": "cold", "warmup_requests": setup.config.warmup_requests,
    }
