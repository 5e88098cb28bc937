"""What the plugin is asked to do, and the page arithmetic it derives.

hbench's launcher describes the organization in environment variables (the
only channel that reaches all three of vLLM's processes on CPU: API server,
engine core, worker); `plan_from_env` reads them back. With ``HBENCH_ORG``
unset the plugin is inert. Nothing here imports vLLM, so the arithmetic is
tested without it.

Pages are vLLM blocks. vLLM 0.32 gives every KV-cache group one page size,
with the attention page at least as large as a full Mamba state
(``Platform.update_block_size_for_backend`` in ``vllm/platforms/interface.py``
raises the attention block size until it is), and the worker reads one full
Mamba state per block id. So the plugin cannot shrink a page; it charges each
object the organization's *number* of pages from the same pool:

    S1: carrier + (k - 1) member pages, k = ceil(SSM / grid page)
        + ceil(conv / grid page)
    S2: carrier + (k - 1) member pages, k = ceil(SSM state / grid page),
        plus one slot of a slab page for the conv state (as many slots as
        `harness.layout.slots_per_slab` fits: 16 for Falcon-H1)
    D0: one block of a private checkpoint pool; attention keeps the rest
        (`harness.orgs.split.vllm_d0_split`)

where the grid page is the attention bytes of ``grid_tokens`` tokens (512 in
the study). The carrier's block id is the one the kernel reads. These are the
study's page counts (harness/orgs/s1.py, s2.py); the simulator lays the same
counts out in vLLM's blocks with ``--paging vllm`` (harness/layout.py), which
is how a plugin run and a simulated run serve the same memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import HbenchError
from harness.layout import slots_per_slab
from harness.orgs import check_attn_fraction, vllm_d0_split

#: the vLLM release whose allocator internals the plugin was written against
VLLM_VERSION = "0.32.0"
#: organizations the plugin expresses (S0 is stock vLLM: no plugin needed)
PLUGIN_ORGS = ("s1", "s2", "d0")
#: What each organization is inside vLLM 0.32, in the words every report uses.
#: vLLM gives all KV-cache groups one page size with the attention page at least
#: a whole Mamba state, and its Mamba layers read one state per block id, so
#: the plugin's S1/S2 charge the study's page counts in vLLM-sized pages while
#: the kernel reads the state from the carrier block (docs/engines.md, "Why the
#: plugin's S1/S2 are not physical").
ORG_EXPRESSION = {
    "s0": "stock vLLM: one shared pool of equal pages",
    "s1": "allocator policy at vLLM's page size: carrier + member pages, each a whole vLLM "
          "block; the Mamba kernel reads the state from the carrier (not the study's "
          "small-page S1)",
    "s2": "allocator policy at vLLM's page size: carrier + member pages + a slab slot, each "
          "page a whole vLLM block; the Mamba kernel reads the state from the carrier (not "
          "the study's small-page S2)",
    "d0": "two static pools as disjoint block-id ranges of vLLM's one pool, at vLLM's block "
          "size (not 16-token attention blocks)",
}
DEFAULT_GRID_TOKENS = 512
DEFAULT_D0_ATTN_FRACTION = 0.5

ENV_ORG = "HBENCH_ORG"
ENV_GRID = "HBENCH_GRID_TOKENS"
ENV_D0_FRACTION = "HBENCH_D0_ATTN_FRACTION"
ENV_D0_ALIAS = "HBENCH_D0_ALIAS_IDS"   # negative control: D0 pools share block ids (bytes)
# negative control: S1/S2 hand the kernel another live checkpoint's page for a state
ENV_STATE_ALIAS = "HBENCH_STATE_ALIAS_IDS"
#: The environment variable that turns each organization into its negative
#: control: the same capacities and page counts, the state bytes placed where
#: another owner's are, so outputs must change (`hbench verify`'s control).
ALIAS_ENV = {"d0": ENV_D0_ALIAS, "s1": ENV_STATE_ALIAS, "s2": ENV_STATE_ALIAS}
#: Each negative control's name and what it does, in the words `hbench verify` prints.
ALIAS_LABEL = {"d0": "aliased ids", "s1": "aliased states", "s2": "aliased states"}
ALIAS_CONTROL = {
    "d0": "aliased ids: the private pool numbers its blocks from 1, over attention's bytes",
    "s1": "aliased states: every checkpoint's state read and written at the oldest live "
          "checkpoint's carrier page",
    "s2": "aliased states: every checkpoint's state read and written at the oldest live "
          "checkpoint's carrier page",
}


class PlanError(ValueError):
    """The environment names an organization or value the plugin cannot express."""


@dataclass(frozen=True)
class Plan:
    """The organization the plugin enforces, as hbench's launcher named it."""

    org: str
    grid_tokens: int = DEFAULT_GRID_TOKENS
    d0_attn_fraction: float = DEFAULT_D0_ATTN_FRACTION
    d0_alias_ids: bool = False
    state_alias_ids: bool = False     # S1/S2's negative control (`pages.MemberPagesMixin`)

    def __post_init__(self):
        if self.org not in PLUGIN_ORGS:
            raise PlanError(f"{ENV_ORG}={self.org!r}: the plugin expresses {', '.join(PLUGIN_ORGS)}")
        # a control that silently did nothing would let a check pass that must fail
        if self.d0_alias_ids and self.org != "d0":
            raise PlanError(f"{ENV_D0_ALIAS} is D0's negative control, not {self.org}'s; "
                            f"{self.org} uses {ALIAS_ENV[self.org]}")
        if self.state_alias_ids and self.org not in ("s1", "s2"):
            raise PlanError(f"{ENV_STATE_ALIAS} is S1's and S2's negative control, not "
                            f"{self.org}'s; {self.org} uses {ALIAS_ENV[self.org]}")
        if self.grid_tokens < 1:
            raise PlanError(f"{ENV_GRID} must be a positive token count, got {self.grid_tokens}")
        try:
            check_attn_fraction(self.d0_attn_fraction, ENV_D0_FRACTION)
        except HbenchError as exc:
            raise PlanError(str(exc)) from None

    def env(self) -> dict[str, str]:
        """The environment that makes a vLLM server's plugin enforce this plan."""
        out = {ENV_ORG: self.org, ENV_GRID: str(self.grid_tokens)}
        if self.org == "d0":
            out[ENV_D0_FRACTION] = repr(self.d0_attn_fraction)
        if self.d0_alias_ids or self.state_alias_ids:
            out.update(alias_env(self.org))
        return out


def alias_env(org: str) -> dict[str, str]:
    """The environment that makes ``org``'s plugin serve its negative control."""
    if org not in ALIAS_ENV:
        raise PlanError(f"{org} has no negative control; the plugin's are for "
                        f"{', '.join(ALIAS_ENV)}")
    return {ALIAS_ENV[org]: "1"}


def plan_from_env(environ: Mapping[str, str] | None = None) -> Plan | None:
    """The plan named by ``environ`` (default ``os.environ``), or None: inert."""
    environ = os.environ if environ is None else environ
    org = environ.get(ENV_ORG, "").strip().lower()
    if not org:
        return None
    try:
        grid = int(environ.get(ENV_GRID, DEFAULT_GRID_TOKENS))
        frac = float(environ.get(ENV_D0_FRACTION, DEFAULT_D0_ATTN_FRACTION))
    except ValueError as exc:
        raise PlanError(f"bad hbench plugin setting: {exc}") from None
    return Plan(org, grid, frac, environ.get(ENV_D0_ALIAS, "") == "1",
                environ.get(ENV_STATE_ALIAS, "") == "1")


@dataclass(frozen=True)
class PageLayout:
    """Pages one checkpoint costs under an organization, derived from byte sizes.

    ``ssm_bytes`` and ``conv_bytes`` are one layer's recurrent state halves;
    ``attn_bytes_per_token`` one layer's attention KV per token.
    """

    org: str
    ssm_bytes: int
    conv_bytes: int
    attn_bytes_per_token: int
    grid_tokens: int

    @property
    def grid_page_bytes(self) -> int:
        return self.attn_bytes_per_token * self.grid_tokens

    @property
    def checkpoint_bytes(self) -> int:
        return self.ssm_bytes + self.conv_bytes

    @property
    def pages_per_checkpoint(self) -> int:
        """Pages a checkpoint takes from the shared pool, carrier included
        (slab pages for S2 conv slots are counted separately)."""
        page = self.grid_page_bytes
        if self.org == "s1":
            return math.ceil(self.ssm_bytes / page) + math.ceil(self.conv_bytes / page)
        if self.org == "s2":
            return math.ceil(self.ssm_bytes / page)
        return 1

    @property
    def slab_slots(self) -> int:
        """Slots per S2 slab page (0 without slabs)."""
        return slots_per_slab(self.grid_page_bytes, self.conv_bytes) if self.uses_slabs else 0

    @property
    def slot_bytes(self) -> int:
        return self.grid_page_bytes // self.slab_slots if self.uses_slabs else 0

    @property
    def uses_slabs(self) -> bool:
        return self.org == "s2"

    def check(self) -> None:
        if self.uses_slabs and self.conv_bytes > self.slot_bytes:
            raise PlanError(f"s2: a conv state of {self.conv_bytes} B does not fit a slot of "
                            f"{self.slot_bytes} B (grid page / {self.slab_slots})")
        if self.pages_per_checkpoint < 1:
            raise PlanError(f"{self.org}: a checkpoint must take at least one page")


def d0_split(num_blocks: int, attn_fraction: float) -> tuple[int, int]:
    """(attention blocks, checkpoint blocks) for D0 from vLLM's ``num_blocks``:
    `harness.orgs.split.vllm_d0_split`, the split the simulator's ``--paging vllm``
    uses too (block 0 is vLLM's null block)."""
    try:
        return vllm_d0_split(num_blocks, attn_fraction)
    except HbenchError as exc:
        raise PlanError(str(exc)) from None
