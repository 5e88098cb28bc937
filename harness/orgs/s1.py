"""S1, paged checkpoints: one pool of attention-sized pages.

An attention block takes one page of A bytes; a checkpoint is scattered over
ceil(SSM / A) SSM member pages plus ceil(conv / A) dedicated conv pages
(Falcon-H1-7B: 3 + 1 pages = 2048 KiB for 1557 KiB of state). The checkpoint
is logically atomic: reclaiming any member page invalidates all of it.
"""

from __future__ import annotations

import math

from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout
from harness.orgs.base import Organization
from harness.orgs.split import SharedPages


class S1(Organization):
    name = "s1"
    pool_split = SharedPages()

    @staticmethod
    def layout_for(geom: ModelGeometry, grid: Grid) -> OrgLayout:
        ssm, conv = geom.slot_ssm_bytes, geom.slot_conv_bytes
        block = grid.shared_block_tokens
        page = block * geom.slot_attn_bytes_per_token
        return OrgLayout(org="s1", attn_block_tokens=block, grid_tokens=block,
                         attn_page_bytes=page, ckpt_page_bytes=page,
                         ssm_pages=math.ceil(ssm / page), conv_pages=math.ceil(conv / page),
                         attn_block_bytes=page, ssm_bytes=ssm, conv_bytes=conv)
