"""Exact expectations for the organizations on tiny, hand-built situations."""

from __future__ import annotations

import pytest

from harness.model_configs import preset
from harness.orgs import build_organization
from harness.orgs.keys import chain_keys, key_at
from harness.orgs.slabs import NO_SLOT, SlotRef, conv_row

GEOM = preset("falcon-h1-7b")
KIB = 1024


def tokens(n, base=0):
    return list(range(base, base + n))


def serve(org, rid, toks, salt=None):
    """Admit, compute the whole prompt in one chunk, finish; returns the keys."""
    keys = chain_keys(toks, salt)
    hit = org.lookup(keys, len(toks) - 1)
    assert org.allocate(rid, len(toks), len(toks), keys, hit)
    org.commit(rid, keys, len(toks), len(toks))
    org.finish(rid)
    org.check_invariants()
    return keys


@pytest.mark.parametrize("org_name, pages, kib", [
    ("s0", (40,), 31_140), ("s1", (40,), 16_384), ("s2", (40,), 14_848)])
def test_worked_example_allocates_what_the_ledger_says(org_name, pages, kib):
    """x_A = 16 attention blocks and x_R = 4 checkpoints (DESIGN.md section 3):
    S0 1557 (16 + 4); S1 512 x 16 + 2048 x 4; S2 512 x 16 + 1536 x 4 + 512 x 1."""
    org = build_organization(org_name, GEOM, pages)
    for _ in range(16):
        org._ref(org._new_attn())
    for _ in range(4):
        org._ref(org._new_ckpt())
    org.check_invariants()
    pool = org.pools[0]
    assert pool.num_referenced * pool.page_bytes == kib * KIB


def test_s2_packs_conv_slots_densely_and_never_uses_a_sentinel_as_address():
    org = build_organization("s2", GEOM, (80,))
    ckpts = [org._new_ckpt() for _ in range(17)]
    for c in ckpts:
        org._ref(c)
    slabs = {c.slot.slab for c in ckpts}
    assert len(slabs) == 2                       # 16 slots fill one slab, the 17th opens another
    assert sorted(org.slabs.used_slots(s) for s in slabs) == [1, 16]
    assert len({(c.slot.slab, c.slot.slot) for c in ckpts}) == 17   # no aliasing
    assert all(isinstance(c.slot, SlotRef) for c in ckpts)
    assert conv_row(ckpts[0].slot, 16) == 16 * ckpts[0].slot.slab + ckpts[0].slot.slot
    s1 = build_organization("s1", GEOM, (20,))
    c = s1._new_ckpt()
    assert c.slot is NO_SLOT and not c.slot
    with pytest.raises(ValueError, match="NO_SLOT"):
        conv_row(c.slot, 16)


def test_reclaiming_a_slab_invalidates_exactly_its_checkpoints():
    org = build_organization("s2", GEOM, (80,))
    # three requests publish checkpoints; their conv slots share one slab
    keys = [serve(org, i, tokens(1100, 10_000 * i)) for i in range(3)]
    published = {i: [key_at(keys[i], j) for j in (512, 1024)] for i in range(3)}
    assert all(k in org.ckpt_map for ks in published.values() for k in ks)
    slab = org.ckpt_map[published[0][0]].slot.slab
    users = {e.key for e in org.ckpt_map.values() if e.slot and e.slot.slab == slab}
    before = org.invalidations
    pool = org.pools[0]
    org._evict(0, slab)
    org.check_invariants()
    assert slab in pool.empty
    gone = {k for ks in published.values() for k in ks} - set(org.ckpt_map)
    assert gone == users                                 # exactly the slab's occupants
    assert org.invalidations - before == len(users)
    # their SSM member pages are free again, not leaked
    assert pool.num_referenced == 0
    org._ref(org._new_attn())                            # the slab page is usable storage again
    org.check_invariants()


def test_reassigning_one_member_page_invalidates_the_whole_checkpoint():
    org = build_organization("s1", GEOM, (10,))          # 2 blocks + live + spare = 10 pages
    keys = chain_keys(tokens(600))
    assert org.allocate(0, 600, 600, keys, org.lookup(keys, 599))
    org.commit(0, keys, 600, 600)
    org.finish(0)
    ck = org.ckpt_map[key_at(keys, 512)]
    assert org.lookup(keys + [1], 600).j_adopt == 512
    # allocating private blocks reclaims LRU pages; the checkpoint's members go first
    for _ in range(6):
        org._ref(org._new_attn())
        org.check_invariants()
    assert not ck.valid
    assert key_at(keys, 512) not in org.ckpt_map
    assert org.lookup(keys + [1], 600).j_adopt == 0


def test_pinning_is_not_retention():
    org = build_organization("s2", GEOM, (60,))
    keys = chain_keys(tokens(1100))
    assert org.allocate(0, 1100, 1100, keys, org.lookup(keys, 1099))
    org.commit(0, keys, 1100, 1100)
    assert org.retain(0, 1024, keys)
    org.preempt(0)                                       # pins 1024, drops the retain hold
    ck = org.ckpt_map[key_at(keys, 1024)]
    assert (ck.pins, ck.retains) == (1, 0)
    assert org.pinned[0] is ck
    held_pages = [pg for _, pg in ck.pages]
    assert all(org.pools[0].hold[p] == 1 for p in held_pages)
    # the pin survives pressure: fill the pool with private blocks
    while org.pools[0].available:
        org._ref(org._new_attn())
    assert ck.valid and key_at(keys, 1024) in org.ckpt_map
    org.check_invariants()


def test_resume_releases_the_pin_and_abandon_releases_it_too():
    org = build_organization("s1", GEOM, (60,))
    keys = chain_keys(tokens(1100))
    assert org.allocate(0, 1100, 1100, keys, org.lookup(keys, 1099))
    org.commit(0, keys, 1100, 1100)
    org.preempt(0)
    hit = org.lookup(keys, 1099)
    assert hit.j_adopt == 1024
    assert org.allocate(0, 1100, 1100, keys, hit)        # resumes from the pinned checkpoint
    assert 0 not in org.pinned
    org.preempt(0)
    org.abandon(0)                                       # cancelled while preempted
    assert not org.pinned
    assert all(h == 0 for h in org.pools[0].hold)
    org.check_invariants()


def test_d0_never_lends_one_pools_space_to_the_other():
    org = build_organization("d0", GEOM, (2000, 2))      # room for the live state + 1 spare
    keys = chain_keys(tokens(1800))
    d = org.demand(0, 1800, 1800, keys, org.lookup(keys, 1799))
    assert d.pages == (113, 2)                           # ceil(1800/16) blocks; live + spare
    assert org.can_allocate(d)
    org2 = build_organization("d0", GEOM, (2000, 1))     # attention room galore, one unit
    assert not org2.can_allocate(org2.demand(0, 1800, 1800, keys, org2.lookup(keys, 1799)))
    assert org2.can_allocate(org2.demand(0, 1000, 1800, keys, org2.lookup(keys, 999)))


def test_headroom_is_per_pool():
    org = build_organization("d0", GEOM, (100, 10))
    assert org.headroom_pages(0.19) == (19, 1)
    keys = chain_keys(tokens(160))
    d = org.demand(0, 160, 160, keys, org.lookup(keys, 159))
    assert d.pages == (10, 1)
    assert org.can_allocate(d, 0.8)                      # 100-10 >= 80 and 10-1 >= 8
    assert not org.can_allocate(d, 0.95)                 # 9 < floor(9.5)


def test_lookup_reports_joint_depth_checkpoint_depth_and_attention_depth():
    org = build_organization("s1", GEOM, (200,))
    keys = serve(org, 0, tokens(2100))
    # drop the attention block [1024, 1536): attention depth stops at 1024
    blk = org.attn_map[key_at(keys, 1536)]
    org._invalidate(blk)
    org.check_invariants()
    hit = org.lookup(keys + [0], 2100)
    assert hit.attn_depth == 1024
    assert hit.r_max == 2048                             # checkpoints at 512..2048 survive
    assert hit.j_adopt == 1024                           # joint: both halves needed


def test_usage_reports_bytes_by_kind_and_state():
    org = build_organization("s1", GEOM, (40,))
    keys = chain_keys(tokens(1100))
    assert org.allocate(0, 1100, 1100, keys, org.lookup(keys, 1099))
    org.commit(0, keys, 1100, 1100)
    u = org.usage()
    # referenced: 3 attention blocks + the live state; cached: 2 published checkpoints
    assert u.pages_by_kind["attention"] == {"referenced": 3, "cached": 0}
    assert u.pages_by_kind["ssm"] == {"referenced": 3, "cached": 6}
    assert u.pages_by_kind["conv"] == {"referenced": 1, "cached": 2}
    assert u.bytes_by_kind["ssm"]["referenced"] == GEOM.ssm_state_bytes
    assert u.bytes_by_kind["conv"]["cached"] == 2 * GEOM.conv_state_bytes
    assert u.waste_by_kind["conv"] == 3 * (512 * KIB - GEOM.conv_state_bytes)
    assert u.pages["shared"] == {"referenced": 7, "cached": 8, "free": 25}
