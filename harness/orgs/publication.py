"""How a running request's recurrent state becomes cached checkpoints.

Two engines publish differently, so an organization is composed with one of
two modes (`publication_for` picks it from `OrgLayout.publish_in_place`):

- `Spares` (the study): before the chunk that reaches a grid boundary of the
  prompt, a spare checkpoint-sized object is reserved for it; at the
  boundary the live object becomes the published checkpoint and the request
  continues in the spare. Every boundary of the prompt is published.
  `SelectiveSpares` does the same at the boundaries a publish policy keeps
  (``--ckpt-publish``, `harness.orgs.publish_policy`) and none elsewhere.
- `InPlace` (vLLM's align mode, ``--paging vllm``): no spares. At a block
  edge the live state *is* the edge's state; it is published where it is
  only at the edges vLLM keeps (`kept_edges`), and the request takes a new
  state object when it computes past the edge. The edge's state stays held
  until the request's next allocation after the step (`end_step`,
  `release_retired`), as vLLM frees it when it schedules the request next,
  and a prefix computed again is cached twice.

Both answer the same questions for the coordinator (`Organization`): how
many checkpoint-sized objects a request needs to reach ``end``, whether it
needs one at all (the batch allocations' fast case), what admission,
allocation, commit and the end of a step do with the live state, and which
state copies each asks of the engine (``(reason, position, src, dst)``
tuples, `Organization.copies`). The modes own no pages: they act through the
entry table and the checkpoint store, so their releases follow the same
invalidate-before-free and reference rules as everything else.
"""

from __future__ import annotations

from bisect import bisect_right

from harness.layout import OrgLayout
from harness.orgs.checkpoints import CheckpointStore
from harness.orgs.entries import Entry, EntryTable, RequestState
from harness.orgs.keys import key_at
from harness.orgs.values import PrefixHit


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
    kept = {replay_edge(prompt_len, block), junction_edge(hit, block)}
    kept.discard(0)
    return tuple(sorted(kept))


def replay_edge(prompt_len: int, block: int) -> int:
    """The replay boundary (`kept_edges`): the last block edge before the
    prompt's last token, 0 for a prompt of one block or less."""
    return (prompt_len - 1) // block * block


def junction_edge(hit: PrefixHit | None, block: int) -> int:
    """The shared-prefix junction (`kept_edges`) of a request admitted with
    ``hit``, or 0 for none. A prefill chunk always ends there
    (``junction_stop`` in ``_mamba_block_aligned_split``)."""
    if hit is not None and hit.attn_depth > hit.j_adopt:
        return hit.attn_depth // block * block
    return 0


def exported_edge(keep: tuple[int, ...], start: int, end: int, prefill_until: int,
                  block: int) -> int | None:
    """The kept edge whose state vLLM 0.32's align mode exports from inside
    the chunk [start, end) instead of ending the chunk there, or None. A
    Mamba-2 layer writes the prefill's checkpoint into an extra block in the
    same forward pass (``MambaMixer2.get_kv_cache_spec`` sets
    ``num_prefill_checkpoint_blocks=1``, vllm/model_executor/layers/mamba/
    mamba_mixer2.py), for the chunk that ends the prefill, at the last edge
    before its last token, when ``is_mamba_prefill_checkpoint_valid``
    (vllm/v1/kv_cache_interface.py) holds: the chunk starts on an edge, and
    the edge is at least a block past the start and in a later block column
    than the initial state's. Any other kept edge ends the chunk
    (``_mamba_block_aligned_split``, vllm/v1/core/sched/scheduler.py)."""
    edge = (prefill_until - 1) // block * block
    if (edge in keep and end >= prefill_until and start % block == 0
            and start + block <= edge < end and -(-end // block) - 2 > (start - 1) // block):
        return edge
    return None


def registered_again(replay: int, start: int, end: int, block: int) -> int | None:
    """The replay edge whose state vLLM 0.32 registers in the prefix cache
    again in the step of the chunk [start, end), or None.

    A request at the replay edge (an earlier chunk ended there, or it adopted
    the state there) whose chunk ends before the next edge (the chunk that
    ends its prefill, unless the prefill ends on an edge) caches
    ``round_down(end, block)`` tokens (vllm/v1/core/kv_cache_manager.py:612,
    kv_cache_coordinator.py:767-777), which is the replay edge. Then
    ``MambaManager.cache_blocks`` registers the state there again
    (vllm/v1/core/single_type_kv_cache_manager.py:1976-1982): in
    ``_cache_partial_tail_block`` (:2067-2112) the count is the prompt's last
    hash boundary and the edge's block is still the request's, and
    ``BlockPool.cache_partial_block`` (vllm/v1/core/block_pool.py:449)
    answers the hash even when it is cached already. The hash joins
    ``cached_blocks_this_step``, so a hit ending on it waits a step. A step
    later the request has computed past the edge and
    ``remove_skipped_blocks`` (single_type_kv_cache_manager.py:696-710) has
    taken the edge's block out of its table, so no other step does this."""
    if replay and start == replay and end < replay + block:
        return replay
    return None


class Publication:
    """One publication mode over an organization's entry table and checkpoint
    store, on its checkpoint grid of ``grid`` tokens."""

    #: whether checkpoints are published in place (no spares; `InPlace`)
    in_place = False

    def __init__(self, table: EntryTable, ckpts: CheckpointStore, grid: int):
        self.table, self.ckpts, self.grid = table, ckpts, grid
        self.retiring: list = []    # rids that went past a state in the step (in place only)
        self.retired: set = set()   # rids whose next allocation releases such a state

    def states_needed(self, st: RequestState | None, start: int, end: int,
                      prefill_until: int, rid=None, keys=None, hit: PrefixHit | None = None,
                      prompt_len: int | None = None) -> int:
        """Checkpoint-sized objects a request takes to reach ``end`` (``st``: None
        for one not admitted yet, which starts at ``start`` and needs its live
        state too; ``rid`` and its prefix ``keys``, its ``hit`` and
        ``prompt_len`` then say where it would publish)."""
        raise NotImplementedError

    def needs_state(self, st: RequestState, end: int, prefill_until: int) -> bool:
        """True iff the admitted request takes a checkpoint-sized object to reach ``end``."""
        raise NotImplementedError

    def admit(self, st: RequestState, hit: PrefixHit | None, prompt_len: int,
              rid=None, keys=None, prefill_until: int | None = None) -> None:
        """The request ``rid`` (prefix ``keys``, prefill up to ``prefill_until``)
        was just admitted (its live state taken)."""

    def reserve(self, rid, st: RequestState, end: int, prefill_until: int) -> tuple:
        """Allocation's last part: the objects for reaching ``end``; returns the
        copies it asks (() for none)."""
        raise NotImplementedError

    def commit(self, rid, st: RequestState, keys, computed: int,
               prefill_until: int) -> tuple[list[int], tuple]:
        """Tokens up to ``computed`` are done (``st.computed`` is still the old
        count): (positions newly published, the copies it asks)."""
        raise NotImplementedError

    def consumed(self, rid, st: RequestState, adopted: Entry) -> None:
        """The adopted checkpoint's state is in the live state now: let it go."""
        raise NotImplementedError

    def end_step(self, reqs: dict) -> None:
        """The step is over (nothing is held past a step unless in place)."""

    def release_retired(self, rid, st: RequestState) -> bool:
        """Before the request's allocation: release what it held past an
        earlier step (in place only); True iff something was released."""
        return False

    def finish(self, rid, st: RequestState) -> None:
        """The request is finishing: release the states this mode holds beyond
        its live state and spares."""


class Spares(Publication):
    """The study: a spare for every grid boundary of the prompt, all published."""

    def states_needed(self, st, start, end, prefill_until, rid=None, keys=None, hit=None,
                      prompt_len=None):
        if st is None:
            reserved, live = start, 1
        else:
            reserved, live = st.reserved_until, 0
        last = end if end < prefill_until else prefill_until
        ckpts = last // self.grid - reserved // self.grid
        return (ckpts if ckpts > 0 else 0) + live

    def needs_state(self, st, end, prefill_until):
        return (end if end < prefill_until else prefill_until) // self.grid \
            > st.reserved_until // self.grid

    def reserve(self, rid, st, end, prefill_until):
        last, grid = min(end, prefill_until), self.grid
        while (st.reserved_until // grid + 1) * grid <= last:
            st.spares.append(self.ckpts.new())
            st.reserved_until = (st.reserved_until // grid + 1) * grid
        return ()

    def commit(self, rid, st, keys, computed, prefill_until):
        j = (st.computed // self.grid + 1) * self.grid
        if j <= prefill_until and j <= computed:
            return self._publish(st, keys, j, min(computed, prefill_until))
        return [], ()

    def consumed(self, rid, st, adopted):
        self.table.unref(adopted)

    def _publish(self, st: RequestState, keys, j: int, last: int) -> tuple[list[int], tuple]:
        """Publish the live state at each grid boundary j .. last; the request
        continues in a spare (or, if the prefix is published already, keeps its
        live state and frees the spare)."""
        published, copies = [], []
        ckpts = self.ckpts
        while j <= last:
            k = key_at(keys, j)
            if not self._kept(st, j):
                cached = ckpts.map.get(k)   # not published here; someone else's is on the path
                if cached is not None:
                    st.on_path.append(cached)
            elif k in ckpts.map:
                self.table.drop_owned(st.spares.pop(0))   # someone published this prefix already
                st.on_path.append(ckpts.map[k])
            else:
                ck, spare = st.live, st.spares.pop(0)
                ckpts.publish(ck, k, j)
                st.published.append(ck)
                st.live = spare
                published.append(j)
                copies.append(("publish", j, ck, spare))
            j += self.grid
        return published, tuple(copies)

    @staticmethod
    def _kept(st, j: int) -> bool:
        """Whether boundary ``j`` is one this request publishes at: every one."""
        return True


class SelectiveSpares(Spares):
    """The study's spares at the grid boundaries a publish policy
    (`harness.orgs.publish_policy`) keeps, chosen once at admission
    (``st.keep``); at a boundary left out the live state continues, and a
    checkpoint someone else published there is still on the request's path."""

    def __init__(self, table: EntryTable, ckpts: CheckpointStore, grid: int, policy):
        super().__init__(table, ckpts, grid)
        self.policy = policy

    @staticmethod
    def _between(keep: tuple[int, ...], lo: int, hi: int) -> int:
        """Kept boundaries j with lo < j <= hi."""
        return bisect_right(keep, hi) - bisect_right(keep, lo) if hi > lo else 0

    def states_needed(self, st, start, end, prefill_until, rid=None, keys=None, hit=None,
                      prompt_len=None):
        last = end if end < prefill_until else prefill_until
        if st is None:
            keep = self.policy.kept(rid, keys, start, prefill_until, self.grid)
            return self._between(keep, start, last) + 1
        return self._between(st.keep, st.reserved_until, last)

    def needs_state(self, st, end, prefill_until):
        return self._between(st.keep, st.reserved_until, min(end, prefill_until)) > 0

    def admit(self, st, hit, prompt_len, rid=None, keys=None, prefill_until=None):
        until = prompt_len if prefill_until is None else prefill_until
        st.keep = self.policy.kept(rid, keys, st.computed, until, self.grid)
        self.policy.admitted(rid, keys, until, self.grid)

    def reserve(self, rid, st, end, prefill_until):
        last = min(end, prefill_until)
        for _ in range(self._between(st.keep, st.reserved_until, last)):
            st.spares.append(self.ckpts.new())
        st.reserved_until = max(st.reserved_until, last // self.grid * self.grid)
        return ()

    @staticmethod
    def _kept(st, j: int) -> bool:
        """Whether boundary ``j`` is one the policy kept at admission."""
        return j in st.keep


class InPlace(Publication):
    """vLLM's align mode: the live state at a block edge is the edge's state."""

    in_place = True

    def states_needed(self, st, start, end, prefill_until, rid=None, keys=None, hit=None,
                      prompt_len=None):
        if st is None:
            keep = kept_edges(prefill_until if prompt_len is None else prompt_len, hit, self.grid)
            return 1 + (exported_edge(keep, start, end, prefill_until, self.grid) is not None)
        moves = 1 if st.at_edge and end > st.computed else 0
        return moves + (self._export_to_reserve(st, end, prefill_until) is not None)

    def needs_state(self, st, end, prefill_until):
        return (st.at_edge and end > st.computed) or \
            self._export_to_reserve(st, end, prefill_until) is not None

    def _export_to_reserve(self, st, end, prefill_until) -> int | None:
        """The edge this chunk exports (`exported_edge`) if its block is not
        reserved yet."""
        if st.spares:
            return None
        return exported_edge(st.keep, st.computed, end, prefill_until, self.grid)

    def admit(self, st, hit, prompt_len, rid=None, keys=None, prefill_until=None):
        st.keep = kept_edges(prompt_len, hit, self.grid)
        st.junction = junction_edge(hit, self.grid)
        st.replay = replay_edge(prompt_len, self.grid)

    def reserve(self, rid, st, end, prefill_until):
        if self._export_to_reserve(st, end, prefill_until) is not None:
            st.spares.append(self.ckpts.new())      # vLLM's prefill checkpoint block
        if st.at_edge and end > st.computed:   # continue past the edge
            edge = st.live
            st.live, st.at_edge = self.ckpts.new(), False
            self._retire(rid, st, edge, st.computed)   # read by this step's copy
            return (("publish", st.computed, edge, st.live),)
        return ()

    def commit(self, rid, st, keys, computed, prefill_until):
        published = []
        if st.spares and computed > st.computed:
            published = self._export(rid, st, keys, computed, prefill_until)
        if computed % self.grid == 0 and computed > st.computed:
            return published + self._reach_edge(st, keys, computed), ()
        return published, ()

    def _export(self, rid, st: RequestState, keys, computed: int,
                prefill_until: int) -> list[int]:
        """The chunk that ended at ``computed`` exported the state at its edge
        (`exported_edge`) into the reserved block: that block is the edge's
        cached checkpoint (a duplicate if the prefix has one already, as vLLM
        keeps both). The request holds it as a state it went past
        (`_retire`): the block stays in vLLM's block table at its checkpoint
        index until ``remove_skipped_blocks`` frees it when the request is
        scheduled next."""
        j = exported_edge(st.keep, st.computed, computed, prefill_until, self.grid)
        assert j is not None, f"{self.table.name}: a reserved export block and no exported edge"
        k = key_at(keys, j)
        cached = self.ckpts.map.get(k)
        block = st.spares.pop()
        self.ckpts.publish(block, k, j)
        self.table.ref(block)
        self._retire(rid, st, block, j)
        return [j] if cached is None else []

    def _reach_edge(self, st: RequestState, keys, j: int) -> list[int]:
        """The live state is now the state at edge ``j`` and stays the request's
        state until it computes past ``j`` (then it takes a new one, as vLLM's
        align mode moves to a new block at every edge). At a kept edge
        (`kept_edges`) the state is also published as ``j``'s checkpoint (a
        duplicate if the prefix is published already)."""
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

    def consumed(self, rid, st, adopted):
        # vLLM frees the hit's block as it frees an edge's
        self._retire(rid, st, adopted, st.computed)

    def _retire(self, rid, st: RequestState, e: Entry, position: int) -> None:
        """``e``, the state at ``position`` (an edge the request went past,
        the checkpoint it adopted once its state is copied, or the one its
        chunk exported), is held past the step, until the request's next
        allocation (`end_step`)."""
        if not st.retiring:
            self.retiring.append(rid)
        st.retiring.append((position, e))

    def end_step(self, reqs):
        """The states requests went past in the step (`_retire`) are due: each
        is released at its request's next allocation (`release_retired`).
        vLLM's align mode frees such a block when it schedules the request
        next: ``KVCacheManager.allocate_slots`` first calls
        ``remove_skipped_blocks`` (vllm/v1/core/kv_cache_manager.py:555),
        which frees the block of the state the request went past
        (``MambaManager.remove_skipped_blocks``,
        vllm/v1/core/single_type_kv_cache_manager.py:1613-1642), after the
        step's copy read it. Until then it counts as held: a request planned
        before it in the next step does not get its block, and it enters the
        LRU queue at its request's turn."""
        for rid in self.retiring:
            st = reqs.get(rid)
            if st is not None and st.retiring:
                assert not st.retired, f"{self.table.name}: {rid} holds states of two steps"
                st.retired, st.retiring = st.retiring, []
                self.retired.add(rid)
        self.retiring.clear()

    def release_retired(self, rid, st):
        """The states ``rid`` went past in an earlier step (`end_step`) are
        released (a published one stays cached), as vLLM frees them before it
        asks for the request's blocks, even when they then do not fit."""
        if not st.retired:
            return False
        self._release_states(st.retired)
        st.retired = []
        self.retired.discard(rid)
        return True

    def _release_states(self, held: list) -> None:
        """Release ``(position, state)`` pairs deepest first: vLLM frees a
        request's skipped blocks from the last to the first
        (``_remove_blocks_in_range``,
        vllm/v1/core/single_type_kv_cache_manager.py:1592-1611), so the
        deeper state enters the LRU queue first and is evicted first."""
        for _, e in sorted(held, key=lambda pe: -pe[0]):
            self._release_edge(e)

    def finish(self, rid, st):
        self.release_retired(rid, st)
        if st.retiring:
            self._release_states(st.retiring)
            st.retiring = []
        if st.at_edge:                      # a published edge stays cached
            self._release_edge(st.live)
            st.live = None

    def _release_edge(self, e: Entry) -> None:
        """An edge's state the request no longer needs: a published one stays
        cached; one that was not published is freed."""
        if e.key is not None:
            self.table.unref(e)
        else:
            self.table.drop_owned(e)


def publication_for(layout: OrgLayout, table: EntryTable, ckpts: CheckpointStore,
                    policy=None) -> Publication:
    """The publication mode ``layout`` says (`OrgLayout.publish_in_place`);
    with a publish ``policy`` (`harness.orgs.publish_policy`, None for every
    boundary) the study's spares at the boundaries it keeps."""
    if policy is not None:
        if layout.publish_in_place:
            raise ValueError("a publish policy needs the study's pages (spares), not in-place "
                             "publication (--paging vllm)")
        return SelectiveSpares(table, ckpts, layout.grid_tokens, policy)
    mode = InPlace if layout.publish_in_place else Spares
    return mode(table, ckpts, layout.grid_tokens)
