"""Physical layout of each organization, derived from the model geometry.

This is the one place that turns a `ModelGeometry` into page sizes and
member counts (DESIGN.md section 2). Budgets (harness/budget.py), the
allocation ledger (harness/ledger.py) and the organizations (harness/orgs/)
all read an `OrgLayout`; none stores a size of its own.

Sizes are bytes per pool layer (see harness/geometry.py). For Falcon-H1-7B
(A = 512 KiB, C = 1557 KiB):

    org  attention unit           checkpoint members             grid
    S0   1 page of max(A, C)      1 page of max(A, C)            512
    S1   1 page of A              ceil(SSM/A) + ceil(conv/A)     512
    S2   1 page of A              ceil(SSM/A) pages + 1 slot     512
    D0   16-token block (A/32)    1 unit of C (own pool)         1792
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.geometry import ModelGeometry

#: Attention block (and checkpoint grid) of the shared-pool organizations.
BLOCK_TOKENS = 512
#: D0's attention block and checkpoint interval (the study's values).
D0_BLOCK_TOKENS = 16
D0_GRID_TOKENS = 1792


def slots_per_slab(page_bytes: int, conv_bytes: int) -> int:
    """Largest power of two k such that a slot of page/k bytes holds a conv state."""
    if conv_bytes <= 0 or conv_bytes > page_bytes:
        return 1
    k = 1
    while page_bytes // (2 * k) >= conv_bytes and page_bytes % (2 * k) == 0:
        k *= 2
    return k


@dataclass(frozen=True)
class OrgLayout:
    """How one organization lays out attention blocks and checkpoints.

    ``attn_page_bytes`` / ``ckpt_page_bytes`` are the page sizes of the pools
    attention blocks and checkpoint members come from (the same pool unless
    ``dual_pool``). A checkpoint has ``ssm_pages`` SSM member pages plus either
    ``conv_pages`` dedicated conv pages or (``conv_slots``) one slot of
    ``slot_bytes`` in a slab of ``slab_slots`` slots.
    """

    org: str
    attn_block_tokens: int
    grid_tokens: int
    attn_page_bytes: int
    ckpt_page_bytes: int
    ssm_pages: int
    conv_pages: int
    conv_slots: bool
    slot_bytes: int
    slab_slots: int
    dual_pool: bool
    # logical sizes (what the bytes are for), to compute waste
    attn_block_bytes: int
    ssm_bytes: int
    conv_bytes: int

    @property
    def ckpt_pages(self) -> int:
        """Whole pages a checkpoint takes (slots not counted)."""
        return self.ssm_pages + self.conv_pages

    @property
    def checkpoint_bytes(self) -> int:
        return self.ssm_bytes + self.conv_bytes

    @property
    def ckpt_alloc_bytes(self) -> int:
        """Bytes a checkpoint holds, counting its slot (not the slab's spare slots)."""
        extra = self.slot_bytes if self.conv_slots else 0
        return self.ckpt_pages * self.ckpt_page_bytes + extra


def layout_for(org: str, geom: ModelGeometry) -> OrgLayout:
    """The layout of ``org`` (s0, s1, s2, d0) for ``geom``."""
    ssm, conv = geom.slot_ssm_bytes, geom.slot_conv_bytes
    ckpt = ssm + conv
    a512 = BLOCK_TOKENS * geom.slot_attn_bytes_per_token
    common = dict(ssm_bytes=ssm, conv_bytes=conv)
    if org == "s0":
        page = max(a512, ckpt)
        return OrgLayout("s0", BLOCK_TOKENS, BLOCK_TOKENS, page, page, 1 if ckpt else 0, 0,
                         False, 0, 0, False, attn_block_bytes=a512, **common)
    if org == "s1":
        return OrgLayout("s1", BLOCK_TOKENS, BLOCK_TOKENS, a512, a512, math.ceil(ssm / a512),
                         math.ceil(conv / a512), False, 0, 0, False, attn_block_bytes=a512,
                         **common)
    if org == "s2":
        k = slots_per_slab(a512, conv)
        has_conv = conv > 0
        return OrgLayout("s2", BLOCK_TOKENS, BLOCK_TOKENS, a512, a512, math.ceil(ssm / a512), 0,
                         has_conv, a512 // k if has_conv else 0, k if has_conv else 0, False,
                         attn_block_bytes=a512, **common)
    if org == "d0":
        a16 = D0_BLOCK_TOKENS * geom.slot_attn_bytes_per_token
        return OrgLayout("d0", D0_BLOCK_TOKENS, D0_GRID_TOKENS, a16, ckpt, 1 if ckpt else 0, 0,
                         False, 0, 0, True, attn_block_bytes=a16, **common)
    raise ValueError(f"unknown organization {org!r}")
