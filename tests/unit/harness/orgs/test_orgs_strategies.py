"""The parts an organization is composed of, on a tiny hand-built layout with
exact expectations: the two publication modes (`harness.orgs.publication`),
the pin policies (`harness.orgs.pins`) and the lookup memo
(`harness.orgs.lookup`).

The layout: 16-token attention blocks of one 64-byte page, a checkpoint of
one SSM page and one conv page; the study's grid is 32 tokens, in place the
grid is the block (as in vLLM's blocks)."""

from __future__ import annotations

import pytest

from harness.layout import OrgLayout
from harness.model_configs import preset
from harness.orgs import build_organization, layout_for
from harness.orgs.entries import RequestState
from harness.orgs.keys import chain_keys
from harness.orgs.pins import (
    PIN_POLICIES,
    DeepestOwnCheckpoint,
    JointHit,
    NoPin,
    pin_policy_for,
)
from harness.orgs.publication import InPlace, Spares, exported_edge
from harness.orgs.s1 import S1

B = 16


def tiny(pages: int = 40, in_place: bool = False, pin: str = "checkpoint") -> S1:
    lay = OrgLayout(org="s1", attn_block_tokens=B, grid_tokens=B if in_place else 2 * B,
                    attn_page_bytes=64, ckpt_page_bytes=64, ssm_pages=1, conv_pages=1,
                    attn_block_bytes=64, ssm_bytes=64, conv_bytes=32,
                    publish_in_place=in_place, preempt_pin=pin)
    return S1(lay, (pages,))


def keys_of(n: int, base: int = 0) -> list[int]:
    return chain_keys(list(range(base, base + n)))


def shared(org) -> dict:
    return org.usage().pages["shared"]


# ---- publication modes -------------------------------------------------------
def test_spares_reserve_one_object_per_prompt_boundary_and_publish_them_all():
    org = tiny()
    pub, keys = org.publication, keys_of(100)
    assert type(pub) is Spares and not org.in_place and org.retiring == []
    assert pub.states_needed(None, 0, 64, 100) == 3          # live + spares for 32 and 64
    assert pub.states_needed(None, 32, 64, 100) == 2         # adopting 32: live + 64's spare
    assert pub.states_needed(None, 0, 64, 40) == 2           # prefill ends at 40: 32 only
    assert org.pages_needed(0, 64, 100).pages == (4 + 3 * 2,)
    assert org.allocate(0, 64, 100, keys, None)
    st = org.reqs[0]
    assert (len(st.spares), st.reserved_until) == (2, 64)
    assert not pub.needs_state(st, 64, 100) and pub.needs_state(st, 96, 100)
    assert not pub.needs_state(st, 96, 70)                   # 70 is short of the grid's 96
    first, spares = st.live, list(st.spares)
    assert org.commit(0, keys, 64, 100) == [32, 64]
    assert [(c.reason, c.position) for c in org.copies()] == [("publish", 32), ("publish", 64)]
    assert st.published == [first, spares[0]] and st.live is spares[1] and st.spares == []
    # published checkpoints are cached: the blocks and the live state are referenced
    assert shared(org) == {"referenced": 4 + 2, "cached": 2 * 2, "free": 40 - 10}
    org.finish(0)
    assert shared(org) == {"referenced": 0, "cached": 4 + 2 * 2, "free": 40 - 8}
    org.check_invariants()


def test_spares_drop_their_spare_where_the_prefix_is_published_already():
    org = tiny()
    keys = keys_of(100)
    for rid in (0, 1):                                       # both admitted before any commit
        assert org.allocate(rid, 64, 100, keys, None)
    assert org.commit(0, keys, 64, 100) == [32, 64]
    assert org.commit(1, keys, 64, 100) == []                # found both published
    st = org.reqs[1]
    assert st.published == [] and st.spares == [] and org.copies() == ()
    assert [e.pos for e in st.on_path] == [32, 64]
    org.check_invariants()


def test_in_place_publishes_kept_edges_and_holds_a_passed_edge_past_its_step():
    org = tiny(in_place=True, pin="joint")
    pub, keys = org.publication, keys_of(40)
    assert type(pub) is InPlace and org.in_place
    assert pub.states_needed(None, 0, 32, 40) == 1           # no spares: the live state only
    assert org.allocate(0, 32, 40, keys, None)
    st = org.reqs[0]
    assert st.keep == (32,) and st.spares == []              # the replay boundary of 40
    assert org.commit(0, keys, 16, 40) == []                 # an edge that is not kept
    assert st.at_edge and pub.needs_state(st, 17, 40) and not pub.needs_state(st, 16, 40)
    assert pub.states_needed(st, 0, 17, 40) == 1
    edge = st.live
    assert org.allocate(0, 32, 40)                           # past 16: a new live state
    assert [(c.reason, c.position) for c in org.copies()] == [("publish", 16)]
    assert st.retiring == [(16, edge)] and org.retiring == [0] and not st.at_edge
    assert org.commit(0, keys, 32, 40) == [32]               # kept: published where it is
    assert shared(org) == {"referenced": 2 + 2 * 2, "cached": 0, "free": 40 - 6}
    org.end_step()                                           # edge 16's state falls due
    assert org.retiring == [] and st.retiring == [] and st.retired == [(16, edge)]
    assert org.retired == {0} and edge.valid
    assert org.allocate(0, 33, 40)                           # the next step frees it first
    assert org.retired == set() and st.retired == [] and not edge.valid
    # a third block, a new live state past 32, edge 32's state held past its step
    assert shared(org) == {"referenced": 3 + 2 + 2, "cached": 0, "free": 40 - 7}
    org.finish(0)                                            # the published edge stays cached
    assert shared(org) == {"referenced": 0, "cached": 2 + 2, "free": 40 - 4}
    assert org.checkpoint_at(keys, 32) is not None and org.checkpoint_at(keys, 16) is None
    org.check_invariants()



def two_edges_in_place(org, keys) -> None:
    """Request 0 computes a 40-token prompt in two 16-token chunks, one step
    each: the edge at 16 is passed, the one at 32 is its replay boundary."""
    assert org.allocate(0, 16, 40, keys, None)
    org.commit(0, keys, 16, 40)
    assert org.allocate(0, 32, 40)
    org.commit(0, keys, 32, 40)
    org.end_step()

def test_in_place_releases_the_adopted_checkpoint_at_the_requests_next_allocation():
    org = tiny(in_place=True, pin="joint")
    keys = keys_of(40)
    two_edges_in_place(org, keys)
    org.finish(0)
    hit = org.lookup(keys, 39)
    assert hit.j_adopt == 32
    assert org.allocate(1, 39, 40, keys, hit)
    st = org.reqs[1]
    adopted = st.adopted
    assert [(c.reason, c.position) for c in org.copies()] == [("adopt", 32)]
    org.commit(1, keys, 39, 40)
    assert st.adopted is None and st.retiring == [(32, adopted)] and org.retiring == [1]
    assert adopted.refs == 1                                 # still read by this step's copy
    org.end_step()
    assert adopted.refs == 1 and org.retired == {1}          # held until planned again
    assert org.allocate(1, 40, 40)
    assert adopted.refs == 0 and adopted.valid               # cached again
    org.check_invariants()


def test_a_request_finishing_with_a_passed_state_due_releases_it():
    org = tiny(in_place=True, pin="joint")
    keys = keys_of(40)
    two_edges_in_place(org, keys)
    ((position, edge),) = org.reqs[0].retired
    assert position == 16 and org.retired == {0}
    org.finish(0)                                            # the edge at 16 was not kept
    assert org.retired == set() and not edge.valid and org.holds_no_references()
    org.check_invariants()


# ---- pin policies ------------------------------------------------------------
@pytest.mark.parametrize("name, policy", [("checkpoint", DeepestOwnCheckpoint),
                                          ("joint", JointHit), ("none", NoPin)])
def test_the_layout_names_the_pin_policy(name, policy):
    org = tiny(in_place=True, pin=name)
    assert type(org.pins.policy) is policy and PIN_POLICIES[name] is policy


def test_an_unknown_pin_policy_is_refused():
    org = tiny()
    with pytest.raises(ValueError, match="unknown preemption pin 'all'"):
        pin_policy_for("all", org.attn, org.ckpts, org.grid)


def test_joint_pins_need_checkpoints_on_block_edges():
    org = tiny()                                             # grid 32, blocks of 16
    with pytest.raises(AssertionError, match="block edges"):
        JointHit(org.attn, org.ckpts, org.grid)


def test_paging_chooses_each_organizations_pin():
    geom = preset("falcon-h1-7b")
    for name, study, vllm in (("s0", DeepestOwnCheckpoint, NoPin),
                              ("s1", DeepestOwnCheckpoint, JointHit),
                              ("s2", DeepestOwnCheckpoint, JointHit),
                              ("d0", DeepestOwnCheckpoint, JointHit)):
        pages = (40, 8) if name == "d0" else (40,)
        assert type(build_organization(layout_for(name, geom), pages).pins.policy) is study, name
        orgv = build_organization(layout_for(name, geom, "vllm"), pages)
        assert type(orgv.pins.policy) is vllm and orgv.in_place, name


def test_the_study_pins_its_deepest_own_checkpoint_and_no_block():
    org = tiny()
    keys = keys_of(100)
    assert org.allocate(0, 64, 100, keys, None)
    org.commit(0, keys, 64, 100)
    org.preempt(0)
    assert org.pinned_checkpoints() == {0: 64} and org.pins.blocks == {}
    assert shared(org) == {"referenced": 2, "cached": 4 + 2, "free": 40 - 8}
    hit = org.lookup(keys, 99)
    assert org.allocate(0, 80, 100, keys, hit)               # admitted again: the pin goes
    assert org.pinned_checkpoints() == {}
    org.check_invariants()


def test_a_joint_pin_holds_the_hit_and_the_blocks_before_it():
    org = tiny(in_place=True, pin="joint")
    keys = keys_of(40)
    two_edges_in_place(org, keys)                            # publishes 32
    blocks = list(org.reqs[0].attn[:2])
    org.preempt(0)
    assert org.pinned_checkpoints() == {0: 32} and org.pins.blocks == {0: blocks}
    assert [org.pools[0].hold[p] for p in blocks] == [1, 1]
    assert shared(org) == {"referenced": 2 + 2, "cached": 0, "free": 40 - 4}
    org.abandon(0)
    assert org.pinned_checkpoints() == {} and org.pins.blocks == {}
    assert shared(org) == {"referenced": 0, "cached": 2 + 2, "free": 40 - 4}
    org.check_invariants()


def test_no_pin_pins_nothing():
    org = tiny(in_place=True, pin="none")
    keys = keys_of(40)
    two_edges_in_place(org, keys)
    assert org.pins.policy.choose(org.reqs[0]) == (None, [])
    org.preempt(0)
    assert org.pinned_checkpoints() == {} and org.pins.blocks == {}
    assert shared(org)["referenced"] == 0
    assert NoPin(org.attn, org.ckpts, org.grid).choose(RequestState()) == (None, [])
    org.check_invariants()


# ---- the lookup memo ---------------------------------------------------------
def test_the_lookup_memo_names_what_it_depends_on():
    org = tiny()
    keys = keys_of(100)
    assert org.allocate(0, 64, 100, keys, None)
    org.commit(0, keys, 64, 100)
    org.finish(0)
    hit = org.lookup(keys, 99)
    memo = org.prefix.memo
    assert (memo.keys, memo.n_keys, memo.max_tokens) == (keys, len(keys), 99)
    assert (memo.j_adopt, memo.r_max, memo.depth) == (64, 64, 64)
    assert (memo.version, memo.pages, memo.slabs) == (org.version(), (4 + 2,), frozenset())
    again = org.lookup(keys, 99)
    assert again == hit and again is not hit and org.prefix.memo is memo   # from the memo
    assert org.allocate(1, 16, 1, keys_of(16, 500), None)   # pages change state, maps do not
    org.lookup(keys, 99)
    assert org.prefix.memo.version == org.version() != memo.version
    assert org.prefix.memo._replace(version=memo.version) == memo


# ---- vLLM's prefill checkpoint block ------------------------------------------
@pytest.mark.parametrize("keep, start, end, until, want", [
    ((32,), 0, 40, 40, 32),     # the chunk that ends the prefill passes its last edge
    ((32,), 0, 32, 40, None),   # a chunk that does not end the prefill exports nothing
    ((32,), 16, 40, 40, 32),    # from an edge a block before it
    ((32,), 24, 40, 40, None),  # a chunk that starts off an edge
    ((32,), 32, 40, 40, None),  # the edge is the chunk's start, not inside it
    ((16,), 0, 40, 40, None),   # the last edge before the end is not a kept one
    ((), 0, 40, 40, None),
])
def test_the_prefill_checkpoint_vllm_exports_from_inside_a_chunk(keep, start, end, until, want):
    """`exported_edge` against ``is_mamba_prefill_checkpoint_valid`` worked by
    hand, blocks of 16: the edge (until - 1) // 16 x 16 = 32 must be kept, at
    least a block past the chunk's start, the start on an edge, the chunk
    reaching the prefill's end."""
    assert exported_edge(keep, start, end, until, B) == want


def test_a_prompt_in_one_chunk_caches_its_last_edge_from_an_extra_block():
    """vLLM's align mode on a GPU: a 40-token prompt in one chunk holds its live
    state and the prefill checkpoint block (2 states), and the state at its
    last edge (32) is cached from that block when the step ends, held by
    nobody; the live state continues to 40."""
    org = tiny(in_place=True, pin="joint")
    keys = keys_of(40)
    assert org.chunk_stop(0, 0, 40, 40, None, 40) == 40      # not split at 32
    demand = org.pages_needed(0, 40, 40, keys, None, 40)
    assert demand.pages[0] == 3 + 2 * 2                      # 3 blocks, 2 states of 2 pages
    assert org.allocate(0, 40, 40, keys, None, 40)
    assert org.commit(0, keys, 40, 40) == [32]
    ck = org.checkpoint_at(keys, 32)
    assert ck is not None and ck != org.live_state(0)
    hit = org.lookup(keys_of(40), 39)
    assert hit.j_adopt == 32
    org.check_invariants()


def test_a_chunk_ends_at_the_shared_prefix_junction_first():
    """A request whose cached attention reaches deeper than any cached state
    stops its chunk at that junction (vLLM's ``junction_stop``), also where
    the junction is its prompt's last edge, which it would otherwise export
    from inside the chunk. Blocks of 16: request 0 (56 tokens) caches
    attention to 48 and its state at 48; a prompt sharing its first 40 tokens
    hits attention to 32 and no state."""
    org = tiny(in_place=True, pin="joint")
    first = chain_keys(list(range(56)))
    assert org.allocate(0, 56, 56, first, None, 56)
    assert org.commit(0, first, 56, 56) == [48]
    org.end_step()
    org.finish(0)
    for length in (56, 40):          # last edges 48 and 32 (= the junction)
        keys = chain_keys(list(range(40)) + list(range(900, 900 + length - 40)))
        hit = org.lookup(keys, length - 1)
        assert (hit.attn_depth, hit.j_adopt) == (32, 0)
        assert org.chunk_stop(1, 0, length, length, hit, length) == 32
        assert org.pages_needed(1, 32, length, keys, hit, length).pages[0] == 2 + 2  # no export
