"""D0, native dual pools: a token-block attention pool and a checkpoint pool.

Attention lives in blocks (16 tokens) of its own pool; checkpoints are single
contiguous units of C bytes in a second pool, published every grid interval
(`harness.layout.Grid`: for Falcon-H1-7B 1792 tokens).
Both pool sizes are fixed at start by the budget split, and free space in one
pool can never serve the other: each `Demand` is checked per pool. This is
the layout SGLang uses (a Mamba state pool beside a token KV pool).
"""

from __future__ import annotations

from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout
from harness.orgs.base import Organization
from harness.orgs.split import DualPools


class D0(Organization):
    name = "d0"
    pool_split = DualPools()

    @staticmethod
    def layout_for(geom: ModelGeometry, grid: Grid) -> OrgLayout:
        ssm, conv = geom.slot_ssm_bytes, geom.slot_conv_bytes
        block = grid.dual_block_tokens * geom.slot_attn_bytes_per_token
        return OrgLayout(org="d0", attn_block_tokens=grid.dual_block_tokens,
                         grid_tokens=grid.dual_grid_tokens,
                         attn_page_bytes=block, ckpt_page_bytes=ssm + conv,
                         ssm_pages=1 if ssm + conv else 0, dual_pool=True,
                         attn_block_bytes=block, ssm_bytes=ssm, conv_bytes=conv)
