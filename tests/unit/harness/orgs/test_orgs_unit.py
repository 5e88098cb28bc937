"""Exact expectations for the organizations on tiny, hand-built situations,
driven through the public protocol only (`harness.orgs.protocol`)."""

from __future__ import annotations

import pytest

from harness.model_configs import preset
from harness.orgs import build_organization, layout_for
from harness.orgs.keys import chain_keys
from harness.orgs.slabs import NO_SLOT, SlotRef, conv_row
from harness.orgs.values import ConvInline, ConvPages, ConvSlot, PageRef
from tests.support.orgs import serve, tokens

GEOM = preset("falcon-h1-7b")
KIB = 1024


def referenced_pages(org) -> int:
    return sum(p["referenced"] for p in org.usage().pages.values())


def grow_private(org, rid, salt_base=900_000):
    """Admit a private request that publishes nothing and yield after every
    further 512-token block it takes (one page per step)."""
    keys = chain_keys(tokens(128 * 512, salt_base))
    end = 512
    assert org.allocate(rid, end, 1, keys, None)
    while True:
        yield keys
        end += 512
        if not org.can_allocate(org.pages_needed(rid, end, 1)):
            return
        assert org.allocate(rid, end, 1)
        org.check_invariants()


@pytest.mark.parametrize("org_name, pages, kib", [
    ("s0", (40,), 31_140), ("s1", (40,), 16_384), ("s2", (40,), 14_848)])
def test_worked_example_allocates_what_the_ledger_says(org_name, pages, kib):
    """x_A = 16 attention blocks and x_R = 4 checkpoints (DESIGN.md section 3):
    S0 1557 (16 + 4); S1 512 x 16 + 2048 x 4; S2 512 x 16 + 1536 x 4 + 512 x 1.
    A request reserving 8192 tokens with prefill up to 1536 holds 16 blocks,
    its live state and spares for the boundaries 512, 1024 and 1536."""
    org = build_organization(layout_for(org_name, GEOM), pages)
    keys = chain_keys(tokens(8192))
    d = org.pages_needed(0, 8192, 1536, keys, org.lookup(keys, 8191))
    assert org.allocate(0, 8192, 1536, keys, None)
    org.check_invariants()
    page_bytes = org.capacity().pools[0].page_bytes
    assert referenced_pages(org) == d.pages[0]
    assert referenced_pages(org) * page_bytes == kib * KIB


def test_s2_packs_conv_slots_densely_and_never_uses_a_sentinel_as_address():
    org = build_organization(layout_for("s2", GEOM), (80,))
    keys = chain_keys(tokens(8192 + 1))
    assert org.allocate(0, 8192, 8192, keys, None)       # 16 blocks, live + 16 spares
    published = org.commit(0, keys, 8192, 8192)
    assert published == list(range(512, 8193, 512))
    places = [org.checkpoint_at(keys, j) for j in published] + [org.live_state(0)]
    slots = [p.conv for p in places]
    assert all(isinstance(c, ConvSlot) and c.slot_bytes == 32 * KIB for c in slots)
    per_slab = {}
    for c in slots:
        per_slab[c.slab] = per_slab.get(c.slab, 0) + 1
    assert sorted(per_slab.values()) == [1, 16]          # 16 fill one slab, the 17th opens one
    assert len({(c.slab, c.slot) for c in slots}) == 17  # no aliasing
    live_slab = org.live_state(0).conv.slab
    assert org.page_state(PageRef(0, live_slab)) == "referenced"
    assert {org.page_state(PageRef(0, s)) for s in per_slab if s != live_slab} == {"cached"}
    assert conv_row(SlotRef(3, 5), 16) == 16 * 3 + 5
    s1 = build_organization(layout_for("s1", GEOM), (20,))
    assert s1.allocate(0, 16, 16, chain_keys(tokens(16)), None)
    assert isinstance(s1.live_state(0).conv, ConvPages)
    assert not NO_SLOT
    with pytest.raises(ValueError, match="NO_SLOT"):
        conv_row(NO_SLOT, 16)


@pytest.mark.parametrize("org_name, ssm, conv", [
    ("s0", 1, ConvInline), ("s1", 3, ConvPages), ("s2", 3, ConvSlot), ("d0", 1, ConvInline)])
def test_live_state_placement_matches_the_layout(org_name, ssm, conv):
    org = build_organization(layout_for(org_name, GEOM), (40,) if org_name != "d0" else (200, 4))
    keys = chain_keys(tokens(600))
    assert org.allocate(0, 600, 600, keys, None)
    place = org.live_state(0)
    assert len(place.ssm) == ssm and isinstance(place.conv, conv)
    assert sum(n for _, n in place.ssm) == GEOM.ssm_state_bytes
    if conv is ConvInline:
        assert place.conv.offset == GEOM.ssm_state_bytes and place.conv.page == place.ssm[0][0]
    if conv is ConvPages:
        assert len(place.conv.pages) == 1 and place.conv.nbytes == GEOM.conv_state_bytes
    assert place.pool == len(org.capacity().pools) - 1
    table = org.block_table(0)
    n_blocks = -(-600 // org.attn_block_tokens)
    assert len(table) == n_blocks and all(r.pool == 0 for r in table)
    assert not set(place.pages()) & {r.page for r in table if r.pool == place.pool}


def test_adoption_and_publication_report_the_copies_an_engine_makes():
    org = build_organization(layout_for("s1", GEOM), (60,))
    keys = chain_keys(tokens(1100))
    assert org.allocate(0, 1100, 1100, keys, None)
    assert org.copies() == ()                            # nothing adopted
    assert org.commit(0, keys, 1100, 1100) == [512, 1024]
    pub = org.copies()
    assert [(c.reason, c.position) for c in pub] == [("publish", 512), ("publish", 1024)]
    assert pub[0].src == org.checkpoint_at(keys, 512)
    assert pub[0].dst == pub[1].src                      # the live object of [512, 1024)
    assert pub[1].dst == org.live_state(0)
    for c in pub:
        assert not set(c.src.pages()) & set(c.dst.pages())
    org.finish(0)
    keys2 = chain_keys(tokens(1100) + [7, 7])
    hit = org.lookup(keys2, 1101)
    assert hit.j_adopt == 1024
    assert org.allocate(1, 1102, 1102, keys2, hit)
    (adopt,) = org.copies()
    assert (adopt.reason, adopt.position) == ("adopt", 1024)
    assert adopt.src == org.checkpoint_at(keys2, 1024) and adopt.dst == org.live_state(1)


def test_a_slab_is_reused_only_after_every_checkpoint_in_it_is_gone():
    """One request publishes 16 checkpoints: their conv slots fill one slab. A
    private request then takes page after page; no checkpoint that a lookup
    still finds may name a page it took, and the slab page becomes ordinary
    storage only once all 16 checkpoints are invalid."""
    org = build_organization(layout_for("s2", GEOM), (80,))
    keys, _ = serve(org, 0, tokens(8200))
    where = {j: org.checkpoint_at(keys, j) for j in range(512, 8193, 512)}
    (slab,) = {p.conv.slab for p in where.values()}
    assert sorted(p.conv.slot for p in where.values()) == list(range(16))
    before = org.invalidations
    for _ in grow_private(org, 99):
        live = org.live_state(99)
        assert live.conv.slab != slab                     # the full slab has no room
        taken = {r.page for r in org.block_table(99)} | set(live.pages())
        alive = [j for j in where if org.checkpoint_at(keys, j) is not None]
        for j in alive:                                   # a hit never names reused storage
            assert not set(where[j].pages()) & taken
        if slab in taken:
            assert not alive
            break
    else:
        pytest.fail("the slab page was never reused")
    assert org.invalidations - before == 16


def test_reassigning_one_member_page_invalidates_the_whole_checkpoint():
    org = build_organization(layout_for("s1", GEOM), (10,))          # 2 blocks + live + spare = 10 pages
    keys, _ = serve(org, 0, tokens(600))
    ck = org.checkpoint_at(keys, 512)
    assert len(ck.ssm) == 3 and len(ck.conv.pages) == 1
    assert org.lookup(keys + [1], 600).j_adopt == 512
    members = set(ck.pages())
    for _ in grow_private(org, 1):
        taken = {r.page for r in org.block_table(1)} | set(org.live_state(1).pages())
        if taken & members:
            break
    assert taken & members and not members <= taken      # only part of it was reused
    assert org.checkpoint_at(keys, 512) is None
    assert org.lookup(keys + [1], 600).j_adopt == 0


def test_pinning_is_not_retention():
    org = build_organization(layout_for("s2", GEOM), (60,))
    keys = chain_keys(tokens(1100))
    assert org.allocate(0, 1100, 1100, keys, org.lookup(keys, 1099))
    org.commit(0, keys, 1100, 1100)
    assert org.retain(0, 1024, keys) and not org.retain(0, 1024, keys)
    org.preempt(0)                                       # pins 1024, drops the retain hold
    pinned = org.checkpoint_at(keys, 1024)
    assert all(org.page_state(PageRef(0, p)) == "referenced" for p in pinned.pages())
    # the pin survives pressure: fill the pool with a private request's blocks
    for _ in grow_private(org, 1):
        pass
    assert org.checkpoint_at(keys, 1024) == pinned
    assert org.lookup(keys, 1099).r_max == 1024
    org.finish(1)
    org.abandon(0)                                       # the pin goes; nothing else held it
    assert referenced_pages(org) == 0
    org.check_invariants()


def test_resume_releases_the_pin_and_abandon_releases_it_too():
    org = build_organization(layout_for("s1", GEOM), (60,))
    keys = chain_keys(tokens(1100))
    assert org.allocate(0, 1100, 1100, keys, org.lookup(keys, 1099))
    org.commit(0, keys, 1100, 1100)
    org.preempt(0)
    assert referenced_pages(org) == 4                    # the pinned checkpoint at 1024
    hit = org.lookup(keys, 1099)
    assert hit.j_adopt == 1024
    assert org.allocate(0, 1100, 1100, keys, hit)        # resumes from the pinned checkpoint
    org.finish(0)
    assert referenced_pages(org) == 0                    # resuming released the pin
    assert org.allocate(0, 1100, 1100, keys, org.lookup(keys, 1099))
    org.preempt(0)
    org.abandon(0)                                       # cancelled while preempted
    assert referenced_pages(org) == 0 and org.holds_no_references()
    org.check_invariants()


def test_d0_never_lends_one_pools_space_to_the_other():
    org = build_organization(layout_for("d0", GEOM), (2000, 2))      # room for the live state + 1 spare
    keys = chain_keys(tokens(1800))
    d = org.pages_needed(0, 1800, 1800, keys, org.lookup(keys, 1799))
    assert d.pages == (113, 2)                           # ceil(1800/16) blocks; live + spare
    assert org.can_allocate(d)
    org2 = build_organization(layout_for("d0", GEOM), (2000, 1))     # attention room galore, one unit
    assert not org2.can_allocate(org2.pages_needed(0, 1800, 1800, keys, org2.lookup(keys, 1799)))
    assert org2.can_allocate(org2.pages_needed(0, 1000, 1800, keys, org2.lookup(keys, 999)))


def test_headroom_is_per_pool():
    org = build_organization(layout_for("d0", GEOM), (100, 10))
    assert org.headroom_pages(0.19) == (19, 1)
    keys = chain_keys(tokens(160))
    d = org.pages_needed(0, 160, 160, keys, org.lookup(keys, 159))
    assert d.pages == (10, 1)
    assert org.can_allocate(d, 0.8)                      # 100-10 >= 80 and 10-1 >= 8
    assert not org.can_allocate(d, 0.95)                 # 9 < floor(9.5)


def test_lookup_reports_joint_depth_checkpoint_depth_and_attention_depth():
    """LRU order after serving [0, 2100): checkpoints 512, 1024, 1536 (published
    first), then blocks tail first. A pin keeps the checkpoint at 2048 and a
    running request that adopted [0, 1024) keeps those blocks and checkpoint; a
    private request then reclaims checkpoint 1536 and the block [1536, 2048)."""
    org = build_organization(layout_for("s1", GEOM), (60,))
    keys = chain_keys(tokens(2100))
    assert org.allocate(0, 2100, 2100, keys, None)
    org.commit(0, keys, 2100, 2100)
    org.preempt(0)                                       # pins the checkpoint at 2048
    short = chain_keys(tokens(1024) + [5] * 100)
    hit = org.lookup(short, 1123)
    assert hit.j_adopt == 1024
    assert org.allocate(1, 1124, 1, short, hit)          # holds blocks 0, 1 and ckpt 1024
    for _ in grow_private(org, 2):
        hit = org.lookup(keys + [0], 2100)
        if hit.attn_depth < 2048:
            break
    assert (hit.j_adopt, hit.r_max, hit.attn_depth) == (1024, 2048, 1536)


def test_capacity_names_the_pools_and_grids():
    cap = build_organization(layout_for("d0", GEOM), (100, 10)).capacity()
    assert [(p.name, p.pages, p.page_bytes) for p in cap.pools] == [
        ("attention", 100, 16 * KIB), ("checkpoint", 10, GEOM.checkpoint_bytes)]
    assert (cap.attn_block_tokens, cap.grid_tokens) == (16, 1792)
    cap = build_organization(layout_for("s2", GEOM), (40,)).capacity()
    assert [(p.name, p.pages, p.page_bytes) for p in cap.pools] == [("shared", 40, 512 * KIB)]


def test_usage_reports_bytes_by_kind_and_state():
    org = build_organization(layout_for("s1", GEOM), (40,))
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


def test_a_fifth_organization_is_one_class_and_one_registry_entry(monkeypatch):
    """S1's pages with checkpoints every 1024 tokens: only a layout and S1's
    pool split, registered under a new name, and every shared path (layouts,
    building, serving, placement, invariants) takes it."""
    from dataclasses import replace

    from harness.orgs import ORGANIZATIONS, Organization, layout_for

    class Coarse(Organization):
        name = "x1"
        pool_split = ORGANIZATIONS["s1"].pool_split

        @staticmethod
        def layout_for(geom, grid):
            return replace(ORGANIZATIONS["s1"].layout_for(geom, grid), org="x1", grid_tokens=1024)

    monkeypatch.setitem(ORGANIZATIONS, "x1", Coarse)
    assert layout_for("x1", GEOM).grid_tokens == 1024
    org = build_organization(layout_for("x1", GEOM), (60,))
    keys = chain_keys(tokens(2100))
    assert org.allocate(0, 2100, 2100, keys, None)
    assert org.commit(0, keys, 2100, 2100) == [1024, 2048]
    assert org.checkpoint_at(keys, 512) is None and org.checkpoint_at(keys, 1024) is not None
    org.finish(0)
    org.check_invariants()
    assert org.lookup(keys + [0], 2100).j_adopt == 2048
    with pytest.raises(ValueError, match="unknown organization"):
        build_organization(layout_for("x2", GEOM), (60,))
