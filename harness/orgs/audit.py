"""Auditing an organization: its invariants and its usage figures.

Kept apart from `harness.orgs.base` because neither changes anything: tests
(and ``--debug-invariants``) call `check_invariants` after every step, and the
engine reads `usage` once per step for the per-step table.
"""

from __future__ import annotations

from harness.orgs.pool import ATTN, CONV, KINDS, SSM
from harness.orgs.slabs import NO_SLOT
from harness.orgs.values import Usage


def check_invariants(org) -> None:
    """Raise AssertionError with the broken values if any invariant fails."""
    for p in org.pools:
        p.check()
    refs = [[0] * p.num_pages for p in org.pools]
    holds = [[0] * p.num_pages for p in org.pools]
    deps = [[set() for _ in range(p.num_pages)] for p in org.pools]
    entries, slabs = org.table.entries, org.table.slabs
    for eid, e in entries.items():
        assert e.valid and e.id == eid, f"{org.name}: bad entry record {e}"
        assert e.refs >= 0 and e.pins >= 0 and e.retains >= 0, f"{org.name}: negative {e}"
        assert all(pool == org.ckpts.pool_idx for pool, _ in e.members), (
            f"{org.name}: {e} outside checkpoint pool")
        now = tuple(org.pools[pool].generation[page] for pool, page in e.pages)
        assert now == e.generations, (
            f"{org.name}: storage of {e} was handed out again: generations {e.generations} -> {now}")
        for pool, page in e.pages:
            refs[pool][page] += e.refs
            holds[pool][page] += 1 if e.held else 0
            deps[pool][page].add(eid)
        if e.slot is not NO_SLOT:
            occ = slabs.occupants.get(e.slot.slab)
            assert occ is not None and occ[e.slot.slot] == eid, (
                f"{org.name}: {e} slot {e.slot} not recorded in slab table")
    _count_blocks(org, refs, holds, deps)
    for i, p in enumerate(org.pools):
        assert refs[i] == p.ref, f"{org.name}: pool {p.name} page refs {p.ref} != entry refs {refs[i]}"
        assert holds[i] == p.hold, f"{org.name}: pool {p.name} holds {p.hold} != {holds[i]}"
        assert deps[i] == p.dependents, f"{org.name}: pool {p.name} reverse index out of step"
    for kind, m in org.table.maps.items():
        for k, e in m.items():
            assert e.valid and e.key == k and e.kind == kind and e.id in entries, (
                f"{org.name}: lookup map holds stale {e}")
    attn = org.attn
    for k, page in attn.map.items():
        assert attn.block_id[page] >= 0 and attn.key[page] == k, (
            f"{org.name}: attention map holds stale page {page} for key {k}")
    for k, pages in attn.duplicates.items():
        assert pages and k in attn.map and attn.map[k] not in pages, (
            f"{org.name}: copies {pages} of {k} without another registered block")
        assert all(attn.block_id[p] >= 0 and attn.key[p] == k for p in pages), (
            f"{org.name}: copies of {k} hold stale pages {pages}")
    for kind, waiting in org.table.duplicates.items():
        for k, dups in waiting.items():
            assert dups and k in org.table.maps[kind], (
                f"{org.name}: duplicates of {k} without a registered entry")
            for e in dups:
                assert (e.valid and e.key == k and e.kind == kind and e.id in entries
                        and org.table.maps[kind][k] is not e), (
                    f"{org.name}: duplicate list holds stale {e}")
    if slabs is not None:
        for slab, occ in slabs.occupants.items():
            assert any(o is not None for o in occ), f"{org.name}: empty slab {slab} kept open"
            for o in occ:
                assert o is None or (o in entries and entries[o].slot.slab == slab), (
                    f"{org.name}: slab {slab} lists unknown occupant {o}")
    for rid, st in org.reqs.items():
        for e in [st.live, *st.spares, st.adopted]:
            assert e is None or (e.valid and e.refs >= 1), f"{org.name}: request {rid} holds {e}"
        for page in st.attn:
            assert attn.block_id[page] >= 0, f"{org.name}: request {rid} holds no block at {page}"
    for rid, e in org.pins.checkpoints.items():
        assert e.valid and e.pins >= 1, f"{org.name}: pin of {rid} on {e}"
    for rid, pages in org.pins.blocks.items():
        assert rid in org.pins.checkpoints, f"{org.name}: blocks of {rid} pinned without its checkpoint"
        for page in pages:
            assert attn.block_id[page] >= 0 and attn.key[page] is not None, (
                f"{org.name}: pin of {rid} on page {page}, which holds no registered block")


def _count_blocks(org, refs, holds, deps) -> None:
    """Add the attention blocks to the references, holds and reverse index
    recounted from the entries: a block is referenced once by each request
    whose block list holds its page, held once by each preemption that pinned
    it, and its page lists its id. Checks that no block's page was handed out
    again since the block was built, that block ids name nothing else, and
    that a registered block is the one its key finds (or a copy waiting)."""
    attn = org.attn
    pool = org.pools[0]
    ids = set(org.table.entries)
    for page, eid in enumerate(attn.block_id):
        if eid < 0:
            assert attn.key[page] is None, f"{org.name}: key {attn.key[page]} on blockless page {page}"
            continue
        assert eid not in ids, f"{org.name}: block id {eid} at page {page} also names an entry"
        ids.add(eid)
        assert pool.generation[page] == attn.built[page], (
            f"{org.name}: storage of the block at page {page} was handed out again: "
            f"generation {attn.built[page]} -> {pool.generation[page]}")
        k = attn.key[page]
        assert k is None or attn.map.get(k) == page or page in attn.duplicates.get(k, ()), (
            f"{org.name}: registered block at page {page} is not what its key {k} finds")
        deps[0][page].add(eid)
    for st in org.reqs.values():
        for page in st.attn:
            refs[0][page] += 1
    for pages in org.pins.blocks.values():
        for page in pages:
            holds[0][page] += 1


def checkpoint_waste(lay, ssm_pages: int, conv_pages: int) -> tuple[float, float]:
    """(SSM, conv) bytes per pool layer that ``ssm_pages`` SSM member pages and
    ``conv_pages`` conv pages allocate beyond the checkpoints they hold; S0 and
    D0 keep the conv state inside the SSM page, so its bytes count there.
    `usage` and the simulator's step recorder both count waste with it."""
    n_ckpt = ssm_pages / max(lay.ssm_pages, 1)
    ssm_alloc = ssm_pages * lay.ckpt_page_bytes
    if lay.conv_pages == 0 and not lay.conv_slots:   # conv shares the SSM page (S0, D0)
        return ssm_alloc - n_ckpt * (lay.ssm_bytes + lay.conv_bytes), 0
    return (ssm_alloc - n_ckpt * lay.ssm_bytes,
            conv_pages * lay.ckpt_page_bytes - n_ckpt * lay.conv_bytes)


def usage(org) -> Usage:
    lay = org.layout
    pages = {p.name: {"referenced": p.num_referenced, "cached": p.num_cached,
                      "free": len(p.empty)} for p in org.pools}
    by_kind = {k: {"referenced": 0, "cached": 0} for k in KINDS}
    for p in org.pools:
        for k in KINDS:
            by_kind[k]["cached"] += p.cached_pages[k]
            by_kind[k]["referenced"] += p.kind_pages[k] - p.cached_pages[k]
    per_ckpt_ssm = max(lay.ssm_pages, 1)
    bytes_by_kind = {k: {} for k in KINDS}
    for state in ("referenced", "cached"):
        n_ckpt = by_kind[SSM][state] / per_ckpt_ssm
        bytes_by_kind[ATTN][state] = by_kind[ATTN][state] * lay.attn_block_bytes
        bytes_by_kind[SSM][state] = int(n_ckpt * lay.ssm_bytes)
        bytes_by_kind[CONV][state] = int(n_ckpt * lay.conv_bytes)
    ssm_waste, conv_waste = checkpoint_waste(lay, sum(by_kind[SSM].values()),
                                             sum(by_kind[CONV].values()))
    waste = {
        ATTN: sum(by_kind[ATTN].values()) * (lay.attn_page_bytes - lay.attn_block_bytes),
        SSM: int(ssm_waste),
        CONV: int(conv_waste),
    }
    slabs = org.table.slabs
    occ = slabs.occupancy() if slabs is not None else float("nan")
    return Usage(pages, by_kind, bytes_by_kind, waste, occ, org.invalidations)
