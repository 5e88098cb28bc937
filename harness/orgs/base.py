"""The organization: a thin coordinator over an attention index and a checkpoint store.

As vLLM V1 keeps a single-type manager per kind of state under a coordinator,
an `Organization` keeps its attention blocks in an `AttentionIndex`, its
checkpoint-sized objects in a `CheckpointStore`, both over one `EntryTable`
of pages (`harness.orgs.pool` is the physical layer). The coordinator adds
what needs both halves: the joint-hit rule of `lookup` (attention for [0, J)
AND a checkpoint at J), the per-pool page arithmetic of `pages_needed`, and
the request lifecycle. What the four organizations differ in is their
`OrgLayout`, which each organization's module defines (`s0.py` .. `d0.py`).
The protocol a scheduler and an engine may use is `harness.orgs.protocol`;
the read-only queries are in `harness.orgs.views`.
"""

from __future__ import annotations

from harness.layout import OrgLayout
from harness.orgs.attention import AttentionIndex
from harness.orgs.checkpoints import CheckpointStore
from harness.orgs.entries import EntryTable, RequestState
from harness.orgs.keys import KEY_TOKENS, key_at
from harness.orgs.pool import PagePool
from harness.orgs.slabs import SlabTable
from harness.orgs.values import Demand, PrefixHit
from harness.orgs.views import ReadOnlyViews


def kept_edges(prompt_len: int, hit: PrefixHit | None, block: int) -> tuple[int, ...]:
    """The block edges whose state a request publishes in place: those vLLM 0.32
    keeps with its default ``--prefix-cache-retention-interval 0``
    (``replay_boundaries`` and ``reachable_block_mask`` in
    vllm/v1/core/kv_cache_coordinator.py and single_type_kv_cache_manager.py):

    - the *replay boundary*, the last edge before the prompt's last token
      (a resend of the prompt recomputes that token), from the original
      prompt even when a preempted request recomputes its output too;
    - the *shared-prefix junction*: when the request's lookup found cached
      attention deeper than the joint hit, the state at that depth, so that
      requests sharing the prefix can resume there next time.

    Every other edge, decode edges included, is passed without publishing:
    measured on vLLM's CPU build, a request preempted past a decode edge
    finds no Mamba state there and recomputes from its last kept edge.
    """
    kept = {(prompt_len - 1) // block * block}
    if hit is not None and hit.attn_depth > hit.j_adopt:
        kept.add(hit.attn_depth // block * block)
    kept.discard(0)
    return tuple(sorted(kept))


class Organization(ReadOnlyViews):
    """One organization; subclasses only name themselves and define their layout."""

    name = "base"
    #: what a preemption pins under ``paging="vllm"`` (`OrgLayout.preempt_pin`):
    #: hbench's vLLM plugin serves the organization and pins its joint hit
    vllm_preempt_pin = "joint"

    @staticmethod
    def layout_for(geom) -> OrgLayout:
        raise NotImplementedError

    def __init__(self, layout: OrgLayout, pool_pages: tuple[int, ...]):
        self.layout = layout
        self.attn_block_tokens = layout.attn_block_tokens
        self.grid = layout.grid_tokens
        self.in_place = layout.publish_in_place
        assert self.grid % self.attn_block_tokens == 0, (self.attn_block_tokens, self.grid)
        if layout.dual_pool:
            self.pools = [PagePool("attention", pool_pages[0], layout.attn_page_bytes),
                          PagePool("checkpoint", pool_pages[1], layout.ckpt_page_bytes)]
        else:
            self.pools = [PagePool("shared", pool_pages[0], layout.attn_page_bytes)]
        slabs = SlabTable(layout.slab_slots) if layout.conv_slots else None
        self.table = EntryTable(self.name, self.pools, slabs)
        self.attn = AttentionIndex(self.table, layout.attn_block_tokens,
                                   cache_duplicates=self.in_place)
        self.ckpts = CheckpointStore(self.table, layout, len(self.pools) - 1)
        self.reqs: dict[object, RequestState] = {}
        self.pinned: dict[object, object] = {}   # rid -> the checkpoint its preemption pinned
        self.pinned_blocks: dict[object, list] = {}   # rid -> pages of the blocks pinned with it
        self._headroom: dict[float, tuple[int, ...]] = {}
        self._copies: tuple = ()                 # (reason, position, src, dst) entries
        # `lookup`'s last answer and what it depends on: the keys (same list,
        # same length), the limit, what entered and left the lookup maps
        # (registering a block changes no page) and, for its adoption cost
        # only, the pages' state (`version`)
        self._lookup_memo: tuple | None = None
        self.retiring: list = []                 # rids whose edge is released at end_step

    # ================= queries: change nothing =================================
    def lookup(self, keys, max_tokens: int) -> PrefixHit:
        """Deepest reusable prefix of ``keys`` no longer than ``max_tokens``."""
        version = self.version()
        # entries enter the maps by registration or publication and leave them
        # only when invalidated: the depths below read nothing else
        maps = (self.attn.registrations, self.ckpts.published_count, self.table.invalidations)
        memo = self._lookup_memo   # the last answer: asked again before the maps changed?
        if (memo is not None and memo[0] is keys and memo[1] == len(keys)
                and memo[2] == max_tokens and memo[3] == maps):
            j_adopt, r_max, depth, then, pages, slabs = memo[4]
            if then != version:    # pages changed state since: only the cost is asked again
                pages, slabs = self._adoption_cost(keys, j_adopt)
                self._lookup_memo = (*memo[:4], (j_adopt, r_max, depth, version, pages, slabs))
            return PrefixHit(j_adopt, r_max, depth, version, pages, slabs)   # a hit of its own
        limit = min(max_tokens, len(keys) * KEY_TOKENS)
        depth = self.attn.depth(keys, limit)
        ckpt_map, grid = self.ckpts.map, self.grid
        j_adopt = r_max = 0
        for j in range(limit - limit % grid, 0, -grid):
            if key_at(keys, j) in ckpt_map:
                if not r_max:
                    r_max = j
                if j <= depth:
                    j_adopt = j
                    break
        pages, slabs = self._adoption_cost(keys, j_adopt)
        hit = PrefixHit(j_adopt=j_adopt, r_max=r_max, attn_depth=depth,
                        version=version, adopt_pages=pages, adopt_slabs=slabs)
        self._lookup_memo = (keys, len(keys), max_tokens, maps,
                             (j_adopt, r_max, depth, version, pages, slabs))
        return hit

    def version(self) -> int:
        """Changes whenever any page changes state (pools count their transitions)."""
        return sum(p.version for p in self.pools)

    def _adoption_cost(self, keys, j: int) -> tuple[tuple[int, ...], frozenset]:
        pages = [0] * len(self.pools)
        if j <= 0:
            return tuple(pages), frozenset()
        pages[0] += self.attn.free_pages_to_adopt(keys, j)
        n, slabs = self.ckpts.free_pages_to_adopt(key_at(keys, j))
        pages[-1] += n
        return tuple(pages), slabs

    def _new_objects(self, st: RequestState | None, start: int, end: int,
                     prefill_until: int) -> tuple[int, int]:
        """(attention blocks, checkpoint objects) needed to cover tokens up to ``end``."""
        if st is None:
            have_blocks, reserved, live = start // self.attn_block_tokens, start, 1
        else:
            have_blocks, reserved, live = len(st.attn), st.reserved_until, 0
        blocks = -(-end // self.attn_block_tokens) - have_blocks
        if self.in_place:      # no spares: a new live state once past an edge
            if st is not None and st.at_edge and end > st.computed:
                live = 1
            return (blocks if blocks > 0 else 0), live
        last = end if end < prefill_until else prefill_until
        ckpts = last // self.grid - reserved // self.grid
        return (blocks if blocks > 0 else 0), (ckpts if ckpts > 0 else 0) + live

    def pages_needed(self, rid, end: int, prefill_until: int, keys=None,
                     hit: PrefixHit | None = None) -> Demand:
        """Pages per pool that ``allocate`` with the same arguments would take."""
        st = self.reqs.get(rid)
        pages = [0] * len(self.pools)
        adopted_slabs: frozenset = frozenset()
        start = 0
        if st is None and hit is not None and hit.j_adopt:
            start = hit.j_adopt
            if hit.version == self.version():
                pages, adopted_slabs = list(hit.adopt_pages), hit.adopt_slabs
            else:
                adopt, adopted_slabs = self._adoption_cost(keys, start)
                pages = list(adopt)
        blocks, ckpts = self._new_objects(st, start, end, prefill_until)
        pages[0] += blocks
        if ckpts:
            pages[-1] += self.ckpts.pages_for(ckpts, adopted_slabs)
        return Demand(tuple(pages))

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

    # ================= actions ==================================================
    def allocate(self, rid, end: int, prefill_until: int, keys=None,
                 hit: PrefixHit | None = None, prompt_len: int | None = None) -> bool:
        """Make room for tokens up to ``end``; False (nothing changed) if it does not fit.

        On the first call for ``rid`` the request adopts ``hit.j_adopt`` tokens of
        cached attention and the checkpoint at J, gets its live state, and any pin
        from an earlier preemption is released. Grid boundaries up to
        ``min(end, prefill_until)`` get a spare checkpoint object for publication.
        In place, ``prompt_len`` (the request's original prompt; default
        ``prefill_until``) and the hit decide which edges it publishes
        (`kept_edges`).
        """
        self._copies = ()
        st = self.reqs.get(rid)
        # room already reserved (most decode steps): `_new_objects` would be (0, 0)
        if (st is not None and end <= len(st.attn) * self.attn_block_tokens
                and (not st.at_edge if self.in_place
                     else min(end, prefill_until) // self.grid <= st.reserved_until // self.grid)):
            return True
        if not self.can_allocate(self.pages_needed(rid, end, prefill_until, keys, hit)):
            return False
        if st is None:
            st = self.reqs[rid] = RequestState()
            j = hit.j_adopt if hit else 0
            if j > 0:
                st.attn = self.attn.adopt(keys, j)
                st.adopted = self.ckpts.map[key_at(keys, j)]
                st.on_path.append(st.adopted)
                self.table.ref(st.adopted)
            st.computed = st.reserved_until = j
            st.live = self.ckpts.new()
            if self.in_place:
                st.keep = kept_edges(prefill_until if prompt_len is None else prompt_len,
                                     hit, self.grid)
            if st.adopted is not None:
                self._copies = (("adopt", j, st.adopted, st.live),)
            self._unpin(rid)
        n_blocks = -(-end // self.attn_block_tokens) - len(st.attn)
        if n_blocks > 0:
            st.attn.extend(self.attn.new_blocks(n_blocks))
        if self.in_place:
            if st.at_edge and end > st.computed:   # continue past the edge
                edge = st.live
                st.live, st.at_edge = self.ckpts.new(), False
                self._retire(rid, st, edge)    # read by this step's copy; released after it
                self._copies = (("publish", st.computed, edge, st.live),)
            return True
        last = min(end, prefill_until)
        grid = self.grid
        while (st.reserved_until // grid + 1) * grid <= last:
            st.spares.append(self.ckpts.new())
            st.reserved_until = (st.reserved_until // grid + 1) * grid
        return True

    def allocate_all(self, requests) -> bool:
        """``allocate(rid, end, prefill_until)`` for each running request of
        ``requests`` in order, if the pages all of them need together
        (`pages_needed` summed) are available; False (nothing changed)
        otherwise. When none of them needs a checkpoint-sized object (a spare
        for a grid boundary; in place, a new live state past a published edge)
        only attention blocks are new: they are counted and taken in one go,
        the same pages in the same order as one `allocate` after another."""
        bt, grid, reqs, in_place = self.attn_block_tokens, self.grid, self.reqs, self.in_place
        counts, total = [], 0
        for rid, end, prefill_until in requests:
            st = reqs[rid]
            if in_place:
                if st.at_edge and end > st.computed:
                    return self._allocate_all_one_by_one(requests)
            elif (end if end < prefill_until else prefill_until) // grid \
                    > st.reserved_until // grid:
                return self._allocate_all_one_by_one(requests)
            b = -(-end // bt) - len(st.attn)
            b = b if b > 0 else 0
            counts.append(b)
            total += b
        pools = self.pools
        if pools[0].available - total < 0 or any(p.available < 0 for p in pools[1:]):
            return False
        self._copies = ()
        if total:
            new = self.attn.new_blocks(total)
            i = 0
            for (rid, _, _), b in zip(requests, counts, strict=True):
                if b:
                    reqs[rid].attn.extend(new[i:i + b])
                    i += b
        return True

    def next_blocks(self, rids) -> bool:
        """One more attention block for each of ``rids`` (running requests that
        decode past their last full block) in order, if pool 0 has the pages;
        False (nothing changed) otherwise. Where no checkpoint is published in
        place a decoding request needs no checkpoint-sized object (its prefill
        reserved every spare), so this is `allocate_all` for them without the
        asking: the same pages in the same order."""
        if self.pools[0].available < len(rids):
            return False
        self._copies = ()
        reqs = self.reqs
        for rid, page in zip(rids, self.attn.new_blocks(len(rids)), strict=True):
            reqs[rid].attn.append(page)
        return True

    def _allocate_all_one_by_one(self, requests) -> bool:
        total = None
        for rid, end, prefill_until in requests:
            need = self.pages_needed(rid, end, prefill_until).pages
            total = need if total is None else tuple(a + b for a, b in zip(total, need, strict=True))
        if not self.can_allocate(Demand(total)):
            return False
        for rid, end, prefill_until in requests:
            assert self.allocate(rid, end, prefill_until)
        return True

    def commit(self, rid, keys, computed: int, prefill_until: int) -> list[int]:
        """Tokens up to ``computed`` are done: register full attention blocks and
        publish checkpoints at grid boundaries reached during prefill. Returns the
        positions of newly published checkpoints."""
        self._copies = ()
        st, bt = self.reqs[rid], self.attn_block_tokens
        assert computed <= len(st.attn) * bt, (computed, len(st.attn), bt)
        if computed // bt > st.computed // bt:
            self.attn.register(st.attn, keys, st.computed // bt, computed // bt)
        if self.in_place:
            published = self._reach_edge(st, keys, computed) \
                if computed % self.grid == 0 and computed > st.computed else []
        else:
            j = (st.computed // self.grid + 1) * self.grid
            published = self._publish(st, keys, j, min(computed, prefill_until)) \
                if j <= prefill_until and j <= computed else []
        if st.adopted is not None and computed > st.computed:   # consumed into the live state
            if self.in_place:   # vLLM frees the hit's block as it frees an edge's
                self._retire(rid, st, st.adopted)
            else:
                self.table.unref(st.adopted)
            st.adopted = None
        st.computed = max(st.computed, computed)
        return published

    def _publish(self, st: RequestState, keys, j: int, last: int) -> list[int]:
        """Publish the live state at each grid boundary j .. last; the request
        continues in a spare (or, if the prefix is published already, keeps its
        live state and frees the spare)."""
        published, copies = [], []
        while j <= last:
            spare = st.spares.pop(0)
            k = key_at(keys, j)
            if k in self.ckpts.map:
                self.table.drop_owned(spare)   # someone published this prefix already
                st.on_path.append(self.ckpts.map[k])
            else:
                ck = st.live
                self.ckpts.publish(ck, k, j)
                st.published.append(ck)
                st.live = spare
                published.append(j)
                copies.append(("publish", j, ck, spare))
            j += self.grid
        self._copies = tuple(copies)
        return published

    def _retire(self, rid, st: RequestState, e) -> None:
        """In place: ``e`` (an edge the request went past, or the checkpoint it
        adopted, once its state is copied) is released when the step ends."""
        assert st.retiring is None, f"{self.name}: {rid} retires two states in one step"
        st.retiring = e
        self.retiring.append(rid)

    def end_step(self) -> None:
        """The step is done: the states requests went past in it (`_retire`) are
        released, in the order they were retired; a published one stays cached.
        vLLM's align mode frees such a block when the request is scheduled next
        (`MambaManager.remove_skipped_blocks`), after the step's copy read it;
        until then it counts as held, and blocks it frees enter the LRU queue
        in that order."""
        for rid in self.retiring:
            st = self.reqs.get(rid)
            if st is not None and st.retiring is not None:
                self._release_edge(st.retiring)
                st.retiring = None
        self.retiring.clear()

    def _reach_edge(self, st: RequestState, keys, j: int) -> list[int]:
        """In place: the live state is now the state at edge ``j`` and stays the
        request's state until it computes past ``j`` (then it takes a new one,
        as vLLM's align mode moves to a new block at every edge). At a kept
        edge (`kept_edges`) the state is also published as ``j``'s
        checkpoint (a duplicate if the prefix is published already)."""
        st.at_edge = True
        k = key_at(keys, j)
        cached = self.ckpts.map.get(k)
        if cached is not None:
            st.on_path.append(cached)
        if j not in st.keep:
            return []
        live = st.live
        self.ckpts.publish(live, k, j)    # a duplicate if ``cached``: vLLM keeps both
        self.table.ref(live)
        st.published.append(live)
        return [j] if cached is None else []

    def _release_edge(self, e) -> None:
        """An edge's state the request no longer needs: a published one stays
        cached; one that was not published is freed."""
        if e.key is not None:
            self.table.unref(e)
        else:
            self.table.drop_owned(e)

    def retain(self, rid, position: int, keys) -> bool:
        """Policy hold on the request's published checkpoint at ``position``."""
        st = self.reqs[rid]
        e = self.ckpts.map.get(key_at(keys, position))
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
        if st.retiring is not None:
            self._release_edge(st.retiring)
            st.retiring = None
        if st.at_edge:                      # in place: a published edge stays cached
            self._release_edge(st.live)
            st.live = None
        for e in [st.live, *st.spares]:
            if e is not None:
                self.table.drop_owned(e)

    def preempt(self, rid) -> None:
        """Recompute-style preemption: release everything, first pinning what the
        layout's ``preempt_pin`` says until the request is admitted again:

        - "checkpoint" (the study): the deepest valid checkpoint on the
          request's own path, whether it published it, adopted it, or found it
          already published at one of its boundaries;
        - "joint" (hbench's vLLM plugin): the longest joint hit a lookup would
          find now, its checkpoint and the attention blocks before it
          (`_joint_hit`);
        - "none" (stock vLLM): nothing."""
        st = self.reqs[rid]
        how, ckpt, blocks = self.layout.preempt_pin, None, []
        if how == "checkpoint":
            for e in [*st.published, *st.on_path]:
                if e is not None and e.valid and (ckpt is None or e.pos > ckpt.pos):
                    ckpt = e
        elif how == "joint":
            ckpt, blocks = self._joint_hit(st)
        if ckpt is not None:
            self.table.pin(ckpt)
        for page in blocks:
            self.pools[0].add_hold(page)
        self.finish(rid)
        if ckpt is not None:
            self.pinned[rid] = ckpt
        if blocks:
            self.pinned_blocks[rid] = blocks

    def _joint_hit(self, st: RequestState) -> tuple:
        """(checkpoint, attention blocks before it) of the longest joint hit a
        lookup of the request's tokens would find now, or (None, []). Its
        registered blocks are in lookup, so the edges to try are those of its
        leading registered blocks (block edges are the grid in place)."""
        assert self.grid == self.attn_block_tokens, "joint pins need checkpoints on block edges"
        key, n = self.attn.key, 0
        while n < len(st.attn) and key[st.attn[n]] is not None:
            n += 1
        for b in range(n, 0, -1):
            ckpt = self.ckpts.map.get(key[st.attn[b - 1]])    # the prefix [0, b B)'s key
            if ckpt is not None:
                return ckpt, [self.attn.map[key[page]] for page in st.attn[:b]]
        return None, []

    def _unpin(self, rid) -> None:
        """Release what ``rid``'s preemption pinned, if anything."""
        ckpt = self.pinned.pop(rid, None)
        if ckpt is not None:
            self.table.unpin(ckpt)
        for page in self.pinned_blocks.pop(rid, ()):
            self.pools[0].drop_hold(page)

    def abandon(self, rid) -> None:
        """Cancel: release what the request holds and any pin it left behind."""
        if rid in self.reqs:
            self.finish(rid)
        self._unpin(rid)
