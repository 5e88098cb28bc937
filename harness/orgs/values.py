"""Values an organization hands out or keeps per object and per request.

`PrefixHit`, `Demand` and `Usage` cross the door to the scheduler and the
engines; `Entry` and `RequestState` stay inside `harness.orgs` (only
`Organization` and its audit touch their fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.orgs.slabs import NO_SLOT

ATTN_ENTRY, CKPT_ENTRY = "attn", "ckpt"


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
    """Pages per pool an allocation would take from the free queues."""

    pages: tuple[int, ...]


class Entry:
    __slots__ = ("id", "kind", "key", "pos", "members", "slot", "pages", "refs", "pins",
                 "retains", "valid", "generations")

    def __init__(self, eid: int, kind: str, members: list[tuple[int, int]], slot=NO_SLOT):
        self.id = eid
        self.kind = kind
        self.key: int | None = None   # set when registered for lookup
        self.pos = 0                  # tokens covered ([0, pos) prefix)
        self.members = members        # (pool index, page)
        self.slot = slot              # SlotRef or NO_SLOT
        self.pages: tuple[tuple[int, int], ...] = ()   # members + conv slab; set by the org
        self.refs = 0
        self.pins = 0
        self.retains = 0
        self.valid = True
        self.generations: tuple[int, ...] = ()   # of its pages when it was built

    @property
    def held(self) -> bool:
        return self.pins > 0 or self.retains > 0

    def __repr__(self) -> str:
        return (f"Entry({self.id}, {self.kind}, pos={self.pos}, refs={self.refs}, "
                f"pins={self.pins}, retains={self.retains}, valid={self.valid})")


@dataclass
class RequestState:
    """What an organization tracks for one admitted request (private to it)."""

    attn: list[Entry] = field(default_factory=list)   # block i covers [i*B, (i+1)*B)
    live: Entry | None = None
    spares: list[Entry] = field(default_factory=list)
    adopted: Entry | None = None
    published: list[Entry] = field(default_factory=list)
    on_path: list[Entry] = field(default_factory=list)   # adopted, or published by another
    retained: list[Entry] = field(default_factory=list)
    reserved_until: int = 0    # grid boundaries <= this have a spare or were published
    computed: int = 0


@dataclass(frozen=True)
class Usage:
    """Blocks and bytes by state kind and state, per pool layer."""

    pages: dict            # {pool: {"referenced": n, "cached": n, "free": n}}
    pages_by_kind: dict    # {kind: {"referenced": n, "cached": n}}
    bytes_by_kind: dict    # {kind: {"referenced": B, "cached": B}} logical state bytes
    waste_by_kind: dict    # {kind: B} allocated minus logical bytes over pages holding content
    slab_occupancy: float
    invalidations: int
