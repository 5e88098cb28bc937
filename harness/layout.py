"""Physical layout of an organization, and where its pages and checkpoints fall.

An `OrgLayout` turns a `ModelGeometry` into page sizes and member counts
(DESIGN.md section 2); each organization defines its own (``layout_for`` in
`harness.orgs.s0` .. `harness.orgs.e0`) and budgets, the ledger and the
organizations all read it, none storing a size of its own. Where pages and
checkpoints fall is a `Grid`: the model geometry's rule (`rule_grid`), a
preset's or config.json's declared grid (``hbench_grid``), or an engine's
shape (`vllm_grid`, `sglang_grid`); `grid_for` picks one, so no model runs on
another's constants. docs/architecture.md, "Layouts and grids", tabulates
each organization's units in the study's pages and in vLLM's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.errors import HbenchError

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


#: Where a run's grid comes from (``--grid-from``): what the model declares
#: (a preset's, or a config.json's ``hbench_grid``; the rule where it declares
#: none), the geometry rule, or an engine's shape.
GRID_SOURCES = ("declared", "rule", "vllm", "sglang")
#: The rule's smallest block, and D0's attention block: 16 tokens, the KV
#: block of FlashAttention-style kernels and vLLM's default for attention.
RULE_MIN_BLOCK = 16
#: The rule's shared page is at most this fraction of an SSM state, so one
#: state spans at least this many pages (Falcon-H1-7B: exactly 3 of 512 KiB).
RULE_STATE_PAGES = 3
#: The rule's D0 checkpoint interval is a multiple of this many tokens.
RULE_GRID_STEP = 256
#: SGLang's ``--mamba-track-interval`` default: a state is kept every this many
#: decode tokens (none at intervals inside a prefill, only at its end).
SGLANG_TRACK_INTERVAL = 256
#: Largest block or grid hbench lays out (a page of a million tokens already
#: holds more than any model length).
MAX_GRID_TOKENS = 2**20
#: The three numbers of a grid, by the names a config.json's ``hbench_grid``
#: and a manifest's ``grid`` record use.
GRID_KEYS = ("shared_block_tokens", "dual_block_tokens", "dual_grid_tokens")


@dataclass(frozen=True, kw_only=True)
class Grid:
    """Where attention pages and checkpoints fall, in tokens, for every organization.

    ``shared_block_tokens``: S0/S1/S2's attention page, which is also their
    checkpoint grid. ``dual_block_tokens`` / ``dual_grid_tokens``: D0's (U0's,
    E0's) attention block and checkpoint interval, a multiple of the block.
    ``source`` says where the numbers came from, in words a run's title and
    manifest repeat (``geometry rule``, ``declared by preset falcon-h1-7b``,
    ``vLLM's block rule``, ``SGLang's track interval``, ...);
    ``overridden`` names the flags that replaced any of them.
    """

    shared_block_tokens: int
    dual_block_tokens: int
    dual_grid_tokens: int
    source: str
    overridden: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in GRID_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GRID_TOKENS:
                raise HbenchError(f"grid ({self.origin}): {key} must be a whole number of tokens "
                                  f"in [1, {MAX_GRID_TOKENS:,}], got {value!r}")
        if self.dual_grid_tokens % self.dual_block_tokens:
            raise HbenchError(f"grid ({self.origin}): dual_grid_tokens {self.dual_grid_tokens} must be "
                              f"a multiple of dual_block_tokens {self.dual_block_tokens}")

    @classmethod
    def from_record(cls, record, source: str) -> Grid:
        """A grid from a JSON object holding exactly `GRID_KEYS` (a config.json's
        ``hbench_grid``); a malformed one is a one-line HbenchError."""
        if not isinstance(record, dict) or set(record) != set(GRID_KEYS):
            raise HbenchError(f"{source}: hbench_grid must be an object with exactly the keys "
                              f"{', '.join(GRID_KEYS)} (tokens), got {record!r}")
        return cls(**record, source=source)

    def with_overrides(self, **tokens: int | None) -> Grid:
        """This grid with the given `GRID_KEYS` replaced (None keeps one); the
        flag of each replaced value joins ``overridden``."""
        given = {k: v for k, v in tokens.items() if v is not None}
        if not given:
            return self
        flags = tuple("--" + k.replace("_", "-") for k in GRID_KEYS if k in given)
        return replace(self, **given, overridden=self.overridden + flags)

    def tokens_for(self, dual_pool: bool) -> tuple[int, int]:
        """(attention block, checkpoint grid) of a shared-pool or a dual-pool organization."""
        if dual_pool:
            return self.dual_block_tokens, self.dual_grid_tokens
        return self.shared_block_tokens, self.shared_block_tokens

    @property
    def origin(self) -> str:
        """Where the grid came from, overrides included."""
        if not self.overridden:
            return self.source
        return f"{self.source}, overridden by {', '.join(self.overridden)}"

    def record(self) -> dict:
        """The manifest's ``grid`` record (plain JSON values)."""
        return {**{k: getattr(self, k) for k in GRID_KEYS}, "source": self.source,
                "overridden": list(self.overridden)}

    def describe(self, with_origin: bool = True) -> str:
        words = (f"S0/S1/S2 {self.shared_block_tokens}-token pages; D0 {self.dual_block_tokens}-token "
                 f"blocks, a checkpoint every {self.dual_grid_tokens} tokens")
        return f"{words} ({self.origin})" if with_origin else words


def rule_grid(geom) -> Grid:
    """The grid hbench derives from a model's geometry (bytes per pool layer):

    - shared page: the largest power of two >= `RULE_MIN_BLOCK` tokens whose
      attention page holds at most 1/`RULE_STATE_PAGES` of an SSM state (the
      smallest, 16, where even that page is larger; 16 with no SSM state);
    - D0 block: `RULE_MIN_BLOCK` tokens;
    - D0 grid: a checkpoint's bytes in attention tokens, rounded up to a
      multiple of `RULE_GRID_STEP` (at least one step).

    Falcon-H1-7B (1,024 B a token, SSM 1,572,864 B, checkpoint 1,594,368 B)
    gets the study's 512 (512 x 1,024 x 3 = 1,572,864) / 16 / 1792 (1,557
    tokens, rounded up)."""
    per_token = geom.slot_attn_bytes_per_token
    if per_token <= 0:
        raise HbenchError(f"{geom.name}: a grid needs attention bytes per token")
    shared = RULE_MIN_BLOCK
    while 2 * shared * per_token * RULE_STATE_PAGES <= geom.slot_ssm_bytes:
        shared *= 2
    steps = -(-geom.slot_checkpoint_bytes // (per_token * RULE_GRID_STEP))
    return Grid(shared_block_tokens=min(shared, MAX_GRID_TOKENS), dual_block_tokens=RULE_MIN_BLOCK,
                dual_grid_tokens=min(max(1, steps) * RULE_GRID_STEP, MAX_GRID_TOKENS),
                source="geometry rule")


def vllm_grid(geom, align: int = 16) -> Grid:
    """vLLM's shape: one block size for everything, raised until its attention
    page holds a whole state (`vllm_block_tokens`, at a CUDA vLLM's 16-token
    alignment), a state kept at each block edge (align mode)."""
    block = vllm_block_tokens(geom.slot_attn_bytes_per_token, geom.slot_checkpoint_bytes, align)
    block = min(block, MAX_GRID_TOKENS)
    return Grid(shared_block_tokens=block, dual_block_tokens=block, dual_grid_tokens=block,
                source="vLLM's block rule")


def sglang_grid(geom) -> Grid:
    """SGLang's shape: a state every `SGLANG_TRACK_INTERVAL` tokens (its
    ``--mamba-track-interval``), also the shared organizations' page; D0's
    attention in `RULE_MIN_BLOCK`-token blocks (SGLang's token pool pages
    by 1 token; hbench keeps 16 so a pool's page count stays small). SGLang
    keeps those states during decode and none at intervals inside a prefill;
    hbench publishes at the grid's boundaries as ``--ckpt-publish`` says."""
    return Grid(shared_block_tokens=SGLANG_TRACK_INTERVAL, dual_block_tokens=RULE_MIN_BLOCK,
                dual_grid_tokens=SGLANG_TRACK_INTERVAL, source="SGLang's track interval")


def grid_for(geom, grid_from: str = "declared") -> Grid:
    """The grid ``grid_from`` (`GRID_SOURCES`) names for ``geom``: what the
    model declares (``geom.declared_grid``; the rule where nothing is
    declared), the rule, or an engine's shape."""
    if grid_from == "declared":
        return geom.declared_grid or rule_grid(geom)
    makers = {"rule": rule_grid, "vllm": vllm_grid, "sglang": sglang_grid}
    if grid_from not in makers:
        raise HbenchError(f"unknown --grid-from {grid_from!r}; choose from {', '.join(GRID_SOURCES)}")
    return makers[grid_from](geom)


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
