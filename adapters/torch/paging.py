"""Where request state lives: page tensors, K/V block views, checkpoint placement.

Every pool is one float32 tensor ``[pages, layers, page_elems]``: page ``p``
holds ``page_elems`` elements at the same offset in every layer (a page of a
pool spans all layers, as hbench's organizations count pages per pool layer).
The model reads and writes state only through the views and helpers here, so
an organization decides the layout by choosing page sizes and placements:

* Attention block ``j`` of a request (token positions ``[j * block, (j + 1) *
  block)``) is page ``block_table[j]``, viewed by `kv_view` as
  ``[pages, layers, 2 (K, V), block_tokens, kv_heads, head_dim]`` over the
  first ``2 * block_tokens * kv_heads * head_dim`` elements of each page (a
  larger page, as S0's coarse pages, leaves the rest unused).
* A checkpoint (SSM state ``[layers, heads, head_dim, d_state]`` and conv
  state ``[layers, conv_dim, d_conv - 1]``) is a `StatePlacement`: each part
  a sequence of `Extent` (page, offset, length), in elements per layer. One
  contiguous unit (D0, S0) is one extent per part; S1 lays the SSM state over
  member pages with `lay_over_pages` and the conv state on its own page; S2
  puts the conv state at a slot offset in a shared slab page.

`gather_state` copies a placement into contiguous tensors the model computes
on; `scatter_state` writes them back. Decode may do this every step; the
model itself never sees a page.

Sizes here are float32 elements. hbench's geometry counts bf16 bytes, so an
organization's page of ``B`` bytes is ``B / 2`` elements here (the tensors
take twice the bytes; every ratio between state kinds is the same).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adapters.torch.config import FalconH1Config


@dataclass(frozen=True)
class StateShapes:
    """Per-layer shapes of one request's state; element counts are derived."""

    n_layers: int
    kv_heads: int
    head_dim: int
    ssm_heads: int
    ssm_head_dim: int
    d_state: int
    conv_dim: int
    conv_width: int

    @classmethod
    def of(cls, cfg: FalconH1Config) -> StateShapes:
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                   cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state, cfg.conv_dim,
                   cfg.conv_width)

    @property
    def kv_token_elems(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.kv_heads * self.head_dim

    def kv_block_elems(self, block_tokens: int) -> int:
        return block_tokens * self.kv_token_elems

    @property
    def ssm_shape(self) -> tuple[int, int, int, int]:
        return (self.n_layers, self.ssm_heads, self.ssm_head_dim, self.d_state)

    @property
    def conv_shape(self) -> tuple[int, int, int]:
        return (self.n_layers, self.conv_dim, self.conv_width)

    @property
    def ssm_elems(self) -> int:
        """SSM state elements per layer."""
        return self.ssm_heads * self.ssm_head_dim * self.d_state

    @property
    def conv_elems(self) -> int:
        """Conv state elements per layer."""
        return self.conv_dim * self.conv_width

    @property
    def checkpoint_elems(self) -> int:
        return self.ssm_elems + self.conv_elems

    def zero_state(self, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh (all-zero) SSM and conv state: the state before token 0."""
        lead = () if batch is None else (batch,)
        return torch.zeros(*lead, *self.ssm_shape), torch.zeros(*lead, *self.conv_shape)


def page_pool(pages: int, layers: int, page_elems: int) -> torch.Tensor:
    """A zeroed pool ``[pages, layers, page_elems]``."""
    return torch.zeros(pages, layers, page_elems, dtype=torch.float32)


def kv_view(pool: torch.Tensor, shapes: StateShapes, block_tokens: int) -> torch.Tensor:
    """The pool's pages seen as K/V blocks ``[pages, layers, 2, block, kv_heads, head_dim]``.

    A view: writing through it writes the pool.
    """
    n = shapes.kv_block_elems(block_tokens)
    if n > pool.shape[-1]:
        raise ValueError(f"a {block_tokens}-token K/V block needs {n} elements per layer; "
                         f"pages hold {pool.shape[-1]}")
    return pool[:, :, :n].unflatten(-1, (2, block_tokens, shapes.kv_heads, shapes.head_dim))


def write_kv(kv: torch.Tensor, layer: int, block_table: Sequence[int], start_pos: int,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Store K and V ``[T, kv_heads, head_dim]`` of positions ``start_pos ..`` in their blocks."""
    block = kv.shape[3]
    pos, end = start_pos, start_pos + k.shape[0]
    if (end + block - 1) // block > len(block_table):
        raise ValueError(f"positions up to {end} need more than the {len(block_table)} "
                         f"blocks of {block} tokens in the block table")
    while pos < end:
        j, off = divmod(pos, block)
        n = min(block - off, end - pos)
        page = kv[block_table[j], layer]
        page[0, off:off + n] = k[pos - start_pos:pos - start_pos + n]
        page[1, off:off + n] = v[pos - start_pos:pos - start_pos + n]
        pos += n


def write_kv_tokens(kv: torch.Tensor, layer: int, pages: torch.Tensor, offsets: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor) -> None:
    """Store one token per request: K and V ``[b, kv_heads, head_dim]`` at ``pages[r], offsets[r]``."""
    kv[pages, layer, 0, offsets] = k
    kv[pages, layer, 1, offsets] = v


def block_table_tensor(block_tables: Sequence[Sequence[int]]) -> torch.Tensor:
    """Block tables as one ``[b, longest]`` index tensor, short rows padded with page 0.

    Padding entries are never read unmasked: a block past a request's last
    position holds only future keys.
    """
    width = max(len(t) for t in block_tables)
    return torch.tensor([list(t) + [0] * (width - len(t)) for t in block_tables],
                        dtype=torch.long)


@dataclass(frozen=True)
class Extent:
    """``length`` elements per layer at ``offset`` in page ``page``."""

    page: int
    offset: int
    length: int


@dataclass(frozen=True)
class StatePlacement:
    """Where one checkpoint's SSM and conv parts lie, in order."""

    ssm: tuple[Extent, ...]
    conv: tuple[Extent, ...]


def lay_over_pages(pages: Sequence[int], length: int, page_elems: int,
                   offset: int = 0) -> tuple[Extent, ...]:
    """``length`` elements filling ``pages`` in order, starting at ``offset`` in the first.

    Raises ValueError if the pages cannot hold them or some page would stay unused.
    """
    if not 0 <= offset < page_elems:
        raise ValueError(f"offset {offset} is outside a page of {page_elems} elements")
    need = math.ceil((offset + length) / page_elems)
    if need != len(pages):
        raise ValueError(f"{length} elements from offset {offset} fill {need} pages of "
                         f"{page_elems}, not {len(pages)}")
    out, left = [], length
    for i, page in enumerate(pages):
        start = offset if i == 0 else 0
        n = min(page_elems - start, left)
        out.append(Extent(page, start, n))
        left -= n
    return tuple(out)


def contiguous_placement(page: int, shapes: StateShapes, offset: int = 0) -> StatePlacement:
    """A checkpoint as one unit: SSM state then conv state in one page (S0, D0)."""
    return StatePlacement(ssm=(Extent(page, offset, shapes.ssm_elems),),
                          conv=(Extent(page, offset + shapes.ssm_elems, shapes.conv_elems),))


def gather(pool: torch.Tensor, extents: Sequence[Extent]) -> torch.Tensor:
    """The extents' elements in order, ``[layers, total length]`` (a copy)."""
    return torch.cat([pool[e.page, :, e.offset:e.offset + e.length] for e in extents], dim=-1)


def scatter(pool: torch.Tensor, extents: Sequence[Extent], values: torch.Tensor) -> None:
    """Write ``values [layers, total length]`` into the extents, in order."""
    total = sum(e.length for e in extents)
    if values.shape[-1] != total:
        raise ValueError(f"{values.shape[-1]} elements per layer for extents holding {total}")
    pos = 0
    for e in extents:
        pool[e.page, :, e.offset:e.offset + e.length] = values[:, pos:pos + e.length]
        pos += e.length


def gather_state(pool: torch.Tensor, placement: StatePlacement, shapes: StateShapes
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A checkpoint copied out of its pages: ``(ssm [layers, H, P, N], conv [layers, C, K-1])``."""
    ssm = gather(pool, placement.ssm).reshape(shapes.ssm_shape)
    conv = gather(pool, placement.conv).reshape(shapes.conv_shape)
    return ssm, conv


def scatter_state(pool: torch.Tensor, placement: StatePlacement, ssm: torch.Tensor,
                  conv: torch.Tensor) -> None:
    """Write a checkpoint back into its pages (the inverse of `gather_state`)."""
    scatter(pool, placement.ssm, ssm.reshape(ssm.shape[0], -1))
    scatter(pool, placement.conv, conv.reshape(conv.shape[0], -1))
