"""S2 conv slots: 16 checkpoints' conv states packed into one shared page.

A slab is an ordinary page of the shared pool divided into ``slots`` slots.
The slab table only records which checkpoint entry occupies which slot; the
organization keeps the slab page's reference count (the sum of its occupants'
references) and hold count in the pool, and lists occupants as the page's
dependents, so reclaiming a slab invalidates exactly the checkpoints whose
conv state lives in it.

A checkpoint without a conv slot carries `NO_SLOT`, a sentinel that is not a
(slab, slot) pair at all: it cannot alias slab 0 / slot 0, and asking for its
address raises instead of yielding a negative offset.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlotRef:
    slab: int  # page id of the slab in the shared pool
    slot: int  # index within the slab


class _NoSlot:
    """The invalid-slot sentinel (falsy, not a SlotRef)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NO_SLOT"


NO_SLOT = _NoSlot()


def conv_row(ref: SlotRef | _NoSlot, slots_per_slab: int) -> int:
    """Execution view: conv rows are addressed as slots_per_slab x slab + slot."""
    if not isinstance(ref, SlotRef):
        raise ValueError("conv address of a checkpoint without a conv slot (NO_SLOT)")
    return slots_per_slab * ref.slab + ref.slot


class SlabTable:
    def __init__(self, slots: int):
        self.slots = slots
        self.occupants: dict[int, list[int | None]] = {}  # slab page -> entry id per slot

    def free_slots(self, slab: int) -> int:
        return sum(1 for o in self.occupants[slab] if o is None)

    def used_slots(self, slab: int) -> int:
        return self.slots - self.free_slots(slab)

    # ---- the one placement policy: asking (`pages_to_place`) and acting
    # (`choose`, one slot at a time) both follow `_rank` ------------------------
    def _rank(self, slab: int, free: int, is_referenced) -> tuple:
        """Preference of a slab with ``free`` > 0 slots (smaller is better): a
        referenced slab costs no page, the fullest first, so slabs stay dense;
        then the cached slab with the most room (it costs one page either way)."""
        if is_referenced(slab):
            return (0, free - self.slots, slab)
        return (1, -free, slab)

    def _candidates(self, is_referenced) -> list[tuple[tuple, int]]:
        """(`_rank`, free slots) of every slab with a free slot (`_rank` inlined)."""
        out = []
        slots = self.slots
        for slab, occ in self.occupants.items():
            free = occ.count(None)
            if free:
                out.append(((0, free - slots, slab) if is_referenced(slab)
                            else (1, -free, slab), free))
        return out

    def choose(self, is_referenced) -> int | None:
        """Slab for one new slot by `_rank`, or None (open a new slab).
        ``is_referenced(page)`` tells referenced slabs from cached ones."""
        cands = self._candidates(is_referenced)
        return min(cands)[0][2] if cands else None

    def pages_to_place(self, n: int, is_referenced) -> int:
        """Pages that placing ``n`` slots by `choose`, one after another, takes:
        each cached slab it fills and each new slab it opens costs one page. A
        chosen slab becomes referenced, so `choose` fills it before moving on:
        the walk in `_rank` order below is exactly that sequence."""
        pages = 0
        for (referenced, _, _), free in sorted(self._candidates(is_referenced)):
            if n <= 0:
                break
            n -= free
            pages += referenced   # 0 for a referenced slab, 1 for a cached one
        if n > 0:
            pages += -(-n // self.slots)
        return pages

    def open(self, slab: int) -> None:
        assert slab not in self.occupants, f"slab {slab} already open"
        self.occupants[slab] = [None] * self.slots

    def place(self, slab: int, entry_id: int) -> SlotRef:
        occ = self.occupants[slab]
        idx = occ.index(None)
        occ[idx] = entry_id
        return SlotRef(slab, idx)

    def vacate(self, ref: SlotRef, entry_id: int) -> bool:
        """Free a slot; True when the slab is now empty (and was dissolved)."""
        occ = self.occupants[ref.slab]
        assert occ[ref.slot] == entry_id, (
            f"slot {ref} holds {occ[ref.slot]}, not entry {entry_id}")
        occ[ref.slot] = None
        if all(o is None for o in occ):
            del self.occupants[ref.slab]
            return True
        return False

    def occupancy(self) -> float:
        """Used slots over slots of open slabs (NaN-free: 0.0 with no slabs)."""
        if not self.occupants:
            return 0.0
        total = self.slots * len(self.occupants)
        used = total - sum(occ.count(None) for occ in self.occupants.values())
        return used / total
