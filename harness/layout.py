"""Physical layout of an organization: the shape every organization shares.

An `OrgLayout` turns a `ModelGeometry` into page sizes and member counts
(DESIGN.md section 2). Each organization defines its own layout in its module
(`harness.orgs.s0` .. `harness.orgs.d0`, method ``layout_for``); this module
holds the shared value type and the shared constants; `harness.orgs.layout_for`
finds an organization's layout through the registry. Budgets
(harness/budget.py), the allocation ledger (harness/ledger.py) and the
organizations (harness/orgs/) all read an `OrgLayout`; none stores a size of
its own.

Sizes are bytes per pool layer (see harness/geometry.py). For Falcon-H1-7B
(A = 512 KiB, C = 1557 KiB):

    org  attention unit           checkpoint members             grid
    S0   1 page of max(A, C)      1 page of max(A, C)            512
    S1   1 page of A              ceil(SSM/A) + ceil(conv/A)     512
    S2   1 page of A              ceil(SSM/A) pages + 1 slot     512
    D0   16-token block (A/32)    1 unit of C (own pool)         1792
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, kw_only=True)
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
    conv_pages: int = 0
    conv_slots: bool = False
    slot_bytes: int = 0
    slab_slots: int = 0
    dual_pool: bool = False
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
    def checkpoint_is_one_unit(self) -> bool:
        """A checkpoint is one page or unit holding SSM and conv state together
        (S0, D0), not member pages plus a conv page or slot (S1, S2)."""
        return self.ssm_pages == 1 and self.conv_pages == 0 and not self.conv_slots
