"""Physical layout of an organization: the shape every organization shares.

An `OrgLayout` turns a `ModelGeometry` into page sizes and member counts
(DESIGN.md section 2). Each organization defines its own layout in its module
(`harness.orgs.s0` .. `harness.orgs.e0`, method ``layout_for``); this module
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
    U0   as D0, both pools the two ends of one region            1792
    E0   as D0, capacity moved between the pools on demand       1792

Those are the study's pages (``paging="study"``). vLLM 0.32 cannot shrink a
page: every block of its pool is one page whose attention part holds
``vllm_block_tokens`` tokens and is at least one Mamba state, and block 0 is
its null block. hbench's vLLM plugin (`adapters.vllm_plugin`) therefore
charges each object the organization's *number* of pages in those blocks;
``paging="vllm"`` (`OrgLayout.in_vllm_blocks`) is that layout, so the
simulator can serve the same memory as a plugin run at the same budget:

    org  attention unit      checkpoint                            grid
    S0   1 vLLM block        1 block                               block
    S1   1 vLLM block        ceil(SSM/A) + ceil(conv/A) blocks     block
    S2   1 vLLM block        ceil(SSM/A) blocks + 1 slab slot      block
    D0   1 vLLM block        1 block of a private pool             block

(A: the study's 512-token attention page, which sets the counts.)
States follow vLLM's align mode and its default retention too
(``publish_in_place``, `harness.orgs.publication`): at every block edge the running
state is the edge's state, and the request takes a new state object when it
computes past the edge; the edge's state is published where it is only at the
request's replay boundary and a shared-prefix junction (`kept_edges`), else
freed. A prefix computed again is cached twice, as vLLM caches every block
under its hash, and a preemption pins what the engine pins
(``preempt_pin``: the plugin its joint hit, stock vLLM nothing). The study
instead reserves a spare for each grid boundary of the prompt before the
chunk that reaches it and publishes them all. Here only edges a chunk ends on
are published (on CPU vLLM's chunk is one block, so every edge is one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: Attention block (and checkpoint grid) of the shared-pool organizations.
BLOCK_TOKENS = 512
#: D0's attention block and checkpoint interval (the study's values).
D0_BLOCK_TOKENS = 16
D0_GRID_TOKENS = 1792
#: How pages are laid out: the study's page sizes, or vLLM 0.32's blocks as
#: its CPU build resolves them (``vllm``) or as a CUDA vLLM does (``vllm-gpu``).
PAGINGS = ("study", "vllm", "vllm-gpu")
#: Each vLLM paging's block alignment: the CPU build's 128 tokens
#: (`VLLM_BLOCK_ALIGN`), or FlashAttention's 16-token kernel block, from
#: which a CUDA platform raises the hybrid block (``MultipleOf(16)``).
VLLM_PAGINGS = {"vllm": 128, "vllm-gpu": 16}
#: Organizations vLLM's scheduler in process lays out at the study's pages
#: unless --paging vllm is given (adapters/vllm_inprocess/config.py): hbench's
#: plugin charges their checkpoints in pages of the grid, which a served vLLM
#: cannot make smaller than a whole state.
VLLM_STUDY_PAGE_ORGS = ("s1", "s2")
#: vLLM's hybrid block grows in multiples of this many tokens (its kernel
#: alignment when --block-size is given; hbench passes it on CPU).
VLLM_BLOCK_ALIGN = 128


def vllm_block_tokens(attn_bytes_per_token: int, state_bytes: int,
                      align: int = VLLM_BLOCK_ALIGN) -> int:
    """vLLM 0.32's attention block for a hybrid model: the smallest multiple of
    ``align`` tokens whose attention page holds one whole Mamba state
    (``Platform._align_hybrid_block_size``, vllm/platforms/interface.py); the
    Mamba page is then padded up to the attention page."""
    if attn_bytes_per_token <= 0:
        raise ValueError("a vLLM block needs attention bytes per token")
    return align * max(1, -(-state_bytes // (align * attn_bytes_per_token)))


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
    #: The two pools are the two ends of one region (u0): a budget gives the
    #: region as one count of attention pages, and the organization splits it
    #: while serving (`harness.orgs.u0`).
    one_region: bool = False
    #: vLLM's align mode: the running state at a block edge *is* the state of
    #: that edge, published where it is if vLLM keeps it
    #: (`harness.orgs.publication.kept_edges`); a new state object is taken when the
    #: request computes past the edge. Otherwise (the study) a spare is
    #: reserved for every grid boundary of the prompt and all are published.
    publish_in_place: bool = False
    #: Whose pages these are (`PAGINGS`): the study's, or vLLM's blocks
    #: (`in_vllm_blocks`); budgets resolve by it (harness/budget.py).
    paging: str = "study"
    #: What a preemption pins until the request runs again (a key of
    #: `harness.orgs.pins.PIN_POLICIES`):
    #: the study pins the deepest valid checkpoint on the request's path;
    #: hbench's vLLM plugin its longest joint hit (the checkpoint and the
    #: attention blocks before it); stock vLLM nothing.
    preempt_pin: str = "checkpoint"
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

    def in_vllm_blocks(self, block_tokens: int, attn_bytes_per_token: int,
                       preempt_pin: str = "joint", paging: str = "vllm") -> OrgLayout:
        """This organization as hbench's vLLM plugin lays it out in vLLM's
        blocks of ``block_tokens`` tokens (module docstring): every attention
        block and every member page is one block of ``block_tokens x
        attn_bytes_per_token`` bytes, checkpoints fall on block edges, and the
        page counts (members per checkpoint, slots per slab) stay this
        layout's. Logical sizes are unchanged, so waste is counted against
        the real blocks. ``preempt_pin``: "joint" under the plugin, "none"
        for an organization vLLM serves stock (S0); ``paging`` the vLLM paging
        (`VLLM_PAGINGS`) the block comes from."""
        page = block_tokens * attn_bytes_per_token
        return replace(self, attn_block_tokens=block_tokens, grid_tokens=block_tokens,
                       attn_page_bytes=page, ckpt_page_bytes=page, publish_in_place=True,
                       paging=paging,
                       slot_bytes=page // self.slab_slots if self.conv_slots else 0,
                       attn_block_bytes=page, preempt_pin=preempt_pin)
