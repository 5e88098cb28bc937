"""The page-table address rule of `adapters.torch.kernels.tables`, inside a kernel.

Each helper returns element offsets from one layer's pool base and the mask
of elements that exist (``False`` where the table holds the `NO_STATE`
sentinel, so the caller loads zeros and stores nothing). Offsets are int64:
a 7B pool layer holds more than 2**31 elements.

`paged` reads the page of every element from the request's table row (one
extra load per element, served from cache: rows are a few entries). When the
caller knows its whole tile lies in one page (``ONE_PAGE``, decided on the
host from the sizes) it passes the tile's first element and the table is
read once per program: the one extra indirection per decode step the study
prices in.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged(row_ptr, e, first, base, page_elems, page_stride, mask, ONE_PAGE: tl.constexpr):
    """Offsets of elements ``e`` (``base`` elements into the first page) of a
    state laid over the pages ``row_ptr[0], row_ptr[1], ...``."""
    pos = (base + e).to(tl.int64)
    if ONE_PAGE:
        q = (base + first) // page_elems
        page = tl.load(row_ptr + q).to(tl.int64)
        off = page * page_stride + pos - q * page_elems
        ok = mask & ((pos * 0 + page) >= 0)     # the scalar test, as a tile
    else:
        q = pos // page_elems
        page = tl.load(row_ptr + q, mask=mask, other=-1).to(tl.int64)
        off = page * page_stride + pos - q * page_elems
        ok = mask & (page >= 0)
    return off, ok


@triton.jit
def slot_row(row_ptr, e, slots, slot_elems, page_stride, mask):
    """Offsets of conv elements ``e`` in slot row ``row = slots x slab + slot``."""
    row = tl.load(row_ptr).to(tl.int64)
    slab = row // slots
    off = slab * page_stride + (row - slab * slots) * slot_elems + e
    return off, mask & ((e * 0 + row) >= 0)


@triton.jit
def direct(b, e, state_stride, mask):
    """Offsets in a contiguous ``[batch, state]`` tensor: the baseline, no table."""
    return b.to(tl.int64) * state_stride + e, mask
