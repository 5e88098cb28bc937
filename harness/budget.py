"""Budget labels -> bytes, for each organization's split into pages.

A budget is one byte target per pool layer (harness/geometry.py explains
pool layers). Every organization turns the *same* target into its own page
counts (its ``pool_split``, `harness.orgs.split`) and keeps its own rounding
loss, so organizations are compared at equal memory, never at equal page
counts (DESIGN.md section 4). This module only parses labels (``b83``,
``254p``, ``12GiB``) and says why D0's default attention fraction is 0.5
(`working_point_attn_share`); docs/architecture.md, "Budgets", gives the
forms, the splits' arithmetic and Falcon-H1-7B's numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from common.errors import HbenchError
from common.numbers import MAX_NUMBER_CHARS
from harness.budget_label import B_RE, P_RE, SIZE_RE, UNITS, budget_label
from harness.config import ORG_NAMES
from harness.geometry import ModelGeometry
from harness.layout import VLLM_PAGINGS, OrgLayout, grid_for
from harness.orgs import (
    PoolCapacity,
    label_page_bytes,
    layout_for,
    pool_split,
    vllm_d0_split,
)

#: Largest whole-model budget accepted (1 PiB); anything above is a typo.
MAX_WHOLE_MODEL_BYTES = 1 << 50
DEFAULT_D0_ATTN_FRACTION = 0.5

__all__ = ["DEFAULT_D0_ATTN_FRACTION", "FORMS", "OrgBudget", "PoolCapacity", "applicable_orgs",
           "parse_budget_bytes", "resolve_all", "resolve_budget", "vllm_blocks", "vllm_d0_split",
           "working_point_attn_share"]

FORMS = ("bN (N checkpoints' bytes per pool layer, e.g. b83), Np (N pages of the "
         "organization's page, e.g. 252p), or a whole-model size such as 12GiB, 512MiB, "
         "1.5GB, 123456789B")



@dataclass(frozen=True)
class OrgBudget:
    """A budget resolved for one organization. Bytes are per pool layer."""

    org: str
    label: str
    target_bytes: int
    pools: tuple[PoolCapacity, ...]  # one for s0/s1/s2; two for d0, attention first
    d0_attn_fraction: float | None
    pool_layers: int
    paging: str = "study"   # the study's pages or vLLM's blocks (harness/layout.py)

    def pool(self, name: str) -> PoolCapacity:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"{self.org} has no pool {name!r}; pools: {[p.name for p in self.pools]}")

    @property
    def total_pages(self) -> int:
        return sum(p.pages for p in self.pools)

    @property
    def rounding_loss_bytes(self) -> int:
        return sum(p.rounding_loss_bytes for p in self.pools)

    @property
    def whole_model_bytes(self) -> int:
        return self.target_bytes * self.pool_layers

    @property
    def allocated_bytes(self) -> int:
        """Bytes per pool layer the engine allocates for these pools: the whole
        pages, and under vLLM's paging its null block too (a page vLLM
        allocates that holds nothing). Within one page of ``target_bytes``."""
        pages = sum(p.pages * p.page_bytes for p in self.pools)
        return pages + (self.pools[0].page_bytes if self.paging in VLLM_PAGINGS else 0)

    @property
    def largest_page_bytes(self) -> int:
        return max(p.page_bytes for p in self.pools)


def applicable_orgs(geom: ModelGeometry) -> tuple[str, ...]:
    """Organizations that make sense for ``geom``: one whose split keeps
    recurrent state in a pool of its own (D0, E0, U0) needs recurrent state."""
    if geom.slot_checkpoint_bytes:
        return ORG_NAMES
    return tuple(o for o in ORG_NAMES if not pool_split(o).needs_state)


def parse_budget_bytes(text: str, geom: ModelGeometry, org: str | None = None,
                       grid=None) -> tuple[int, str]:
    """(bytes per pool layer, canonical label) of a budget text; see the module
    docstring. ``Np`` counts ``org``'s pages on ``grid`` (None: the model's)."""
    if org is not None and org not in ORG_NAMES:
        raise HbenchError(f"unknown organization {org!r}; choose from {', '.join(ORG_NAMES)}")
    s = str(text).strip()
    if len(s) > MAX_NUMBER_CHARS:   # before int(): thousands of digits are a typo, not a budget
        raise HbenchError(f"budget {s[:20]!r}... is {len(s):,} characters long; use {FORMS}")
    if m := B_RE.fullmatch(s):
        n = int(m.group(1))
        if geom.slot_checkpoint_bytes == 0:
            raise HbenchError(f"budget {s!r} counts checkpoints but {geom.name} has no recurrent "
                              "state; give Np or a whole-model size")
        per_layer = n * geom.slot_checkpoint_bytes
    elif m := P_RE.fullmatch(s):
        n = int(m.group(1))
        if org is None:
            raise HbenchError(f"budget {s!r} counts pages, which differ by organization; "
                              "give an organization")
        per_layer = n * label_page_bytes(org, geom, grid)
    elif (m := SIZE_RE.fullmatch(s)) and m.group(2).lower() in UNITS:
        mult = UNITS[m.group(2).lower()][1]
        whole = int(Decimal(m.group(1)) * mult)  # exact: the regex admits only decimals
        if whole > MAX_WHOLE_MODEL_BYTES:
            raise HbenchError(f"budget {s!r} exceeds 1 PiB for the whole model; use {FORMS}")
        per_layer = whole // geom.pool_layers
    else:
        raise HbenchError(f"unknown budget {s!r}; use {FORMS}")
    if per_layer <= 0:
        raise HbenchError(f"budget {s!r} is zero bytes per pool layer; use a positive {FORMS}")
    if per_layer * geom.pool_layers > MAX_WHOLE_MODEL_BYTES:
        raise HbenchError(f"budget {s!r} exceeds 1 PiB for the whole model; use {FORMS}")
    return per_layer, budget_label(s)


def vllm_blocks(text: str, org: str, geom: ModelGeometry, page_bytes: int | None = None) -> int:
    """The block count hbench gives vLLM for a budget (module docstring): the
    label's bytes in whole vLLM pages, block 0 (the null block) included. One
    vLLM page is the same for every organization, so at a ``bN`` or size label
    every organization gets the same count. ``page_bytes`` (per pool layer,
    in ``geom``'s dtypes): the page where the server's differs from the one
    ``--paging vllm`` lays out (vLLM's CPU block), e.g. on a GPU."""
    target, _ = parse_budget_bytes(text, geom, org)
    return target // (page_bytes or layout_for(org, geom, "vllm").attn_page_bytes)


def resolve_budget(text: str, layout: OrgLayout, geom: ModelGeometry,
                   d0_attn_fraction: float = DEFAULT_D0_ATTN_FRACTION, grid=None) -> OrgBudget:
    """Turn a budget text into the pools and integer page counts of the
    organization laid out by ``layout`` (for ``geom``), in the layout's paging:
    the study's pages or vLLM's blocks. The organization's split
    (`harness.orgs.split`) makes the pools; ``d0_attn_fraction`` is recorded
    for a split that takes it.

    Raises HbenchError if the pools cannot hold one request's state: one
    checkpoint (as ``layout`` lays it out) plus one attention block. ``grid``:
    the grid ``layout`` was laid out on (None: the model's), whose pages an
    ``Np`` label counts.
    """
    split = pool_split(layout.org)
    target, label = parse_budget_bytes(text, geom, layout.org, grid)
    pools = split.pools(target, label, layout, geom, d0_attn_fraction)
    return OrgBudget(layout.org, label, target, pools,
                     d0_attn_fraction if split.takes_fraction else None, geom.pool_layers,
                     layout.paging)


def resolve_all(text: str, geom: ModelGeometry,
                d0_attn_fraction: float = DEFAULT_D0_ATTN_FRACTION,
                paging: str = "study") -> dict[str, OrgBudget]:
    """`resolve_budget` for every organization that applies to ``geom`` (no d0
    for a pure-attention model)."""
    return {org: resolve_budget(text, layout_for(org, geom, paging), geom, d0_attn_fraction)
            for org in applicable_orgs(geom)}


def working_point_attn_share(geom: ModelGeometry, mean_input_tokens: int = 3332,
                             grid_tokens: int | None = None,
                             block_tokens: int | None = None) -> float:
    """Share of one running request's D0 bytes that is attention (module
    docstring); the D0 block and grid default to the model's (`grid_for`)."""
    grid = grid_for(geom)
    grid_tokens = grid_tokens or grid.dual_grid_tokens
    block_tokens = block_tokens or grid.dual_block_tokens
    attn = math.ceil(mean_input_tokens / block_tokens) * block_tokens * geom.slot_attn_bytes_per_token
    ckpts = 1 + mean_input_tokens // grid_tokens
    recurrent = ckpts * geom.slot_checkpoint_bytes
    return attn / (attn + recurrent)
