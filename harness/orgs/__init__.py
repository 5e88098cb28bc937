"""The memory organizations behind one protocol (`harness.orgs.protocol`).

``ORGANIZATIONS`` maps the CLI name to the class and is the one list of
organizations: CLI choices, sweeps, budget tables and layouts (`layout_for`) derive from it.
Adding an organization means adding its module (a subclass of `Organization`
with a ``layout_for(geom)`` and a ``pool_split``, `harness.orgs.split`) and one
entry here. `build_organization` turns a layout and pool sizes into a ready
organization; `pool_split` says how a budget's bytes become those sizes.
"""

from __future__ import annotations

from harness.layout import PAGINGS, VLLM_PAGINGS, Grid, OrgLayout, grid_for, vllm_block_tokens
from harness.orgs.base import Organization
from harness.orgs.d0 import D0
from harness.orgs.e0 import E0
from harness.orgs.entries import may_change_lookup
from harness.orgs.policies import DEFAULT_POLICY, CheckpointPolicy
from harness.orgs.s0 import S0
from harness.orgs.s1 import S1
from harness.orgs.s2 import S2
from harness.orgs.split import PoolCapacity, PoolSplit, check_attn_fraction, vllm_d0_split
from harness.orgs.u0 import U0
from harness.orgs.values import (
    Capacity,
    Demand,
    PageRef,
    PoolInfo,
    PrefixHit,
    RegionCapacity,
    StateCopy,
    StatePlacement,
    Usage,
)

ORGANIZATIONS: dict[str, type[Organization]] = {"s0": S0, "s1": S1, "s2": S2, "d0": D0,
                                                 "u0": U0, "e0": E0}


def _organization(org: str) -> type[Organization]:
    cls = ORGANIZATIONS.get(org)
    if cls is None:
        raise ValueError(f"unknown organization {org!r}")
    return cls


def pool_split(org: str) -> PoolSplit:
    """How ``org`` (a key of `ORGANIZATIONS`) splits a byte target into its pools."""
    return _organization(org).pool_split


def label_page_bytes(org: str, geom, grid: Grid | None = None) -> int:
    """The page an ``Np`` budget label counts for ``org`` under model ``geom``
    on ``grid`` (None: the model's, `harness.layout.grid_for`; a run's, with
    its overrides, `harness.run_grid.run_grid`) (harness/budget.py): its own
    study page, or the attention page A."""
    cls = _organization(org)
    grid = grid or grid_for(geom)
    return cls.pool_split.label_page_bytes(cls.layout_for(geom, grid), geom, grid)


def layout_for(org: str, geom, paging: str = "study", grid: Grid | None = None) -> OrgLayout:
    """The layout of ``org`` (a key of `ORGANIZATIONS`) for model geometry
    ``geom`` under ``grid`` (None: the grid the model declares, else the
    geometry rule's, `harness.layout.grid_for`): the study's pages, or with a vLLM paging (``"vllm"``,
    ``"vllm-gpu"``) the same organization in vLLM's blocks of that paging's
    alignment (`OrgLayout.in_vllm_blocks`)."""
    cls = _organization(org)
    layout = cls.layout_for(geom, grid or grid_for(geom))
    if paging == "study":
        return layout
    if paging in VLLM_PAGINGS:
        per_token = geom.slot_attn_bytes_per_token
        block = vllm_block_tokens(per_token, geom.slot_checkpoint_bytes, VLLM_PAGINGS[paging])
        return layout.in_vllm_blocks(block, per_token, cls.vllm_preempt_pin, paging)
    raise ValueError(f"unknown paging {paging!r}; choose from {', '.join(PAGINGS)}")


def build_organization(layout: OrgLayout, pool_pages: tuple[int, ...],
                       policy: CheckpointPolicy = DEFAULT_POLICY) -> Organization:
    """An organization of ``layout`` (`layout_for`, or a run's `RunSetup.layout`)
    with the given pages per pool (one count for s0/s1/s2, and u0's region of
    attention pages; attention then checkpoint pool for d0 and e0), publishing
    and evicting checkpoints as ``policy`` says (`harness.orgs.policies`)."""
    cls = _organization(layout.org)
    want = cls.pool_split.pool_count
    if len(pool_pages) != want:
        raise ValueError(f"{layout.org} takes {want} pool size(s), got {pool_pages}")
    return cls(layout, tuple(pool_pages), policy)


__all__ = ["DEFAULT_POLICY", "ORGANIZATIONS", "Capacity", "CheckpointPolicy", "Demand", "Organization", "PageRef", "PoolInfo",
           "PoolCapacity", "PoolSplit", "PrefixHit", "RegionCapacity", "StateCopy", "StatePlacement", "Usage",
           "build_organization", "check_attn_fraction", "label_page_bytes", "layout_for", "may_change_lookup", "pool_split",
           "vllm_d0_split"]
