"""The organization's pools as real memory: one preallocated tensor per pool.

`Pools` takes an organization's `capacity()` and allocates, for each pool,
one tensor ``[pages, layers, page_elems]`` on the engine's device. Nothing is
allocated per request afterwards: attention K/V, live recurrent states and
published checkpoints all live in these pages, where the organization placed
them. An organization that splits one region between its pools while
serving (u0, e0: `region()` is not None) gets one buffer of the region's
bytes instead, its two pools the two ends of it (`adapters.torch.region`);
a page id then maps to the row its pool's end holds it in (`rows`), and
`sync` follows the organization's moves.

Bytes to elements. hbench's geometry counts state bytes in the model's
storage dtype (bf16, 2 bytes), and an organization's page is ``page_bytes``
of it per layer. The engine stores elements of its compute dtype (float32
on CPU, bfloat16 on a GPU), one element for each geometry element:

    page_elems = page_bytes / geometry dtype bytes
    element offset = byte offset / geometry dtype bytes

so every page, offset and slot keeps its place in the layout, and a float32
pool simply takes twice the bytes the organization accounts (`physical_bytes`
reports what was really allocated). The SSM state must be stored in the
geometry dtype (``--ssm-dtype`` equal to the weights' dtype) for this
element-for-element mapping to hold.

Placements. The organization answers in bytes (`harness.orgs.values`); the
model gathers and scatters element extents (`adapters.torch.paging`).
`placement` converts one into the other:

    S0, D0   ConvInline  SSM [page, 0 .. ssm) then conv at the inline offset
    S1       ConvPages   SSM over member pages, conv over its own page(s)
    S2       ConvSlot    SSM over member pages, conv at slot x slot_bytes
                         inside the shared slab page
"""

from __future__ import annotations

import torch

from adapters.torch.kernels.tables import StateTables, build_tables
from adapters.torch.paging import (
    Extent,
    StatePlacement,
    StateShapes,
    gather_state,
    kv_view,
    lay_over_pages,
    scatter_state,
)
from adapters.torch.region import RegionSlots, region_views
from harness.orgs.values import Capacity, ConvInline, ConvPages, ConvSlot, RegionCapacity
from harness.orgs.values import StatePlacement as OrgPlacement


class Pools:
    """Every pool of one organization, preallocated (see the module docstring)."""

    def __init__(self, capacity: Capacity, shapes: StateShapes, geometry_dtype_bytes: int,
                 dtype: torch.dtype, device: str | torch.device,
                 region: RegionCapacity | None = None, org=None):
        self.capacity = capacity
        self.shapes = shapes
        self.unit = geometry_dtype_bytes
        self.dtype = dtype
        self.device = torch.device(device)
        for p in (region or capacity).pools:
            if p.page_bytes % self.unit:
                raise ValueError(f"pool {p.name}: {p.page_bytes}-byte pages are not whole "
                                 f"{self.unit}-byte elements")
        #: what was allocated: one tensor per pool, or the region's one buffer
        self.storage: list[torch.Tensor] = []
        self.tensors: list[torch.Tensor] = []
        #: where the pages of a region organization (``org``) lie; None: page id = row
        self.slots: RegionSlots | None = None
        if region is None:
            for p in capacity.pools:
                self.tensors.append(torch.zeros(p.pages, shapes.n_layers,
                                                p.page_bytes // self.unit, dtype=dtype,
                                                device=self.device))
            self.storage = list(self.tensors)
        else:
            if region.region_bytes % self.unit:
                raise ValueError(f"a region of {region.region_bytes} B is not whole "
                                 f"{self.unit}-byte elements")
            buffer = torch.zeros(region.region_bytes // self.unit * shapes.n_layers,
                                 dtype=dtype, device=self.device)
            self.storage = [buffer]
            self.tensors = region_views(buffer, region, shapes.n_layers, self.unit)
            self.slots = RegionSlots(org, self.tensors, region)
        self.attn_pool = 0
        self.state_pool = len(self.tensors) - 1
        self.kv = kv_view(self.tensors[0], shapes, capacity.attn_block_tokens)

    # ---- sizes -------------------------------------------------------------------
    @property
    def physical_bytes(self) -> int:
        """Bytes really allocated for the pools (all pools, all layers)."""
        return sum(t.numel() * t.element_size() for t in self.storage)

    @property
    def byte_scale(self) -> float:
        """Physical bytes per byte the organization accounts (2.0 for float32 pools)."""
        return torch.tensor([], dtype=self.dtype).element_size() / self.unit

    # ---- page ids to rows ----------------------------------------------------------
    def sync(self) -> None:
        """Follow a region organization's pool changes (`RegionSlots.sync`)."""
        if self.slots is not None:
            self.slots.sync()

    def rows(self, pool: int, pages) -> list[int]:
        """The rows of ``tensors[pool]`` holding ``pages`` (page ids in the pool)."""
        if self.slots is None:
            return list(pages)
        rows = [self.slots.row(pool, p) for p in pages]
        if None in rows:
            raise ValueError(f"pool {pool}: pages {[p for p, r in zip(pages, rows, strict=True) if r is None]} "
                             "are not in the pool now")
        return rows

    def _rows_of(self, p: OrgPlacement) -> OrgPlacement:
        """``p`` with every page id replaced by its row (identity for fixed pools)."""
        if self.slots is None:
            return p
        row = self.rows
        conv = p.conv
        if isinstance(conv, ConvInline):
            conv = ConvInline(row(p.pool, [conv.page])[0], conv.offset)
        elif isinstance(conv, ConvPages):
            conv = ConvPages(tuple(row(p.pool, conv.pages)), conv.nbytes)
        elif isinstance(conv, ConvSlot):
            conv = ConvSlot(row(p.pool, [conv.slab])[0], conv.slot, conv.slot_bytes)
        pages = row(p.pool, [page for page, _ in p.ssm])
        return OrgPlacement(p.pool, tuple((r, n) for r, (_, n) in zip(pages, p.ssm, strict=True)),
                            conv)

    # ---- placements ----------------------------------------------------------------
    def placement(self, p: OrgPlacement) -> StatePlacement:
        """The element extents of an organization's byte placement."""
        p = self._rows_of(p)
        u, sh = self.unit, self.shapes
        elems = self.tensors[p.pool].shape[-1]
        ssm = lay_over_pages([page for page, _ in p.ssm], sh.ssm_elems, elems)
        if sum(n for _, n in p.ssm) != sh.ssm_elems * u:
            raise ValueError(f"SSM placement holds {sum(n for _, n in p.ssm)} bytes; "
                             f"the model's SSM state is {sh.ssm_elems * u}")
        conv = p.conv
        if isinstance(conv, ConvInline):
            ext = (Extent(conv.page, conv.offset // u, sh.conv_elems),)
        elif isinstance(conv, ConvPages):
            ext = lay_over_pages(conv.pages, sh.conv_elems, elems)
        elif isinstance(conv, ConvSlot):
            if conv.slot_bytes < sh.conv_elems * u:
                raise ValueError(f"a {conv.slot_bytes}-byte slot cannot hold the conv state")
            ext = (Extent(conv.slab, conv.slot * conv.slot_bytes // u, sh.conv_elems),)
        else:
            raise ValueError("the torch engine needs a model with conv state")
        return StatePlacement(ssm=ssm, conv=ext)

    def gather(self, p: OrgPlacement) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of the state at ``p``: ``(ssm [layers, H, P, N], conv [layers, C, K-1])``."""
        return gather_state(self.tensors[p.pool], self.placement(p), self.shapes)

    def scatter(self, p: OrgPlacement, ssm: torch.Tensor, conv: torch.Tensor) -> None:
        """Write a state into the pages of ``p``."""
        scatter_state(self.tensors[p.pool], self.placement(p), ssm, conv)

    def tables(self, placements: list[OrgPlacement]) -> tuple[torch.Tensor, StateTables]:
        """The pool and page tables of a decode batch's states, for the state
        kernels (`adapters.torch.kernels`): every placement in one pool (None: a row with no state)."""
        pools = {p.pool for p in placements if p is not None}
        if len(pools) != 1:
            raise ValueError(f"a decode batch's states lie in one pool, not {sorted(pools)}")
        pool = pools.pop()
        sh = self.shapes
        placements = [None if p is None else self._rows_of(p) for p in placements]
        return self.tensors[pool], build_tables(
            placements, self.capacity.pools[pool].page_bytes, self.unit, sh.ssm_elems,
            sh.conv_elems, self.device)

    def copy(self, src: OrgPlacement, dst: OrgPlacement) -> None:
        """Page-to-page copy of a checkpoint-sized object (an adopt or publish copy)."""
        ssm, conv = self.gather(src)
        self.scatter(dst, ssm, conv)

    def poison(self, pool: int, pages: list[int]) -> int:
        """Fill whole pages with NaN: whoever reads them afterwards computes NaN.
        In a region, pages not in the pool now have no storage and are skipped;
        how many pages were filled."""
        if self.slots is not None:
            pages = [r for r in (self.slots.row(pool, p) for p in pages) if r is not None]
        if pages:
            idx = torch.as_tensor(pages, device=self.device)
            self.tensors[pool][idx] = float("nan")
        return len(pages)

    def poison_all(self) -> None:
        """Fill all the storage with NaN."""
        for t in self.storage:
            t.fill_(float("nan"))
