"""Under ``--paging vllm`` the organizations keep, evict and pin states as vLLM
0.32 does with its default ``--prefix-cache-retention-interval 0`` (found by
logging vLLM's allocator while it served the fidelity cells, docs/fidelity.md):

- a request publishes its state only at its replay boundary (the last block
  edge before its prompt's last token) and at a shared-prefix junction, not
  at other edges, decode edges included;
- a block or state computed again for a prefix that is cached already is
  cached too, and lookup finds the prefix until the last copy is reclaimed;
- the checkpoint a request adopted is released when the request is planned
  after that step (its next allocation), as the edges it goes past are;
- a preemption pins the longest joint hit under hbench's plugin (checkpoint
  and attention blocks), nothing under stock vLLM (S0).

Hand-built situations on Falcon-H1-7B's geometry, whose vLLM block is 1,664
tokens (tests/unit/harness/scheduler/test_paging.py derives it).
"""

from __future__ import annotations

from harness.model_configs import preset
from harness.orgs import build_organization, layout_for
from harness.orgs.keys import chain_keys, extend_keys
from harness.orgs.publication import kept_edges, registered_again
from harness.orgs.values import PageRef, PrefixHit
from tests.support.orgs import tokens

GEOM = preset("falcon-h1-7b")
B = 1664


def hit(j, depth):
    return PrefixHit(j_adopt=j, r_max=j, attn_depth=depth, version=0)


def step(org, rid, keys, end, prefill_until):
    """One scheduled step of ``rid`` up to ``end``: allocate, commit, end the step."""
    assert org.allocate(rid, end, prefill_until)
    published = org.commit(rid, keys, end, prefill_until)
    org.end_step()
    org.check_invariants()
    return published


def prefill(org, rid, toks, base_hit=None):
    """Admit ``toks`` and compute them one block per step, as vLLM's CPU build
    does; returns the keys and the positions published."""
    keys = chain_keys(toks)
    h = org.lookup(keys, len(toks) - 1) if base_hit is None else base_hit
    start = h.j_adopt
    end = min(len(toks), (start // B + 1) * B)
    assert org.allocate(rid, end, len(toks), keys, h)
    published = org.commit(rid, keys, end, len(toks))
    org.end_step()
    while end < len(toks):
        end = min(len(toks), end + B)
        published += step(org, rid, keys, end, len(toks))
    return keys, published


def decode_to(org, rid, toks, keys, n):
    """Decode ``rid`` one token per step until it holds ``n`` tokens."""
    while len(toks) < n:
        toks.append(7_000_000 + len(toks))
        extend_keys(keys, toks, None)
        step(org, rid, keys, len(toks), 0)


def page_states(org, place):
    return {org.page_state(PageRef(place.pool, p)) for p in place.pages()}


def test_kept_edges_are_the_replay_boundary_and_the_junction():
    assert kept_edges(2933, None, B) == (1664,)
    assert kept_edges(3328, None, B) == (1664,)      # the last token is recomputed
    assert kept_edges(3329, None, B) == (3328,)
    assert kept_edges(1000, None, B) == ()
    # cached attention deeper than the joint hit: that depth is a junction too
    assert kept_edges(3517, hit(0, 1664), B) == (1664, 3328)
    assert kept_edges(3517, hit(1664, 1664), B) == (3328,)


def test_the_replay_edge_is_registered_again_by_the_chunk_that_ends_the_prefill_in_its_block():
    # a 3,400-token prompt: replay edge 3,328; the chunk [3328, 3400) caches
    # round_down(3400, B) = 3328 tokens, so vLLM registers that state again
    assert registered_again(3328, 3328, 3400, B) == 3328
    # a prefill ending on the next edge caches 4,992 tokens: nothing again
    assert registered_again(3328, 3328, 3328 + B, B) is None
    # a chunk that does not start at the replay edge, or a prompt of one block
    assert registered_again(3328, 1664, 3328, B) is None
    assert registered_again(0, 0, 1000, B) is None


def test_only_the_replay_boundary_is_published_not_a_decode_edge():
    org = build_organization(layout_for("s1", GEOM, "vllm"), (40,))
    toks = tokens(2000)
    keys, published = prefill(org, 0, toks)
    assert published == [1664]
    decode_to(org, 0, toks, keys, 3330)              # past the edge at 3328
    assert org.checkpoint_at(keys, 1664) is not None
    assert org.checkpoint_at(keys, 3328) is None     # vLLM keeps no state there
    assert org.usage().pages["shared"]["cached"] == 4    # the 1664 checkpoint: 4 pages
    org.finish(0)
    org.check_invariants()


def test_the_edges_state_is_held_until_the_request_is_allocated_next():
    org = build_organization(layout_for("s0", GEOM, "vllm"), (12,))
    toks = tokens(3000)
    keys, _ = prefill(org, 0, toks)
    decode_to(org, 0, toks, keys, 3328)
    assert org.allocate(0, 3329, 0)                  # past 3328: a new state object
    held = org.usage().pages["shared"]["referenced"]
    assert held == 3 + 2                             # 3 blocks, the new state and the edge's
    org.commit(0, keys, 3329, 0)
    org.end_step()                                   # held past the step, as vLLM holds it
    assert org.usage().pages["shared"]["referenced"] == 5 and org.retired == {0}
    assert org.allocate(0, 3330, 0)                  # its next step: freed, not cached
    assert org.usage().pages["shared"] == {"referenced": 4, "cached": 1, "free": 7}
    assert org.retired == set()
    org.check_invariants()


def test_a_prefix_computed_twice_stays_found_until_both_copies_are_reclaimed():
    org = build_organization(layout_for("s0", GEOM, "vllm"), (6,))
    toks = tokens(1700)
    keys = chain_keys(toks)
    for rid in (0, 1):                               # admitted together, neither hits
        assert org.allocate(rid, B, len(toks), keys, None)
    for rid in (0, 1):
        org.commit(rid, keys, B, len(toks))          # 1 publishes, 2 duplicates
    org.end_step()
    for rid in (0, 1):
        org.finish(rid)
    org.check_invariants()
    assert org.usage().pages["shared"]["cached"] == 4
    other = chain_keys(tokens(4 * B, 500_000))
    assert org.allocate(2, B, 1, other, None)        # the 2 empty pages
    for end, lost in ((2 * B, 1), (3 * B, 2)):       # then the oldest cached ones
        assert org.allocate(2, end, 1)
        org.check_invariants()
        assert org.invalidations == lost
        h = org.lookup(keys, len(toks) - 1)
        assert (h.j_adopt, h.attn_depth) == (B, B)   # the second copies took over


def test_a_prefix_computed_twice_is_kept_once_under_study_paging():
    org = build_organization(layout_for("s0", GEOM), (40,))
    toks = tokens(600)
    keys = chain_keys(toks)
    for rid in (0, 1):
        assert org.allocate(rid, 600, 600, keys, None)
    assert org.commit(0, keys, 600, 600) == [512]
    assert org.commit(1, keys, 600, 600) == []
    assert org.attn.duplicates == {} and org.table.duplicates == {"ckpt": {}}


def test_an_adopted_checkpoint_is_released_when_the_request_is_allocated_next():
    org = build_organization(layout_for("s1", GEOM, "vllm"), (40,))
    prefill(org, 0, tokens(1700))
    org.finish(0)
    toks = tokens(1700) + tokens(300, 900_000)
    keys = chain_keys(toks)
    h = org.lookup(keys, len(toks) - 1)
    assert h.j_adopt == B
    assert org.allocate(1, len(toks), len(toks), keys, h)
    ckpt = org.checkpoint_at(keys, B)
    org.commit(1, keys, len(toks), len(toks))        # its state is copied in this step
    assert page_states(org, ckpt) == {"referenced"}
    org.end_step()
    assert page_states(org, ckpt) == {"referenced"}  # until vLLM plans the request again
    assert org.allocate(1, len(toks) + 1, len(toks))
    assert page_states(org, ckpt) == {"cached"}
    org.check_invariants()


def test_an_exported_checkpoint_is_held_by_its_request_until_it_is_allocated_next():
    # one chunk computes a 3,400-token prompt and exports the state at its
    # replay edge 3,328 into an extra block, which stays in vLLM's block table
    # until the request is scheduled next
    org = build_organization(layout_for("s0", GEOM, "vllm"), (12,))
    toks = tokens(3400)
    keys = chain_keys(toks)
    assert org.allocate(0, len(toks), len(toks), keys, None)
    assert org.commit(0, keys, len(toks), len(toks)) == [3328]
    org.end_step()
    ckpt = org.checkpoint_at(keys, 3328)
    assert page_states(org, ckpt) == {"referenced"} and org.retired == {0}
    assert org.allocate(0, len(toks) + 1, len(toks))
    assert page_states(org, ckpt) == {"cached"} and org.retired == set()
    org.check_invariants()


def test_a_plugin_preemption_pins_the_joint_hit_and_stock_s0_pins_nothing():
    for name, pinned in (("s1", {0: B}), ("s2", {0: B}), ("d0", {0: B}), ("s0", {})):
        pools = (30, 12) if name == "d0" else (40,)
        org = build_organization(layout_for(name, GEOM, "vllm"), pools)
        toks = tokens(2000)
        keys, _ = prefill(org, 0, toks)
        decode_to(org, 0, toks, keys, 3330)
        org.preempt(0)
        org.check_invariants()
        assert org.pinned_checkpoints() == pinned, name
        if pinned:    # the attention block before it is held too
            (page,) = org.pins.blocks[0]
            assert org.pools[0].hold[page] == 1
        assert org.lookup(keys, len(toks) - 1).j_adopt == B
        org.abandon(0)
        assert org.pinned_checkpoints() == {} and not org.pins.blocks
        assert all(h == 0 for p in org.pools for h in p.hold)
        org.check_invariants()
