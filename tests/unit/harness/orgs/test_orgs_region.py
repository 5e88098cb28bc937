"""U0 and e0, the two organizations whose pools share one region
(`harness.orgs.region`): exact expectations on hand-built situations at the
Falcon-H1-7B geometry (attention block A = 16 KiB, checkpoint C = 1,594,368 B),
driven through the public protocol."""

from __future__ import annotations

import pytest

from adapters.registry import check_expressible
from harness.model_configs import preset
from harness.orgs import ORGANIZATIONS, build_organization, layout_for
from harness.orgs.keys import chain_keys
from harness.orgs.values import Demand

GEOM = preset("falcon-h1-7b")
A, C = 16 * 1024, 1_594_368


def pages(org) -> tuple[int, int]:
    """(attention pages, checkpoint units) in the two pools now."""
    return tuple(p.pages for p in org.capacity().pools)


def state(org):
    """Everything an allocation may change, for 'nothing changed' checks."""
    return (pages(org), org.available_pages(), org.usage().pages, org.version(),
            org.region_counters(1))


def test_u0_compacts_the_attention_side_for_a_checkpoint_across_the_gap():
    """A's blocks become 188 holes below B's 112 (slots 188-299); B's next chunk
    needs 112 blocks and two spares (one hole, and the gap of 825,344 B is less
    than a state's charge of 98 blocks). The attention side is compacted: B's
    112 blocks move into the lowest holes, slots 0-111, and 188 x A bytes join
    the gap; a spare takes the checkpoint hole, the other grows from the gap,
    the 112 blocks from it too (SGLang's relieve-then-allocate)."""
    org = build_organization(layout_for("u0", GEOM), (545,))
    assert pages(org) == (0, 0) and org.region_bytes == 545 * A
    assert org.allocate(0, 1000, 1000)          # A: 63 blocks, its live state
    assert org.allocate(0, 3000, 1000)          # A decodes: blocks up to 188
    assert org.allocate(1, 1791, 9000)          # B: 112 blocks, its live state
    assert pages(org) == (300, 2)
    b_blocks = [ref.page for ref in org.block_table(1)]
    assert sorted(org.page_slots(0).index(p) for p in b_blocks) == list(range(188, 300))
    org.abandon(0)                              # A's blocks: holes below B's
    org.check_invariants()
    gap = 545 * A - 300 * A - 2 * C
    assert gap == 825_344 < 98 * A
    # reach: 188 holes + (gap + the checkpoint hole) / A; 1 hole + (gap + 188 A) / 98 A
    assert org.available_pages() == (188 + (gap + C) // A, 1 + (gap + 188 * A) // (98 * A))
    before = state(org)
    demand = org.pages_needed(1, 3584, 9000)
    assert demand.pages == (112, 2)
    assert org.can_allocate(demand)
    assert state(org) == before, "asking changed the organization"
    assert org.allocate(1, 3584, 9000)
    org.check_invariants()
    assert pages(org) == (224, 3)
    assert sorted(org.page_slots(0).index(p) for p in b_blocks) == list(range(112))
    assert org.unassigned_bytes() == gap + 188 * A - C - 112 * A == 476_160
    assert org.region_counters(2) == {
        "alloc_refusals": 0, "alloc_refusals_with_room": 0, "fragmented_bytes_peak": 0,
        "compactions": 1, "compaction_moved_pages": 112, "compaction_moved_bytes": 2 * 112 * A,
        "donated_attention_pages": 0, "cascaded_checkpoints": 0}
    assert org.compacted_bytes == 112 * A


def test_u0_cached_attention_funds_a_state():
    """Region of 296 blocks: B (one block, its state) runs; A's finished
    1,600-token prompt leaves 100 cached blocks (released tail first) and a gap
    of 296 - 101 - 97.3125 = 97.6875 blocks, short of a state's charge of 98.
    C's 800-token request: the least recently released cached block (A's
    last; in slot 1, as a request's first block takes the highest slot grown)
    funds the state, and compaction moves the side's top page into its slot;
    then C's 50 blocks take the gap's one block and 49 more cached blocks."""
    org = build_organization(layout_for("u0", GEOM), (296,))
    assert org.allocate("b", 16, 16)
    keys = chain_keys(list(range(1600)), "a")
    assert org.allocate("a", 1600, 1600, keys, None)
    org.commit("a", keys, 1600, 1600)
    org.finish("a")
    assert pages(org) == (101, 1)
    assert org.unassigned_bytes() == 195 * A - C
    assert org.allocate("c", 800, 800, chain_keys(list(range(800)), "c"), None)
    org.check_invariants()
    assert pages(org) == (101, 2)
    assert org.invalidations_by_kind == {"attention": 50, "checkpoint": 0}
    assert org.lookup(keys, 1600).attn_depth == 50 * 16     # A's blocks 0-49 stay
    counters = org.region_counters(1)
    assert counters["donated_attention_pages"] == 1
    assert counters["compactions"] == 1 and counters["compaction_moved_pages"] == 1


def test_u0_a_cached_checkpoint_goes_with_the_block_it_ends():
    """Region of 320 blocks: a 2,000-token prompt takes 125 blocks, its live
    state and a spare (gap 0.375 blocks); finished, it leaves 125 cached blocks,
    its checkpoint at 1,792 cached and a checkpoint hole. A new request's state
    takes the hole; its 20 blocks evict the prompt's last 20 (blocks 105-124,
    released tail first). Block 111 ends at 1,792, so its checkpoint goes too
    (a SGLang node's KV and its Mamba state go together)."""
    org = build_organization(layout_for("u0", GEOM), (320,))
    keys = chain_keys(list(range(2000)), "a")
    assert org.allocate(0, 2000, 2000, keys, None)
    assert org.unassigned_bytes() == 320 * A - 125 * A - 2 * C == 6_144
    org.commit(0, keys, 2000, 2000)
    org.finish(0)
    assert pages(org) == (125, 2)
    assert org.lookup(keys, 2000).j_adopt == 1792
    assert org.allocate(1, 320, 320, chain_keys(list(range(320)), "b"), None)
    org.check_invariants()
    assert org.checkpoint_at(keys, 1792) is None
    assert org.invalidations_by_kind == {"attention": 20, "checkpoint": 1}
    assert org.region_counters(1)["cascaded_checkpoints"] == 1
    assert org.lookup(keys, 2000) == org.lookup(keys, 1680)   # blocks 0-104, no checkpoint
    assert org.lookup(keys, 2000).j_adopt == 0


@pytest.mark.parametrize(("blocks", "fits"), [(295, False), (296, True)])
def test_u0_charges_a_state_in_whole_blocks(blocks, fits):
    """A state taken from the gap is charged ceil(C / A) = 98 blocks' bytes: with
    100 referenced blocks and one live state, 295 blocks leave a gap of 97.6875
    blocks (more than C) and refuse a further state; 296 leave 98.6875."""
    org = build_organization(layout_for("u0", GEOM), (blocks,))
    assert org.allocate(0, 1600, 1600)
    assert org.unassigned_bytes() == (blocks - 100) * A - C
    assert org.unassigned_bytes() >= C
    assert org.can_allocate(Demand((0, 1))) is fits


def test_u0_sides_give_their_empty_ends_back_to_the_gap():
    org = build_organization(layout_for("u0", GEOM), (545,))
    assert org.allocate(0, 1000, 1000)
    assert org.allocate(1, 1000, 1000)
    assert pages(org) == (126, 2)
    org.abandon(0)                              # holes below B: kept
    assert pages(org) == (126, 2)
    org.abandon(1)                              # B was each side's end: all given back
    org.check_invariants()
    assert pages(org) == (0, 0) and org.unassigned_bytes() == org.region_bytes


def test_u0_grows_into_the_gap_before_evicting_its_own_cache():
    """A finished prompt's blocks stay cached; the next request's blocks come
    from the gap while there is gap, so nothing is invalidated."""
    org = build_organization(layout_for("u0", GEOM), (545,))
    keys = chain_keys(list(range(1600)), "a")
    assert org.allocate(0, 1600, 1600, keys, None)
    org.commit(0, keys, 1600, 1600)
    org.finish(0)
    assert org.usage().pages["attention"] == {"referenced": 0, "cached": 100, "free": 0}
    assert org.allocate(1, 1600, 1600, chain_keys(list(range(1600)), "b"), None)
    assert org.invalidations == 0 and pages(org)[0] == 200
    org.check_invariants()


def test_e0_moves_free_attention_pages_to_the_checkpoint_pool():
    """Two running requests hold both units; a third needs one: 98 empty
    attention blocks (1,605,632 B) become one unit, 11,264 B left over."""
    org = build_organization(layout_for("e0", GEOM), (400, 2))
    assert org.region_bytes == 400 * A + 2 * C
    assert org.allocate(0, 1000, 1000) and org.allocate(1, 1000, 1000)
    assert org.available_pages() == (274, 2)          # 274 blocks hold two units' bytes
    before = state(org)
    assert org.can_allocate(org.pages_needed(2, 16, 16))
    assert state(org) == before, "asking changed the organization"
    assert org.allocate(2, 16, 16)
    org.check_invariants()
    assert pages(org) == (400 - 98, 3) and org.unassigned_bytes() == 98 * A - C == 11_264
    counters = org.region_counters(1)
    assert counters["capacity_moves"] == 1 and counters["capacity_moved_bytes"] == 98 * A
    assert counters["capacity_moved_to_checkpoint_bytes"] == 98 * A
    assert counters["capacity_moved_to_attention_bytes"] == 0
    assert counters["alloc_refusals"] == 0


def test_e0_moves_a_free_unit_back_when_attention_runs_out():
    """The attention pool is full; a unit of the checkpoint pool is cached
    (a finished request's published checkpoint): it is invalidated and its
    bytes become 97 attention blocks (5,120 B left over)."""
    org = build_organization(layout_for("e0", GEOM), (120, 2))
    keys = chain_keys(list(range(1800)), "a")
    assert org.allocate(0, 1800, 1800, keys, None)    # 113 blocks, live + 1 spare
    org.commit(0, keys, 1800, 1800)                   # publishes the 1792 checkpoint
    org.finish(0)
    assert org.allocate(1, 1600, 1600, chain_keys(list(range(1600)), "b"), None)
    org.check_invariants()
    # b's 100 blocks: 8 empty + 92 of a's cached; b's live state: the empty unit
    assert org.region_counters(1)["capacity_moves"] == 0
    assert org.invalidations_by_kind == {"attention": 92, "checkpoint": 0}
    assert org.allocate(1, 1600 + 16 * 40, 1600)       # 40 more blocks: 20 cached left
    org.check_invariants()
    moved = org.region_counters(1)
    assert moved["capacity_moves"] == 1 and moved["capacity_moved_to_attention_bytes"] == C
    assert pages(org) == (120 + 97, 1) and org.unassigned_bytes() == C - 97 * A == 5_120
    assert org.invalidations_by_kind == {"attention": 92, "checkpoint": 1}


def test_e0_refuses_when_neither_pool_can_give():
    org = build_organization(layout_for("e0", GEOM), (100, 2))
    assert org.allocate(0, 1000, 1000) and org.allocate(1, 16, 16)
    before = state(org)
    assert not org.allocate(2, 16, 16)    # a unit needs 98 blocks; 36 are free
    assert state(org)[:4] == before[:4]
    assert org.region_counters(1)["alloc_refusals"] == 1
    assert org.region_counters(1)["alloc_refusals_with_room"] == 0


@pytest.mark.parametrize("org", ["u0", "e0"])
def test_headroom_is_counted_in_bytes_of_the_region(org):
    """f x region bytes must stay free after the allocation."""
    o = build_organization(layout_for(org, GEOM), (545,) if org == "u0" else (400, 2))
    demand = o.pages_needed(0, 1000, 1000)
    asked = demand.pages[0] * A + demand.pages[1] * C
    free = o.free_bytes()
    just = (free - asked) / o.region_bytes
    assert o.can_allocate(demand, just * 0.999)
    assert not o.can_allocate(demand, min(0.99, just * 1.01 + 1e-9))


def test_the_region_is_what_an_engine_preallocates():
    """u0 and e0 name their region (bytes, page ids per pool) and which ids are
    outside each pool now; the fixed organizations have no region."""
    u0 = build_organization(layout_for("u0", GEOM), (545,))
    r = u0.region()
    assert r.region_bytes == 545 * A
    assert [(p.name, p.pages, p.page_bytes) for p in r.pools] == \
        [("attention", 545, A), ("checkpoint", 545 * A // C, C)]
    assert u0.outside_pages(0) == frozenset(range(545))       # both sides start empty
    assert u0.allocate(0, 1000, 1000)
    assert u0.outside_pages(0) == frozenset(range(63, 545))
    assert u0.outside_pages(1) == frozenset(range(1, 545 * A // C))
    e0 = build_organization(layout_for("e0", GEOM), (400, 2))
    assert e0.region().region_bytes == 400 * A + 2 * C
    assert e0.outside_pages(1) == frozenset(range(2, (400 * A + 2 * C) // C))
    for name in ORGANIZATIONS:
        if name not in ("u0", "e0"):
            org = build_organization(layout_for(name, GEOM), (100, 10) if name == "d0" else (100,))
            assert org.region() is None and org.outside_pages(0) == frozenset()


def test_the_torch_engine_serves_every_organization():
    from adapters.torch.engine import TorchEngine

    assert set(TorchEngine.supported_orgs) == set(ORGANIZATIONS)
    for org in ("u0", "e0"):
        check_expressible("torch", TorchEngine.supported_orgs, org)


def test_e0_never_gives_up_the_pages_an_allocation_adopts():
    """b adopts p's prefix (112 cached blocks at the front of the LRU queue
    and p's checkpoint) and needs a live state while the checkpoint pool's
    only free unit is that checkpoint: 98 attention pages move, taken from
    x's cached blocks behind p's, never from the blocks b adopts."""
    org = build_organization(layout_for("e0", GEOM), (213, 2))
    p_tokens = list(range(1800))
    kp = chain_keys(p_tokens)
    assert org.allocate(0, 1800, 1800, kp, None)      # 113 blocks, live + spare
    assert org.commit(0, kp, 1800, 1800) == [1792]
    org.finish(0)                                     # 112 blocks and P cached
    kx = chain_keys(list(range(50_000, 51_600)))
    assert org.allocate(1, 1600, 1600, kx, None)      # 100 blocks from the empty pages
    org.commit(1, kx, 1600, 1600)
    org.finish(1)
    assert org.allocate(2, 16, 16)                    # z: the last empty block and unit
    assert org.usage().pages == {"attention": {"referenced": 1, "cached": 212, "free": 0},
                                 "checkpoint": {"referenced": 1, "cached": 1, "free": 0}}
    kb = chain_keys(p_tokens[:1792] + list(range(90_000, 90_016)))
    hit = org.lookup(kb, 1807)
    assert hit.j_adopt == 1792
    assert org.allocate(3, 1808, 1808, kb, hit)
    org.check_invariants()
    assert [(c.reason, c.position) for c in org.copies()] == [("adopt", 1792)]
    assert org.region_counters(1)["capacity_moved_to_checkpoint_bytes"] == 98 * A
    assert pages(org) == (213 - 98, 3)
    assert org.invalidations_by_kind == {"attention": 99, "checkpoint": 0}   # x's blocks only
    assert org.lookup(kb, 1807).j_adopt == 1792
