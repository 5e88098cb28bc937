"""Page tables for the state kernels: where each request's recurrent state lies.

The kernels never see an organization. They see one layer of a pool, a
``[pages, page_elems]`` view whose page stride is ``S_page = layers x
page_elems`` elements (`adapters.torch.pools`: a page spans every layer), and
per request one row of small integer tables. Element ``e`` of request ``b``'s
state in this layer is at

    SSM  (every organization)   table[b, q] x S_page + r,  q, r = divmod(e, page_elems)
    conv S0, D0 (inline)        page[b] x S_page + conv_base + e        (one page)
    conv S1 (own pages)         conv[b, q] x S_page + r,   q, r = divmod(e, page_elems)
    conv S2 (slot in a slab)    (row // slots) x S_page + (row % slots) x slot_elems + e,
                                row = slots x slab + slot

that is base + pi_b(j) x S_page + delta(j, u), with S2's conv rows numbered
``16 x slab + slot`` at Falcon-H1's sizes (a 32 KiB-class slot stride in a
512 KiB slab). S0 and D0 keep the whole checkpoint in one page, so their
tables have one column and the conv state follows the SSM state inline
(`StateTables.conv_base`); S0/D0/S1 conv addressing is the same rule with an
offset (mode `PAGES`), S2's is mode `SLOT`.

`NO_STATE` (-1) in a table is the invalid sentinel: "this request has no
state here". A kernel then reads zeros (the state before token 0) and
writes nothing; it never turns into page 0, slab 0 / slot 0 or a negative
offset. Row 0 (slab 0, slot 0) is a valid conv row like any other.

This module is plain torch (no Triton), so the engine can build tables on
any machine; `adapters.torch.kernels.addressing` evaluates them in a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.orgs.values import ConvInline, ConvPages, ConvSlot
from harness.orgs.values import StatePlacement as OrgPlacement

#: The invalid sentinel: no state (never page 0, never slab 0 / slot 0).
NO_STATE = -1

#: Conv addressing modes (a kernel's compile-time constant).
PAGES = 1      # page table plus an element offset in the first page (S0, S1, D0)
SLOT = 2       # one row ``slots x slab + slot`` per request (S2)


@dataclass(frozen=True)
class StateTables:
    """One decode batch's page tables (int32 tensors on the pool's device).

    ``ssm [b, members]``: the SSM member pages of each request in state order
    (one column for S0/D0); ``conv [b, n]``: conv pages (`PAGES`) or ``[b,
    1]`` conv rows (`SLOT`). Sizes are elements of the pool's dtype.
    """

    ssm: torch.Tensor
    conv: torch.Tensor
    conv_mode: int
    page_elems: int
    conv_base: int = 0          # PAGES: offset of conv element 0 in its first page
    slot_elems: int = 0         # SLOT: the slot stride
    slots: int = 0              # SLOT: slots per slab page

    @property
    def batch(self) -> int:
        return self.ssm.shape[0]

    def to(self, device) -> StateTables:
        return StateTables(self.ssm.to(device), self.conv.to(device), self.conv_mode,
                           self.page_elems, self.conv_base, self.slot_elems, self.slots)


def build_tables(placements: Sequence[OrgPlacement], page_bytes: int, unit: int,
                 ssm_elems: int, conv_elems: int, device="cpu") -> StateTables:
    """The tables of ``placements`` (one organization's, one pool of
    ``page_bytes``-byte pages, ``unit`` bytes per element); None in the list
    is a batch row with no state (`NO_STATE` everywhere).

    Raises ValueError for a batch mixing conv kinds or shapes, or a placement
    the rule above cannot express (an SSM state not starting at offset 0 of
    its first page, an inline conv state running past its page).
    """
    if page_bytes % unit:
        raise ValueError(f"{page_bytes}-byte pages are not whole {unit}-byte elements")
    page_elems = page_bytes // unit
    real = [p for p in placements if p is not None]
    if not real:
        raise ValueError("a batch needs at least one request with state")
    members = len(real[0].ssm)
    kinds = {type(p.conv) for p in real}
    if len(kinds) != 1 or {len(p.ssm) for p in real} != {members}:
        raise ValueError("every request of a batch must have the same state layout")
    kind = kinds.pop()
    if -(-ssm_elems // page_elems) != members:
        raise ValueError(f"{ssm_elems} SSM elements do not fill {members} pages of {page_elems}")
    ssm_rows, conv_rows = [], []
    mode, base, slot_elems, slots = PAGES, 0, 0, 0
    for p in placements:
        if p is None:
            ssm_rows.append([NO_STATE] * members)
            conv_rows.append(None)
            continue
        ssm_rows.append([page for page, _ in p.ssm])
        c = p.conv
        if kind is ConvInline:
            if c.offset % unit:
                raise ValueError(f"conv offset {c.offset} is not whole elements")
            if conv_rows and any(r is not None for r in conv_rows) and c.offset // unit != base:
                raise ValueError("inline conv states of one batch must share their offset")
            base = c.offset // unit
            if base + conv_elems > page_elems:
                raise ValueError("an inline conv state must fit in its page")
            conv_rows.append([c.page])
        elif kind is ConvPages:
            conv_rows.append(list(c.pages))
        elif kind is ConvSlot:
            mode = SLOT
            if c.slot_bytes % unit or c.slot_bytes < conv_elems * unit:
                raise ValueError(f"a {c.slot_bytes}-byte slot cannot hold the conv state")
            slot_elems = c.slot_bytes // unit
            slots = page_elems // slot_elems
            if not 0 <= c.slot < slots:
                raise ValueError(f"slot {c.slot} is outside a slab of {slots} slots")
            conv_rows.append([slots * c.slab + c.slot])
        else:
            raise ValueError("the state kernels need a model with conv state")
    width = max(len(r) for r in conv_rows if r is not None)
    conv_rows = [[NO_STATE] * width if r is None else r for r in conv_rows]
    as_t = {"dtype": torch.int32, "device": device}
    return StateTables(torch.tensor(ssm_rows, **as_t), torch.tensor(conv_rows, **as_t), mode,
                       page_elems, base, slot_elems, slots)
