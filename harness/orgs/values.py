"""Frozen values an organization hands to the scheduler and to engines.

Everything here crosses the door out of `harness.orgs`: a scheduler reads
`PrefixHit` and `Demand`; an engine reads `Usage`, `Capacity` and the
placement values (`PageRef`, `StatePlacement`, `StateCopy`) that map each live
object to pages of the preallocated pools. None of them refers to an internal
object, so holding one can never keep storage alive or let a caller change it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrefixHit:
    """What a lookup found, in tokens.

    ``j_adopt``: deepest J with valid attention for [0, J) AND a valid
    checkpoint at J (what a request can reuse). ``r_max``: deepest valid
    checkpoint regardless of attention. ``attn_depth``: contiguous valid
    attention prefix from token 0.
    """

    j_adopt: int = 0
    r_max: int = 0
    attn_depth: int = 0
    # Adoption cost as of the organization state `version` (a lookup computes it
    # so that the asks that follow it need not walk the prefix again).
    version: int = field(default=-1, compare=False, repr=False)
    adopt_pages: tuple[int, ...] = field(default=(), compare=False, repr=False)
    adopt_slabs: frozenset = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class Demand:
    """Pages per pool an allocation would take from the free queues; of them,
    ``adopted`` per pool are cached pages the allocation adopts (not fresh)."""

    pages: tuple[int, ...]
    adopted: tuple[int, ...] = ()


@dataclass(frozen=True)
class Usage:
    """Blocks and bytes by state kind and state, per pool layer."""

    pages: dict            # {pool: {"referenced": n, "cached": n, "free": n}}
    pages_by_kind: dict    # {kind: {"referenced": n, "cached": n}}
    bytes_by_kind: dict    # {kind: {"referenced": B, "cached": B}} logical state bytes
    waste_by_kind: dict    # {kind: B} allocated minus logical bytes over pages holding content
    slab_occupancy: float
    invalidations: int


@dataclass(frozen=True)
class PoolInfo:
    """One preallocated pool: ``pages`` pages of ``page_bytes`` bytes per pool layer."""

    name: str
    pages: int
    page_bytes: int


@dataclass(frozen=True)
class Capacity:
    """What an engine must preallocate, and the token grids it schedules on."""

    pools: tuple[PoolInfo, ...]   # pool index i of every PageRef is pools[i]
    attn_block_tokens: int
    grid_tokens: int


@dataclass(frozen=True)
class RegionCapacity:
    """One region of ``region_bytes`` per pool layer that an organization splits
    between its two pools while serving (u0, e0: `harness.orgs.region`).

    ``pools[i].pages`` is how many page ids pool ``i`` has: the whole region's
    worth of its pages, of which the pool holds some now
    (`Organization.outside_pages` names the others). An engine preallocates
    the region once and places each pool's pages in it (the torch engine:
    `adapters.torch.region`)."""

    region_bytes: int
    pools: tuple[PoolInfo, ...]


@dataclass(frozen=True)
class PageRef:
    """Page ``page`` of pool ``pool`` (an index into `Capacity.pools`)."""

    pool: int
    page: int


@dataclass(frozen=True)
class ConvPages:
    """S1: the conv state fills dedicated pages, ``nbytes`` of it in all."""

    pages: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ConvSlot:
    """S2: the conv state sits in slot ``slot`` of slab page ``slab``; the slot
    spans bytes [slot x slot_bytes, (slot + 1) x slot_bytes) of that page."""

    slab: int
    slot: int
    slot_bytes: int


@dataclass(frozen=True)
class ConvInline:
    """S0, D0: the conv state follows the SSM state inside page ``page``,
    starting ``offset`` bytes into it."""

    page: int
    offset: int


@dataclass(frozen=True)
class StatePlacement:
    """Where one checkpoint-sized object (a live state or a checkpoint) lives.

    ``ssm`` lists the SSM member pages in state order with how many bytes of
    the SSM state each holds (the state is their concatenation); ``conv`` is
    the conv state's place, or None for a model without conv state.
    """

    pool: int
    ssm: tuple[tuple[int, int], ...]   # (page, bytes of the SSM state it holds)
    conv: ConvPages | ConvSlot | ConvInline | None

    def pages(self) -> tuple[int, ...]:
        """Every page of ``pool`` this object touches (a slab page counts once)."""
        out = [page for page, _ in self.ssm]
        if isinstance(self.conv, ConvPages):
            out.extend(self.conv.pages)
        elif isinstance(self.conv, ConvSlot):
            out.append(self.conv.slab)
        return tuple(out)

    def exclusive_pages(self) -> tuple[int, ...]:
        """The pages no other object may share: all but an S2 slab (whose slots
        are shared among up to `slab_slots` objects)."""
        if isinstance(self.conv, ConvSlot):
            return tuple(page for page, _ in self.ssm)
        return self.pages()


@dataclass(frozen=True)
class StateCopy:
    """A copy of the recurrent state at token ``position`` the engine must make.

    ``reason`` is ``"adopt"`` (on admission: the adopted checkpoint ``src``
    seeds the request's live state ``dst``) or ``"publish"`` (at a grid
    boundary the live object ``src`` became the published checkpoint; the
    request continues in the fresh live object ``dst``, which needs the same
    state; in place, at every block edge the request goes past, whether or
    not ``src`` was published there).
    """

    reason: str
    position: int
    src: StatePlacement
    dst: StatePlacement
