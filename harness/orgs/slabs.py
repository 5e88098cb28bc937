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

    def choose(self, is_referenced) -> int | None:
        """Slab for a new slot: the fullest referenced slab with room, else the
        cached slab with the most room (it costs one page either way), else None
        (open a new slab). ``is_referenced(page)`` tells referenced from cached."""
        best_ref, best_cached = None, None
        for slab, occ in self.occupants.items():
            free = sum(1 for o in occ if o is None)
            if free == 0:
                continue
            if is_referenced(slab):
                key = (-(self.slots - free), slab)
                if best_ref is None or key < best_ref[0]:
                    best_ref = (key, slab)
            else:
                key = (-free, slab)
                if best_cached is None or key < best_cached[0]:
                    best_cached = (key, slab)
        if best_ref:
            return best_ref[1]
        return best_cached[1] if best_cached else None

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
        used = sum(self.used_slots(s) for s in self.occupants)
        return used / (self.slots * len(self.occupants))
