"""Auditing an organization: its invariants and its usage figures.

Kept apart from `harness.orgs.base` because none of it changes anything:
tests (and ``--debug-invariants``) call `check_invariants` after every step;
`usage` is the organization's memory by pool, state and kind; `StepMemory`
is the same arithmetic as the simulator's step table records it every step
(the one way an engine reads memory figures: nothing outside
`harness.orgs` reads a pool or an entry).
"""

from __future__ import annotations

from harness.orgs.entries import ATTN_ENTRY, CKPT_ENTRY
from harness.orgs.pool import ATTN, CONV, KINDS, SSM
from harness.orgs.slabs import NO_SLOT
from harness.orgs.values import Usage


def check_invariants(org) -> None:
    """Raise AssertionError with the broken values if any invariant fails."""
    for p in org.pools:
        p.check()
    refs = [[0] * len(p.ref) for p in org.pools]     # per page id (an elastic pool's
    holds = [[0] * len(p.ref) for p in org.pools]    # ids outside it included)
    deps = [[set() for _ in range(len(p.ref))] for p in org.pools]
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


def _counts(pools) -> tuple[list[int], int, int, int, int, int, int]:
    """Per pool its referenced, cached and free pages (one list, pool after
    pool), then over all pools the referenced and cached pages of each kind:
    attention, SSM, conv. Read from the pools' counters, so it costs a few
    operations per pool, never a scan of pages."""
    per_pool: list[int] = []
    ref_a = cached_a = ref_s = cached_s = ref_c = cached_c = 0
    for p in pools:
        n_lru, n_empty = len(p.lru), len(p.empty)
        per_pool += (p.num_pages - n_empty - n_lru, n_lru, n_empty)
        kind_pages, cached_pages = p.kind_pages, p.cached_pages
        c_a, c_s, c_c = cached_pages[ATTN], cached_pages[SSM], cached_pages[CONV]
        cached_a += c_a
        cached_s += c_s
        cached_c += c_c
        ref_a += kind_pages[ATTN] - c_a
        ref_s += kind_pages[SSM] - c_s
        ref_c += kind_pages[CONV] - c_c
    return per_pool, ref_a, cached_a, ref_s, cached_s, ref_c, cached_c


def _attention_bytes(lay, ref: int, cached: int) -> tuple[int, int, int]:
    """(referenced, cached, waste) bytes per pool layer of ``ref`` referenced and
    ``cached`` cached attention blocks; waste is page minus block bytes."""
    block = lay.attn_block_bytes
    return ref * block, cached * block, (ref + cached) * (lay.attn_page_bytes - block)


def _checkpoint_bytes(lay, ref_s: int, cached_s: int, ref_c: int,
                      cached_c: int) -> tuple[int, int, int, int, int, int]:
    """(SSM referenced, SSM cached, SSM waste, conv referenced, conv cached, conv
    waste) bytes per pool layer of these SSM member pages and conv pages.
    Waste is what the pages allocate beyond the checkpoints they hold; S0 and
    D0 keep the conv state inside the SSM page, so its waste counts there."""
    per_ckpt = max(lay.ssm_pages, 1)
    n_ref, n_cached = ref_s / per_ckpt, cached_s / per_ckpt
    ssm_pages = ref_s + cached_s
    n_ckpt = ssm_pages / per_ckpt
    ssm_alloc = ssm_pages * lay.ckpt_page_bytes
    if lay.conv_pages == 0 and not lay.conv_slots:   # conv shares the SSM page (S0, D0)
        ssm_waste, conv_waste = ssm_alloc - n_ckpt * (lay.ssm_bytes + lay.conv_bytes), 0
    else:
        ssm_waste = ssm_alloc - n_ckpt * lay.ssm_bytes
        conv_waste = (ref_c + cached_c) * lay.ckpt_page_bytes - n_ckpt * lay.conv_bytes
    return (int(n_ref * lay.ssm_bytes), int(n_cached * lay.ssm_bytes), int(ssm_waste),
            int(n_ref * lay.conv_bytes), int(n_cached * lay.conv_bytes), int(conv_waste))


def usage(org) -> Usage:
    """Pages per pool and state, pages, bytes and waste per state kind (per pool layer)."""
    lay = org.layout
    per_pool, ref_a, cached_a, ref_s, cached_s, ref_c, cached_c = _counts(org.pools)
    pages = {p.name: dict(zip(("referenced", "cached", "free"), per_pool[3 * i:3 * i + 3],
                              strict=True)) for i, p in enumerate(org.pools)}
    a_ref, a_cached, a_waste = _attention_bytes(lay, ref_a, cached_a)
    s_ref, s_cached, s_waste, c_ref, c_cached, c_waste = _checkpoint_bytes(
        lay, ref_s, cached_s, ref_c, cached_c)
    by_kind = {ATTN: {"referenced": ref_a, "cached": cached_a},
               SSM: {"referenced": ref_s, "cached": cached_s},
               CONV: {"referenced": ref_c, "cached": cached_c}}
    bytes_by_kind = {ATTN: {"referenced": a_ref, "cached": a_cached},
                     SSM: {"referenced": s_ref, "cached": s_cached},
                     CONV: {"referenced": c_ref, "cached": c_cached}}
    waste = {ATTN: a_waste, SSM: s_waste, CONV: c_waste}
    slabs = org.table.slabs
    occ = slabs.occupancy() if slabs is not None else float("nan")
    return Usage(pages, by_kind, bytes_by_kind, waste, occ, org.invalidations)


#: Per state kind, in row order: the kind and its step-table columns' names.
KIND_COLUMNS = tuple((k, f"blocks_{k}_referenced", f"blocks_{k}_cached", f"mem_{k}_bytes",
                      f"cached_{k}_bytes", f"waste_{k}_bytes") for k in KINDS)


class StepMemory:
    """An organization's memory as a step table records it, once per step.

    ``columns`` names the values `sample` returns: cumulative invalidations
    by kind (``invalidations_attention`` blocks, ``invalidations_checkpoint``
    checkpoints), slab occupancy, pages per pool and state
    (``pages_<pool>_<state>``), then per state kind (`KIND_COLUMNS`) its
    referenced and cached pages and its referenced, cached and waste bytes,
    whole model (per pool layer times ``layers``). The figures are `usage`'s,
    from the same arithmetic, in the same types (tests/unit/adapters/sim/test_recorder_memory.py
    holds the two together). ``peak`` (referenced bytes per kind) and
    ``waste_peak`` (total waste) are the largest values sampled so far.

    It runs every simulated step that changed pages, so it reads the pools'
    counters only, and the SSM and conv figures, which depend on four page
    counts that a step taking attention blocks leaves alone (always, in D0's
    dual pools), are kept with those counts and computed again only when one
    changed.
    """

    def __init__(self, org, layers: int):
        self.org, self.layers = org, layers
        cols = ["invalidations_attention", "invalidations_checkpoint", "slab_occupancy"]
        for p in org.pools:
            cols += [f"pages_{p.name}_{state}" for state in ("referenced", "cached", "free")]
        for _, *names in KIND_COLUMNS:
            cols += names
        self.columns: tuple[str, ...] = tuple(cols)
        self.peak = dict.fromkeys(KINDS, 0)
        self.waste_peak = 0
        self._ckpt_counts: tuple | None = None   # the page counts `_ckpt_values` are of
        self._ckpt_values: tuple = ()            # their SSM and conv columns, their waste

    def sample(self) -> tuple:
        """The values of ``columns`` now; the peaks updated."""
        org, layers = self.org, self.layers
        table = org.table
        by_kind, slabs = table.invalidations_by_kind, table.slabs
        out = [by_kind[ATTN_ENTRY], by_kind[CKPT_ENTRY],
               slabs.occupancy() if slabs is not None else float("nan")]
        per_pool, ref_a, cached_a, ref_s, cached_s, ref_c, cached_c = _counts(org.pools)
        out += per_pool
        a_ref, a_cached, a_waste = _attention_bytes(org.layout, ref_a, cached_a)
        b = a_ref * layers
        waste = a_waste * layers
        out += (ref_a, cached_a, b, a_cached * layers, waste)
        if b > self.peak[ATTN]:
            self.peak[ATTN] = b
        counts = (ref_s, cached_s, ref_c, cached_c)
        if counts != self._ckpt_counts:
            self._ckpt_counts = counts
            self._ckpt_values = self._checkpoint_columns(ref_s, cached_s, ref_c, cached_c)
        values, ckpt_waste = self._ckpt_values
        out += values
        waste += ckpt_waste
        if waste > self.waste_peak:
            self.waste_peak = waste
        return tuple(out)

    def _checkpoint_columns(self, ref_s: int, cached_s: int, ref_c: int,
                            cached_c: int) -> tuple[tuple, int]:
        """The SSM and conv columns for these page counts (their peaks updated),
        and their waste together."""
        layers, peak = self.layers, self.peak
        s_ref, s_cached, s_waste, c_ref, c_cached, c_waste = (
            v * layers for v in _checkpoint_bytes(self.org.layout, ref_s, cached_s, ref_c,
                                                   cached_c))
        if s_ref > peak[SSM]:
            peak[SSM] = s_ref
        if c_ref > peak[CONV]:
            peak[CONV] = c_ref
        return ((ref_s, cached_s, s_ref, s_cached, s_waste,
                 ref_c, cached_c, c_ref, c_cached, c_waste), s_waste + c_waste)
