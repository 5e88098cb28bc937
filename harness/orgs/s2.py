"""S2, conv-slot packing: S1's SSM member pages, conv state in slab slots.

The conv state (21 KiB for Falcon-H1-7B) goes into a 32 KiB slot of a shared
512 KiB slab page (16 slots per slab) instead of a page of its own. Slots are
placed in the fullest referenced slab with room, so slabs stay densely
occupied; reclaiming a slab invalidates exactly the checkpoints whose slot it
holds (see `harness.orgs.slabs`).
"""

from harness.orgs.base import Organization


class S2(Organization):
    name = "s2"
