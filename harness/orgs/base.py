"""The organization: a coordinator of parts that each own one thing.

As vLLM V1 keeps a single-type manager per kind of state under a coordinator,
an `Organization` composes, over one `EntryTable` of pages (`harness.orgs.pool`
is the physical layer):

    AttentionIndex   attention blocks, their keys and lifetimes (attention.py)
    CheckpointStore  checkpoint-sized objects, publication, holds (checkpoints.py)
    PrefixLookup     the joint-hit rule and its memo (lookup.py)
    Publication      how live states become checkpoints: spares or in place (publication.py)
    Pins             what preemptions pinned, as a `PinPolicy` chose it (pins.py)

and the run's checkpoint policies (`CheckpointPolicy`, policies.py): the
publish policy the publication mode follows and the eviction policy the
entry table reclaims by.

The layout (`OrgLayout`, from each organization's module ``s0.py`` ..
``d0.py``) chooses the publication mode and the pin policy. The coordinator
holds the request table, does the per-pool page arithmetic (`pages_needed`,
`can_allocate`) and runs each request's lifecycle, calling the parts in the
order DESIGN.md section 2 needs. Scheduler and engines use the protocol
(`harness.orgs.protocol`) and the read-only views (`harness.orgs.views`).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

from harness.layout import OrgLayout
from harness.orgs.attention import AttentionIndex
from harness.orgs.checkpoints import CheckpointStore
from harness.orgs.entries import EntryTable, RequestState
from harness.orgs.keys import key_at
from harness.orgs.lookup import PrefixLookup
from harness.orgs.pins import Pins, pin_policy_for
from harness.orgs.policies import DEFAULT_POLICY, CheckpointPolicy
from harness.orgs.pool import pools_for
from harness.orgs.publication import (
    exported_edge,
    junction_edge,
    kept_edges,
    publication_for,
    registered_again,
)
from harness.orgs.slabs import SlabTable
from harness.orgs.split import PoolSplit
from harness.orgs.values import Demand, PrefixHit
from harness.orgs.views import ReadOnlyViews


class Organization(ReadOnlyViews):
    """One organization; subclasses name themselves and define their layout
    (u0 and e0 also how their pools share one region: `harness.orgs.region`)."""

    name = "base"
    #: how a byte target becomes this organization's pools (`harness.orgs.split`)
    pool_split: PoolSplit
    #: whether pages taken (and nothing freed) leave a refused allocation
    #: refused, so a stretch of decode steps need not ask the waiting head
    #: again after its blocks were taken (`harness.scheduler.stretch`)
    takes_keep_refusals = True
    #: what a preemption pins under ``paging="vllm"`` (`OrgLayout.preempt_pin`):
    #: hbench's vLLM plugin serves the organization and pins its joint hit
    vllm_preempt_pin = "joint"

    @staticmethod
    def layout_for(geom, grid) -> OrgLayout:
        """The layout for model geometry ``geom`` under ``grid`` (`harness.layout.Grid`)."""
        raise NotImplementedError

    @staticmethod
    def make_pools(layout: OrgLayout, pool_pages: tuple[int, ...]) -> list:
        """The pools of ``layout`` with ``pool_pages`` pages (`pools_for`); an
        organization whose pools change size while serving builds its own."""
        return pools_for(layout, pool_pages)

    def __init__(self, layout: OrgLayout, pool_pages: tuple[int, ...],
                 policy: CheckpointPolicy = DEFAULT_POLICY):
        self.layout = layout
        self.policy = policy
        self.attn_block_tokens = layout.attn_block_tokens
        self.grid = layout.grid_tokens
        assert self.grid % self.attn_block_tokens == 0, (self.attn_block_tokens, self.grid)
        self.pools = self.make_pools(layout, pool_pages)
        slabs = SlabTable(layout.slab_slots) if layout.conv_slots else None
        self.table = EntryTable(self.name, self.pools, slabs)
        self.table.evict = evict = policy.evict_policy()
        self._made_from = (layout, pool_pages, policy)
        if evict is not None and getattr(evict, "tuner", None) is not None:
            # Marconi's replay serves the bootstrap window through fresh copies
            # of this organization, each evicting with one candidate alpha
            evict.tuner.build = lambda alpha: self.twin(alpha=alpha)
        self.ckpts = CheckpointStore(self.table, layout, len(self.pools) - 1)
        self.publication = publication_for(layout, self.table, self.ckpts,
                                           policy.publish_policy())
        self.in_place = self.publication.in_place
        self.retiring = self.publication.retiring   # rids that went past a state this step
        self.retired = self.publication.retired     # rids whose next allocation releases one
        self.attn = AttentionIndex(self.table, layout.attn_block_tokens,
                                   cache_duplicates=self.in_place)
        self.prefix = PrefixLookup(self.table, self.attn, self.ckpts, self.grid)
        self.pins = Pins(pin_policy_for(layout.preempt_pin, self.attn, self.ckpts, self.grid),
                         self.table)
        self.reqs: dict[object, RequestState] = {}
        self._headroom: dict[float, tuple[int, ...]] = {}
        self._copies: tuple = ()                 # (reason, position, src, dst) entries

    def twin(self, **policy_changes) -> Organization:
        """A new, empty organization like this one: same layout and pool sizes,
        its policy with ``policy_changes`` (Marconi's replay, `check_fits`)."""
        layout, pool_pages, policy = self._made_from
        return type(self)(layout, pool_pages, replace(policy, **policy_changes))

    # ---- queries: change nothing ----------------------------------------------
    def lookup(self, keys, max_tokens: int) -> PrefixHit:
        """Deepest reusable prefix of ``keys`` no longer than ``max_tokens``."""
        return self.prefix.find(keys, max_tokens)

    def chunk_stop(self, rid, start: int, end: int, prefill_until: int,
                   hit: PrefixHit | None = None, prompt_len: int | None = None) -> int:
        """Where a prefill chunk [start, end) must end: in place, at the first
        edge strictly inside it whose state the request keeps (the junction
        first), unless the chunk exports that state itself
        (`publication.exported_edge`): vLLM's
        align mode caches a state at a chunk's end or in its prefill
        checkpoint block only (``_mamba_block_aligned_split`` in
        vllm/v1/core/sched/scheduler.py stops at the last cacheable edge and at
        a shared-prefix junction); else ``end``. A request not admitted yet
        keeps the edges of ``hit`` and ``prompt_len``. Changes nothing."""
        if not self.in_place:
            return end
        st = self.reqs.get(rid)
        if st is not None:
            keep, junction = st.keep, st.junction
        else:
            keep, junction = kept_edges(prompt_len, hit, self.grid), junction_edge(hit, self.grid)
        if start < junction < end:
            end = junction
        exported = exported_edge(keep, start, end, prefill_until, self.grid)
        return next((e for e in keep if start < e < end and e != exported), end)

    def publishes(self, rid, start: int, end: int, prefill_until: int) -> tuple[int, ...]:
        """In place, the edges whose state the admitted request's chunk
        [start, end) caches when the step ends: the one it exports
        (`publication.exported_edge`) and a kept edge it ends at; () otherwise.
        vLLM registers those blocks when it allocates them, so a request
        admitted later in the same step would hit a state not computed yet
        (`Scheduler.admit` defers it, as vLLM's Mamba manager does)."""
        if not self.in_place:
            return ()
        st = self.reqs[rid]
        edges = [e for e in (exported_edge(st.keep, start, end, prefill_until, self.grid),)
                 if e is not None]
        if end in st.keep:
            edges.append(end)
        return tuple(edges)

    def registers_again(self, rid, start: int, end: int) -> int | None:
        """In place, the edge whose state the admitted request's chunk
        [start, end) registers again though it is cached already
        (`publication.registered_again`, the replay edge in the step that ends
        the prefill); None otherwise. vLLM counts it with the step's new
        states, so a request admitted later in the step whose hit ends there
        waits a step, as for `publishes`."""
        if not self.in_place:
            return None
        return registered_again(self.reqs[rid].replay, start, end, self.grid)

    def version(self) -> int:
        """Changes whenever any page changes state (pools count their transitions)."""
        return self.prefix.version()

    def pages_needed(self, rid, end: int, prefill_until: int, keys=None,
                     hit: PrefixHit | None = None, prompt_len: int | None = None) -> Demand:
        """Pages per pool that ``allocate`` with the same arguments would take
        (in place, once the states an admitted request went past in an earlier
        step are released: `release_retired`, which ``allocate`` calls first)."""
        st = self.reqs.get(rid)   # admitted: it adopts nothing any more
        start, pages, adopted_slabs = self.prefix.adoption(keys, hit if st is None else None)
        adopted = tuple(pages)
        have_blocks = start // self.attn_block_tokens if st is None else len(st.attn)
        blocks = -(-end // self.attn_block_tokens) - have_blocks
        pages[0] += blocks if blocks > 0 else 0
        states = self.publication.states_needed(st, start, end, prefill_until, rid, keys,
                                                hit, prompt_len)
        if states:
            pages[-1] += self.ckpts.pages_for(states, adopted_slabs)
        return Demand(tuple(pages), adopted)

    def headroom_pages(self, fraction: float) -> tuple[int, ...]:
        """H = floor(f x B) per pool (pool sizes are fixed, so this is memoized)."""
        h = self._headroom.get(fraction)
        if h is None:
            h = self._headroom[fraction] = tuple(int(fraction * p.num_pages) for p in self.pools)
        return h

    def can_allocate(self, demand: Demand, headroom: float = 0.0) -> bool:
        """True iff every pool keeps at least floor(headroom x pages) free afterwards."""
        return all(p.available - d >= h for p, d, h in
                   zip(self.pools, demand.pages, self.headroom_pages(headroom), strict=True))

    def is_admitted(self, rid) -> bool:
        return rid in self.reqs

    # ---- actions ---------------------------------------------------------------
    def allocate(self, rid, end: int, prefill_until: int, keys=None,
                 hit: PrefixHit | None = None, prompt_len: int | None = None) -> bool:
        """Make room for tokens up to ``end``; False if it does not fit (nothing
        changed but `release_retired`, which comes first, as in vLLM).

        On the first call for ``rid`` the request adopts ``hit.j_adopt`` tokens of
        cached attention and the checkpoint at J, gets its live state, and any pin
        from an earlier preemption is released. The publication mode then takes
        its checkpoint-sized objects (`Publication.reserve`); in place
        ``prompt_len`` (default ``prefill_until``) and the hit decide which
        edges the request publishes (`harness.orgs.publication.kept_edges`)."""
        self._copies = ()
        self.release_retired(rid)
        st = self.reqs.get(rid)
        # room already reserved (most decode steps): nothing new is needed
        if (st is not None and end <= len(st.attn) * self.attn_block_tokens
                and not self.publication.needs_state(st, end, prefill_until)):
            return True
        if not self.can_allocate(self.pages_needed(rid, end, prefill_until, keys, hit,
                                                   prompt_len)):
            return False
        if st is None:
            if self.table.evict is not None:
                self.table.evict.admitted(rid, keys, prefill_until, len(self.reqs))
            st = self.reqs[rid] = RequestState()
            j = hit.j_adopt if hit else 0
            if j > 0:
                st.attn = self.attn.adopt(keys, j)
                st.adopted = self.ckpts.map[key_at(keys, j)]
                st.on_path.append(st.adopted)
                self.table.ref(st.adopted)
            st.computed = st.reserved_until = j
            st.live = self.ckpts.new()
            self.publication.admit(st, hit, prefill_until if prompt_len is None else prompt_len,
                                   rid, keys, prefill_until)
            if st.adopted is not None:
                self._copies = (("adopt", j, st.adopted, st.live),)
            self.pins.release(rid)
        n_blocks = -(-end // self.attn_block_tokens) - len(st.attn)
        if n_blocks > 0:
            st.attn.extend(self.attn.new_blocks(n_blocks))
        copies = self.publication.reserve(rid, st, end, prefill_until)
        if copies:
            self._copies = copies
        return True

    def release_retired(self, rid) -> bool:
        """In place, release the state the admitted request ``rid`` went past
        in an earlier step (`Publication.end_step`); True iff one was. vLLM
        frees it when it schedules the request next, before asking for its
        blocks, so `allocate` calls this first."""
        if rid not in self.retired:
            return False
        return self.publication.release_retired(rid, self.reqs[rid])

    def allocate_all(self, requests) -> bool:
        """``allocate(rid, end, prefill_until)`` for each running request of
        ``requests`` in order if all of them fit together, else False (nothing
        changed; always while a request's passed state is due, `release_retired`,
        which `allocate` releases at its turn). When none needs a
        checkpoint-sized object (`Publication.needs_state`), the attention
        blocks are taken in one go: the same pages in the same order. The
        scheduler asks it for a step's decodes (`Scheduler._decode_rooms`)."""
        bt, reqs, needs_state = self.attn_block_tokens, self.reqs, self.publication.needs_state
        if self.retired:      # released at each one's turn: plan them one by one
            return False
        # a decode (past the prefill) takes a checkpoint-sized object only where
        # commits publish in place: otherwise `needs_state` reads no further than
        # the prefill's end, which its last chunk reserved
        decodes_ask = self.in_place
        counts, total = [], 0
        for rid, end, prefill_until in requests:
            st = reqs[rid]
            if (decodes_ask or end <= prefill_until) and needs_state(st, end, prefill_until):
                return self._allocate_all_one_by_one(requests)
            b = -(-end // bt) - len(st.attn)
            b = b if b > 0 else 0
            counts.append(b)
            total += b
        if self.pools[0].available < total:    # the other pools are asked for nothing
            return False
        self._copies = ()
        if total == len(requests):          # a block each (a step's decodes, mostly)
            for (rid, _, _), page in zip(requests, self.attn.new_blocks(total), strict=True):
                reqs[rid].attn.append(page)
        elif total:
            new = iter(self.attn.new_blocks(total))
            for (rid, _, _), b in zip(requests, counts, strict=True):
                if b:
                    reqs[rid].attn.extend(islice(new, b))
        return True

    def _allocate_all_one_by_one(self, requests) -> bool:
        needs = [self.pages_needed(rid, end, prefill_until).pages
                 for rid, end, prefill_until in requests]
        if not self.can_allocate(Demand(tuple(map(sum, zip(*needs, strict=True))))):
            return False
        for rid, end, prefill_until in requests:
            assert self.allocate(rid, end, prefill_until)
        return True

    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]:
        """Tokens up to ``computed`` are done: register full attention blocks, let
        the publication mode publish; the positions of newly published checkpoints."""
        self._copies = ()
        st, bt = self.reqs[rid], self.attn_block_tokens
        assert computed <= len(st.attn) * bt, (computed, len(st.attn), bt)
        if computed // bt > st.computed // bt:
            self.attn.register(st.attn, keys, st.computed // bt, computed // bt)
        published, self._copies = self.publication.commit(rid, st, keys, computed, prefill_until)
        if st.adopted is not None and computed > st.computed:   # consumed into the live state
            self.publication.consumed(rid, st, st.adopted)
            st.adopted = None
        st.computed = max(st.computed, computed)
        return published

    def end_step(self) -> None:
        """The step is done: what the publication mode held for it falls due
        (`release_retired`)."""
        self.publication.end_step(self.reqs)

    def retain(self, rid, position: int, keys) -> bool:
        """Policy hold on the request's published checkpoint at ``position``."""
        st, e = self.reqs[rid], self.ckpts.map.get(key_at(keys, position))
        if e is None or e in st.retained:
            return False
        self.ckpts.retain(e)
        st.retained.append(e)
        return True

    def finish(self, rid) -> None:
        """Release everything the request holds; its registered blocks stay cached."""
        st = self.reqs.pop(rid)
        for e in st.retained:
            self.ckpts.unretain(e)
        if st.adopted is not None:
            self.table.unref(st.adopted)
        self.attn.release(st.attn)
        self.publication.finish(rid, st)
        for e in [st.live, *st.spares]:
            if e is not None:
                self.table.drop_owned(e)

    def preempt(self, rid) -> None:
        """Recompute-style preemption: release everything, first pinning what the
        layout's pin policy (`harness.orgs.pins`) chooses, until the request is
        admitted again or abandoned."""
        self.pins.hold(rid, self.reqs[rid])
        self.finish(rid)

    def abandon(self, rid) -> None:
        """Cancel: release what the request holds and any pin it left behind."""
        if rid in self.reqs:
            self.finish(rid)
        self.pins.release(rid)
