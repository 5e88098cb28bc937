"""S0, coarse shared pages: one pool of checkpoint-sized pages.

Every object takes one page of max(A, C) bytes: a 512-token attention block
uses A of it (for Falcon-H1-7B 512 of 1557 KiB; 1045 KiB wasted) and a
checkpoint fills it, its conv state right after its SSM state. This is what
stock vLLM does when it pads attention and Mamba pages to one size. Nothing
here but the layout: `harness.orgs.base` does the rest.
"""

from __future__ import annotations

from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout
from harness.orgs.base import Organization
from harness.orgs.split import SharedPages


class S0(Organization):
    name = "s0"
    pool_split = SharedPages()
    vllm_preempt_pin = "none"    # vLLM serves S0 stock: a preemption pins nothing

    @staticmethod
    def layout_for(geom: ModelGeometry, grid: Grid) -> OrgLayout:
        ssm, conv = geom.slot_ssm_bytes, geom.slot_conv_bytes
        block = grid.shared_block_tokens
        attn = block * geom.slot_attn_bytes_per_token
        page = max(attn, ssm + conv)
        return OrgLayout(org="s0", attn_block_tokens=block, grid_tokens=block,
                         attn_page_bytes=page, ckpt_page_bytes=page,
                         ssm_pages=1 if ssm + conv else 0,
                         attn_block_bytes=attn, ssm_bytes=ssm, conv_bytes=conv)
