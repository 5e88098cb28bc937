"""S2, conv-slot packing: S1's SSM member pages, conv state in slab slots.

The conv state (21 KiB for Falcon-H1-7B) goes into a 32 KiB slot of a shared
512 KiB slab page (16 slots per slab) instead of a page of its own. Slots are
placed in the fullest referenced slab with room, so slabs stay densely
occupied; reclaiming a slab invalidates exactly the checkpoints whose slot it
holds (see `harness.orgs.slabs`).
"""

from __future__ import annotations

import math

from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout, slots_per_slab
from harness.orgs.base import Organization
from harness.orgs.split import SharedPages


class S2(Organization):
    name = "s2"
    pool_split = SharedPages()

    @staticmethod
    def layout_for(geom: ModelGeometry, grid: Grid) -> OrgLayout:
        ssm, conv = geom.slot_ssm_bytes, geom.slot_conv_bytes
        block = grid.shared_block_tokens
        page = block * geom.slot_attn_bytes_per_token
        slots = slots_per_slab(page, conv) if conv > 0 else 0
        return OrgLayout(org="s2", attn_block_tokens=block, grid_tokens=block,
                         attn_page_bytes=page, ckpt_page_bytes=page,
                         ssm_pages=math.ceil(ssm / page), conv_slots=conv > 0,
                         slot_bytes=page // slots if slots else 0, slab_slots=slots,
                         attn_block_bytes=page, ssm_bytes=ssm, conv_bytes=conv)
