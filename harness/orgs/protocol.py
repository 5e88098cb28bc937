"""What a scheduler and an engine may ask of an organization, and nothing more.

A scheduler talks in request ids and token positions only; it never sees a
page. Per step it asks, then acts (asking changes nothing, so it can ask
before it preempts):

    hit = org.lookup(keys, max_tokens)                          # J_adopt, R_max, depth
    d   = org.pages_needed(rid, end, prefill_until, keys, hit)  # pages per pool
    if org.can_allocate(d, headroom):
        org.allocate(rid, end, prefill_until, keys, hit)        # adopts on first call
    ... the engine computes tokens ...
    org.commit(rid, keys, computed, prefill_until)   # registers blocks, publishes
    if org.retiring: org.end_step()                  # the step is over
    org.finish(rid) | org.preempt(rid) | org.abandon(rid)

(``retiring`` is only ever non-empty in vLLM's blocks, where an edge a request
continued past stays held past its step, until the request's next
``allocate``, as vLLM frees it.)

An engine that really computes keeps every pool of `capacity()` as one
preallocated tensor of ``pages x page_bytes`` and maps each live object to
bytes through read-only placement queries. Falcon-H1-7B under S2 (one shared
pool of 512 KiB pages, 16 conv slots of 32 KiB per slab):

    block_table(rid)      (0, 7) (0, 3) (0, 9)        tokens [0,512) [512,1024) ...
    live_state(rid)       pool 0, SSM pages 12 13 14 (512 + 512 + 512 KiB),
                          conv = ConvSlot(slab 4, slot 2, 32 KiB)

    pool 0:  | p3 attn | p4 slab [s0|s1|s2|..|s15] | p7 attn | p9 attn | p12 ssm | ...
                                   ^ conv of rid             ^ block 2

S1 puts the conv state in a page of its own (`ConvPages`); S0 and D0 keep it
inside the single member page, after the SSM state (`ConvInline` with its
byte offset). `Organization.checkpoint_at(keys, J)` places a cached
checkpoint the same way, or answers None.

U0 and e0 split one region between their two pools while serving
(`harness.orgs.region`): `region()` gives the region's bytes and each pool's
page ids, which stay fixed while the pages in each pool change
(`outside_pages(pool)` names the ids not in it now). An engine preallocates
the region once and places the pages in it (the torch engine:
`adapters.torch.region`); `region()` is None for the other organizations.

Copies. After `allocate` and after `commit`, `copies()` lists the state
copies that call asks of the engine, in order: on admission with J_adopt > 0,
the adopted checkpoint into the new live state (``"adopt"``); for each
checkpoint `commit` publishes, the published object (the former live state,
holding the state at the boundary) into the fresh live object that the
request continues in (``"publish"``). The simulator ignores them.

Invariants: `check_invariants()` (raises with the broken values),
`holds_no_references()`; `step_memory(layers)` samples what a step table
records. (`Organization.usage()` and `checkpoint_at` serve tests and tools;
no scheduler or engine calls them, so the protocol does not list them.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from harness.orgs.values import (
    Capacity,
    Demand,
    PageRef,
    PrefixHit,
    RegionCapacity,
    StateCopy,
    StatePlacement,
)

if TYPE_CHECKING:
    from harness.orgs.audit import StepMemory


@runtime_checkable
class OrganizationProtocol(Protocol):
    """What the scheduler (harness/scheduler/) and the engines (harness/engine/,
    adapters/sim/, adapters/torch/) use of an organization, exactly: a test
    derives the names they call from their source and compares
    (tests/unit/harness/orgs/test_protocol.py). `harness.orgs.base.Organization`
    implements it; tests and tools may use more of it (`usage`, `checkpoint_at`)."""

    name: str
    grid: int                 # checkpoint grid in tokens
    attn_block_tokens: int    # attention block in tokens
    in_place: bool            # publishes in place, at the edges vLLM keeps (`chunk_stop`)
    takes_keep_refusals: bool  # pages taken, nothing freed: a refusal stays a refusal
    retiring: list            # requests that went past a state this step (`end_step`)
    retired: set              # requests whose next `allocate` releases such a state

    # ---- asking: changes nothing
    def lookup(self, keys, max_tokens: int) -> PrefixHit: ...
    def pages_needed(self, rid, end: int, prefill_until: int, keys=None,
                     hit: PrefixHit | None = None, prompt_len: int | None = None) -> Demand: ...
    def can_allocate(self, demand: Demand, headroom: float = 0.0) -> bool: ...
    def available_pages(self) -> tuple[int, ...]: ...
    def is_admitted(self, rid) -> bool: ...
    def chunk_stop(self, rid, start: int, end: int, prefill_until: int,
                   hit: PrefixHit | None = None, prompt_len: int | None = None) -> int: ...
    def publishes(self, rid, start: int, end: int, prefill_until: int) -> tuple[int, ...]: ...
    def registers_again(self, rid, start: int, end: int) -> int | None: ...

    # ---- acting
    def allocate(self, rid, end: int, prefill_until: int, keys=None,
                 hit: PrefixHit | None = None, prompt_len: int | None = None) -> bool: ...
    def allocate_all(self, requests) -> bool: ...
    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]: ...
    def end_step(self) -> None: ...
    def retain(self, rid, position: int, keys) -> bool: ...
    def finish(self, rid) -> None: ...
    def preempt(self, rid) -> None: ...
    def abandon(self, rid) -> None: ...

    # ---- placement, for an engine that holds real memory
    def block_table(self, rid) -> tuple[PageRef, ...]: ...
    def live_state(self, rid) -> StatePlacement: ...
    def copies(self) -> tuple[StateCopy, ...]: ...
    def page_state(self, ref: PageRef) -> str: ...
    def page_lifecycle(self, pool: int) -> tuple[tuple[int, ...], frozenset[int]]: ...
    def capacity(self) -> Capacity: ...
    def region(self) -> RegionCapacity | None: ...
    def outside_pages(self, pool: int) -> frozenset[int]: ...
    def page_slots(self, kind: int) -> tuple[int, ...] | None: ...

    # ---- counters and checks
    moved_capacity_bytes: int    # bytes per pool layer moved between pools so far (e0)
    compacted_bytes: int         # bytes per pool layer compaction copied so far (u0)
    published_count: int
    invalidations_by_kind: dict[str, int]
    def watch_invalidations(self, log: list | None) -> None: ...
    def region_counters(self, layers: int) -> dict: ...
    def policy_counters(self) -> dict: ...
    def step_memory(self, layers: int) -> StepMemory: ...
    def twin(self, **policy_changes) -> OrganizationProtocol: ...
    def check_invariants(self) -> None: ...
    def holds_no_references(self) -> bool: ...
