"""A vLLM-V1-style continuous-batching scheduler over any organization.

Engine-independent: it decides which requests compute how many tokens in the
next step, and talks to the organization only through its protocol
(`harness.orgs.protocol`). An in-process engine's loop drives it:

    batch = sched.schedule()           # admission, chunking, preemption
    ... execute batch.items for batch-dependent time ...
    sched.complete(batch, now)         # commit, publish, emit tokens, finish

Most steps only decode one token per running request. A scheduler built
with ``stretches`` (the simulator's) hands such a step out as a run of them
(`harness.scheduler.stretch.Stretch`), which applies this module's rules,
written once here, where something happens. The values (`SchedRequest`,
`StepBatch`, `generated_token`) are in `harness.scheduler.batch`.

Policy, in the order it is applied each step:
1. Running requests in admission order: a decode token each, or the next
   prefill chunk (a chunk that does not finish the prefill ends on the
   organization's checkpoint grid). If the organization cannot make room,
   the chunk is first shortened to an earlier grid boundary; if even that
   fails, the most recently admitted running request is preempted
   (recompute-style: its blocks are released and stay cached, the deepest
   valid checkpoint on its own path is pinned) until the request fits or is
   itself the victim.
2. If nobody was preempted this step: waiting requests FCFS while fewer than
   ``cap`` run: joint prefix lookup (reuse = J_adopt) and a first chunk sized
   by the step's remaining token budget, as in vLLM V1. It is admitted only
   if floor(f x B) pages per pool stay free afterwards (the headroom; as
   vLLM's watermark, only while another request runs, unless
   ``headroom_while_idle``) and, with ``admit_whole_input`` (vLLM's
   ``scheduler_reserve_full_isl``), only if its whole remaining input would
   fit too; otherwise admission stops for this step (the chunk is not
   shortened to squeeze it in).
3. Retention (policy): a running producer's published checkpoints whose
   prefix was demanded by at least ``retention_threshold`` distinct requests
   are retained until the producer finishes or is preempted.

Each `StepBatch` also says why the waiting were not admitted (``wait_reason``:
memory, cap or budget), which `harness.attribution` splits each TTFT by.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from harness.orgs.keys import KEY_TOKENS, chain_keys, extend_keys, key_at
from harness.orgs.protocol import OrganizationProtocol
from harness.orgs.values import PrefixHit
from harness.records import CANCELLED, FAILED, FINISHED
from harness.scheduler.batch import (
    DONE,
    RUNNING,
    WAIT_BUDGET,
    WAIT_CAP,
    WAIT_MEMORY,
    WAITING,
    BatchItem,
    SchedRequest,
    StepBatch,
    generated_token,
    token_array,
)
from harness.scheduler.stretch import Stretch


@dataclass(frozen=True)
class SchedulerPolicy:
    """The scheduler's knobs. Two admission rules follow vLLM 0.32's V1 scheduler:

    ``headroom_while_idle`` (default False, as vLLM): the headroom (vLLM's
    ``SchedulerConfig.watermark``, vllm/config/scheduler.py) is kept only when
    another request is running. vLLM's ``KVCacheManager.allocate_slots``
    (vllm/v1/core/kv_cache_manager.py) adds ``watermark_blocks`` only if
    ``has_scheduled_reqs`` and the request is WAITING or PREEMPTED;
    ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py) passes
    ``has_scheduled_reqs=bool(self.running)``. With nothing running a request
    whose chunk fits without the headroom starts (it would otherwise never
    start, and hbench would fail it); True keeps the headroom even then.

    ``admit_whole_input`` (default False: the study's rule, DESIGN.md section
    4, admission by the first chunk): admission also requires the pages of the
    request's whole remaining input (prompt, plus generated tokens for a
    preempted one) to be available with the headroom, as vLLM 0.32 does by
    default (``SchedulerConfig.scheduler_reserve_full_isl``, on; applied as
    ``allocate_slots(full_sequence_must_fit=True)`` for waiting requests only).
    Only the first chunk is allocated either way; later chunks are not
    reserved. It changes nothing when the first chunk is the whole prompt
    (the study's 8,192-token steps and 3,332-token prompts) and matters when
    steps are shorter than prompts (vLLM on CPU steps one block at a time).
    """

    cap: int = 63
    token_budget: int = 8192
    headroom: float = 0.0
    retention: bool = False
    retention_threshold: int = 2
    headroom_while_idle: bool = False
    admit_whole_input: bool = False

    @classmethod
    def from_config(cls, config) -> SchedulerPolicy:
        """The policy a `RunConfig` asks for (every in-process engine builds it so)."""
        return cls(cap=config.cap, token_budget=config.token_budget, headroom=config.headroom,
                   retention=config.retention, retention_threshold=config.retention_threshold,
                   admit_whole_input=config.admission == "whole-input")


class Scheduler:
    def __init__(self, org: OrganizationProtocol, policy: SchedulerPolicy, stretches: bool = False):
        self.org = org
        self.policy = policy
        self.stretches = stretches     # `schedule` hands out quiet decode runs (`Stretch`)
        self.waiting: deque[SchedRequest] = deque()
        self.running: list[SchedRequest] = []
        self.requests: dict[int, SchedRequest] = {}
        # grid key -> distinct requests wanting it; counted only for retention,
        # its one reader (an entry per key of every request: ~0.6 kB a request)
        self.popularity: dict[int, int] = {}
        self._seq = 0
        self.preemptions = 0

    # ---- arrivals and cancellation --------------------------------------------
    def add(self, rid: int, arrival_s: float, token_ids, output_len: int, salt: str | None,
            prefix_group: int = -1, warmup: bool = False,
            keys: list[int] | None = None) -> SchedRequest:
        """Queue a request; ``keys``, if given, are `chain_keys` of ``token_ids``
        computed by the caller (an engine that reuses a shared prefix's keys)."""
        tokens = token_array(token_ids)
        if keys is None:
            keys = chain_keys(tokens, salt)
        r = SchedRequest.arriving(rid, arrival_s, tokens, output_len, salt, keys,
                                  prefix_group, warmup)
        self.requests[rid] = r
        self.waiting.append(r)
        if self.policy.retention:
            grid, popularity = self.org.grid, self.popularity
            for j in range(grid, r.prompt_len + 1, grid):
                k = key_at(r.keys, j)
                popularity[k] = popularity.get(k, 0) + 1
        return r

    def cancel(self, rid: int, reason: str = "cancelled") -> None:
        r = self.requests[rid]
        if r.state == DONE:
            return
        if r.state == RUNNING:
            self.running.remove(r)
        else:
            self.waiting.remove(r)
        self.org.abandon(rid)
        self._close(r, CANCELLED, reason)

    def _close(self, r: SchedRequest, status: str, error: str = "") -> None:
        r.close(status, error)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def check_drained(self) -> None:
        """After the last request: every request finished, failed or was
        cancelled, the organization's invariants hold and no page is still
        referenced (AssertionError with the offenders otherwise). Nothing lost
        is a property of every engine that drives this scheduler."""
        open_reqs = [r.rid for r in self.requests.values() if r.state != DONE]
        if open_reqs:
            raise AssertionError(f"requests neither finished, failed nor cancelled: {open_reqs[:10]}")
        self.org.check_invariants()
        if not self.org.holds_no_references():
            raise AssertionError(f"{self.org.name}: references left after every request ended")

    # ---- planning -------------------------------------------------------------------
    def _chunk_end(self, start: int, until: int, room: int) -> int:
        """End of a prefill chunk from ``start``: the whole rest if it fits, else the
        furthest grid boundary within ``room`` tokens (``start`` if none fits)."""
        if until - start <= room:
            return until
        grid = self.org.grid
        return max(start, (start + room) // grid * grid)

    def _fit_chunk(self, r: SchedRequest, start: int, end: int) -> int | None:
        """For a running request: the longest chunk [start, e], e <= end, that fits
        now: the whole chunk, or shorter grid-aligned chunks that publish fewer
        checkpoints at once (None if even the shortest does not fit)."""
        org = self.org

        def fits(e: int) -> bool:
            return org.can_allocate(org.pages_needed(r.rid, e, r.prefill_until))

        if fits(end):
            return end
        # shorter chunks end on grid boundaries; demand grows with the end, so
        # bisect for the longest that fits (None if even the shortest does not)
        ends = list(range(start // org.grid * org.grid + org.grid, end, org.grid))
        lo, hi = 0, len(ends)
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(ends[mid]):
                lo = mid + 1
            else:
                hi = mid
        return ends[lo - 1] if lo else None

    def schedule(self) -> StepBatch | Stretch:
        """The next step's batch, or (built with ``stretches``) a run of quiet
        decode steps starting with it (`_stretch`). A round that only
        preempted or failed requests computes nothing, so the scheduler plans
        again at once (the freed pages may admit someone); the returned batch
        lists every request preempted or failed on the way. Its items are
        empty only when no work is left.

        Ends by asserting the step's token budget and the running cap.
        """
        if self.stretches:
            stretch = self._stretch()
            if stretch is not None:
                return stretch
        batch = StepBatch()
        for _ in range(len(self.requests) + 2):
            round_ = self._schedule_round()
            batch.items = round_.items
            batch.preempted += round_.preempted
            batch.failed += round_.failed
            batch.admitted, batch.skipped = round_.admitted, round_.skipped
            batch.wait_reason = round_.wait_reason
            if round_.items or not (round_.preempted or round_.failed) or not self.has_work:
                break
        if not batch.items and self.has_work:
            raise AssertionError(
                f"scheduler stalled: {len(self.waiting)} waiting, {len(self.running)} running")
        tokens, budget = batch.batch_tokens, self.policy.token_budget
        assert tokens <= budget, f"step of {tokens} tokens exceeds the token budget {budget}"
        running, cap = len(self.running), self.policy.cap
        assert running <= cap, f"{running} running requests exceed the cap {cap}"
        return batch

    def _stretch(self) -> Stretch | None:
        """The next step as the first of a stretch of quiet decode steps
        (`harness.scheduler.stretch`), if it is one: every running request
        decodes one token and each one's room for it is allocated
        (`_decode_rooms`, as `schedule` plans such a step), and the waiting
        head is not admitted (`refusal`). Otherwise None, and nothing changed
        but rooms `schedule` finds in place."""
        if not self._decode_rooms():
            return None
        reason = self.refusal(self.policy.token_budget - len(self.running))
        if reason is None:
            return None
        return Stretch(self, list(self.running), reason)

    def _decode_rooms(self) -> bool:
        """Whether the next step only decodes: every running request (at least
        one) decodes one token, all within the token budget, and each one's
        room for it is allocated, in running order, all together
        (`Organization.allocate_all`: the pages one after another would take).
        False changes nothing; the step is then planned request by request."""
        running = self.running
        if not running or len(running) > self.policy.token_budget:
            return False
        for r in running:
            if r.computed < r.prefill_until:
                return False
        return self.org.allocate_all([(r.rid, r.computed + 1, r.prefill_until)
                                      for r in running])

    def _schedule_round(self) -> StepBatch:
        batch = StepBatch()
        budget = self.policy.token_budget
        if self._decode_rooms():       # most steps: a decode each, all fit
            grid = self.org.grid
            batch.items = [BatchItem(r, r.computed, r.computed + 1, False, grid)
                           for r in self.running]
            self.admit_unless_preempted(batch, budget - len(batch.items))
            return batch
        for r in list(self.running):
            if r.state != RUNNING:          # preempted earlier in this loop
                continue
            start = r.computed
            if r.decoding:
                end, prefill = start + 1, False
            else:
                end = self.org.chunk_stop(r.rid, start,
                                          self._chunk_end(start, r.prefill_until, budget),
                                          r.prefill_until)
                prefill = True
            if end <= start or end - start > budget:
                batch.skipped.append(r.rid)
                continue
            end = self.make_room(r, start, end, prefill, batch.preempted)
            if r.state == RUNNING:
                batch.items.append(BatchItem(r, start, end, prefill, self.org.grid))
                budget -= end - start
        self.admit_unless_preempted(batch, budget)
        return batch

    def make_room(self, r: SchedRequest, start: int, end: int, prefill: bool,
                  preempted: list[int], before_preempt=None) -> int:
        """Allocate running ``r``'s chunk [start, end) (policy 1): a prefill
        chunk that does not fit is first shortened to an earlier grid boundary
        (not in place), then the most recently admitted running request is
        preempted (its id appended to ``preempted``; ``before_preempt(victim)``
        runs first) until it fits or ``r`` itself was preempted. Returns the
        chunk's end (``start`` when ``r`` was preempted)."""
        while not self.org.allocate(r.rid, end, r.prefill_until):
            # the study's engine publishes fewer checkpoints this step before
            # preempting anyone; vLLM (in place) preempts for the chunk it planned
            if prefill and not self.org.in_place:
                smaller = self._fit_chunk(r, start, end)
                if smaller is not None:
                    end = smaller
                    continue
            victim = self.running[-1]   # most recently admitted; not yet planned
            if before_preempt is not None:
                before_preempt(victim)
            self.preempt(victim)
            preempted.append(victim.rid)
            if victim is r:
                return start
        return end

    def admit_unless_preempted(self, batch: StepBatch, budget: int) -> None:
        """Policy 2 for a planned ``batch``: `admit` with ``budget`` tokens left,
        unless the step preempted someone; then the waiting wait for memory."""
        if not batch.preempted:
            self.admit(batch, budget)
        elif self.waiting:
            batch.wait_reason = WAIT_MEMORY

    def admit(self, batch: StepBatch, budget: int) -> None:
        """Admit waiting requests FCFS into ``batch`` (policy 2 of the module
        docstring) with ``budget`` tokens of the step left: each one's first
        chunk is allocated and appended to ``batch``; one that cannot start
        with nothing running fails. Each head is answered by `_head` (as
        `refusal` answers it); the first one refused sets ``wait_reason``."""
        org = self.org
        pending = self._states_this_step(batch)
        while True:
            reason, hit, end = self._head(budget, pending)
            if reason is not None:
                batch.wait_reason = reason
                break
            r = self.waiting.popleft()
            if end is None:
                # Nothing runs, so nothing will ever free pages for it: fail it
                # rather than wait forever.
                org.abandon(r.rid)
                self._close(r, FAILED, "cannot be admitted with nothing running: "
                            "budget or headroom too small for this request")
                batch.failed.append(r.rid)
                continue
            start = hit.j_adopt
            assert org.allocate(r.rid, end, r.prefill_until, r.keys, hit, r.prompt_len)
            self._on_admit(r, hit)
            self.running.append(r)
            batch.admitted.append(r.rid)
            batch.items.append(BatchItem(r, start, end, True, org.grid, adopted=hit.j_adopt > 0))
            budget -= end - start
            if org.in_place:
                for e, k in self._registers(r, start, end).items():
                    pending.setdefault(e, set()).add(k)

    def _head(self, budget: int, pending: dict[int, set[int]] | None = None):
        """The admission rule for the waiting head with ``budget`` tokens of the
        step left (asks, changes nothing): ``(reason, hit, end)``, where
        ``reason`` is why it waits (`WAIT_CAP`, `WAIT_BUDGET`, `WAIT_MEMORY`;
        "" when nobody waits), or None when it starts now with the first chunk
        [``hit.j_adopt``, ``end``), or fails (``end`` None: it does not fit
        with nothing running). ``pending``: the states this step registers
        (`_states_this_step`), which a head whose prefix reaches one waits for."""
        if not self.waiting:
            return "", None, 0
        if len(self.running) >= self.policy.cap:
            return WAIT_CAP, None, 0
        if budget <= 0:
            return WAIT_BUDGET, None, 0
        org, r = self.org, self.waiting[0]
        hit = org.lookup(r.keys, len(r.tokens) - 1)
        if pending and self._hits_state_this_step(r, hit, pending):
            return WAIT_MEMORY, hit, 0
        # the first chunk is what the step's remaining token budget allows (on
        # the grid unless it ends the prefill), as in vLLM V1; if it does not
        # fit with headroom, admission stops for this step: no shorter chunk
        end = org.chunk_stop(r.rid, hit.j_adopt,
                             self._chunk_end(hit.j_adopt, r.prefill_until, budget),
                             r.prefill_until, hit, r.prompt_len)
        if end <= hit.j_adopt:
            return WAIT_BUDGET, hit, end
        if self._admissible(r, hit, end):
            return None, hit, end
        if self.running:
            return WAIT_MEMORY, hit, end
        return None, hit, None          # it fails: nothing runs to free pages for it

    # vLLM registers a Mamba state's block in the prefix cache when it allocates
    # it, and makes a request whose hit ends on a state registered in the same
    # step wait for the next one (``MambaManager.get_num_blocks_to_allocate``,
    # vllm/v1/core/single_type_kv_cache_manager.py:1690: ``cached_blocks_this_step``
    # returns more blocks than the pool has, and the waiting queue stops). The
    # chunk that ends a prefill in the replay edge's block registers the state
    # at that edge again (``MambaManager.cache_blocks`` ->
    # ``_cache_partial_tail_block``, :1976-1982, :2067-2112), whether an
    # earlier chunk cached it or the request adopted it, so a request hitting
    # it in that step waits as well. A state adopted anywhere else is not
    # registered again: ``add_local_computed_blocks`` (:267-325) counts the
    # hit's blocks as cached, and ``cache_blocks`` starts after them.
    def _registers(self, r: SchedRequest, start: int, end: int) -> dict[int, int]:
        """{position: prefix key} of the states vLLM registers for ``r``'s chunk
        this step: those it caches (`Organization.publishes`) and the one it
        registers again (`Organization.registers_again`)."""
        org = self.org
        edges = list(org.publishes(r.rid, start, end, r.prefill_until))
        again = org.registers_again(r.rid, start, end)
        if again is not None:
            edges.append(again)
        return {e: key_at(r.keys, e) for e in edges}

    def _states_this_step(self, batch: StepBatch) -> dict[int, set[int]]:
        """{position: prefix keys} of the states the batch's chunks register
        this step (`_registers`; in place only, empty otherwise)."""
        pending: dict[int, set[int]] = {}
        if self.org.in_place:
            for item in batch.items:
                if item.prefill:
                    for e, k in self._registers(item.req, item.start, item.end).items():
                        pending.setdefault(e, set()).add(k)
        return pending

    def _hits_state_this_step(self, r: SchedRequest, hit: PrefixHit,
                              pending: dict[int, set[int]]) -> bool:
        """Whether waiting ``r``'s prefix reaches a state registered this step:
        deeper than ``hit``, one a chunk of this step caches (vLLM's hit would
        end on it), or ``hit``'s own, registered again by a chunk of this step
        that ends a prefill (`Organization.registers_again`)."""
        limit = len(r.tokens) - 1
        return any(0 < e and hit.j_adopt <= e <= limit and key_at(r.keys, e) in keys
                   for e, keys in pending.items())

    def refusal(self, budget: int) -> str | None:
        """Why `admit` with ``budget`` tokens left would not admit the waiting
        head now, given running requests: `WAIT_CAP`, `WAIT_BUDGET`,
        `WAIT_MEMORY`, "" when nobody waits, or None when it would admit (or
        fail) it (`_head`). Changes nothing: a stretch asks it after the
        organization changed, and records the reason."""
        return self._head(budget)[0]

    def _admissible(self, r: SchedRequest, hit: PrefixHit, end: int) -> bool:
        """Whether waiting ``r`` may start with the chunk [J_adopt, end) now
        (asks, changes nothing): the chunk's pages are available with the
        headroom, which is kept only while another request runs unless
        ``headroom_while_idle``; with ``admit_whole_input`` the pages of the
        whole remaining input must be available with it too
        (`SchedulerPolicy` cites vLLM's rules)."""
        org, policy = self.org, self.policy
        headroom = policy.headroom if (self.running or policy.headroom_while_idle) else 0.0
        if not org.can_allocate(org.pages_needed(r.rid, end, r.prefill_until, r.keys, hit,
                                                 r.prompt_len), headroom):
            return False
        if policy.admit_whole_input and end < r.prefill_until:
            whole = org.pages_needed(r.rid, r.prefill_until, r.prefill_until, r.keys, hit,
                                     r.prompt_len)
            return org.can_allocate(whole, headroom)
        return True

    def admits(self, budget: int) -> bool:
        """Whether `admit` with ``budget`` tokens left would admit (or fail) the
        waiting head now (`refusal` is None)."""
        return self.refusal(budget) is None

    def _on_admit(self, r: SchedRequest, hit: PrefixHit) -> None:
        r.state = RUNNING
        r.admitted_seq = self._seq
        self._seq += 1
        r.computed = hit.j_adopt
        rec = r.record
        if r.first_admission:
            r.first_admission = False
            rec.j_adopt, rec.r_max, rec.attn_depth = hit.j_adopt, hit.r_max, hit.attn_depth
            rec.reused_tokens = hit.j_adopt
            rec.initial_input_tokens = r.prompt_len - hit.j_adopt
        else:
            rec.recomputed_tokens += r.prefill_until - hit.j_adopt

    def preempt(self, r: SchedRequest) -> None:
        """Preempt running ``r`` (recompute-style, policy 1): the organization
        releases it, it waits at the head of the queue to compute again."""
        self.org.preempt(r.rid)
        self.running.remove(r)
        r.state = WAITING
        r.computed = 0
        r.prefill_until = len(r.tokens)
        r.record.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    # ---- completion -------------------------------------------------------------------
    def finish_request(self, r: SchedRequest, now: float) -> None:
        """``r`` emitted its last token at ``now`` (committed and counted): release it."""
        self.org.finish(r.rid)
        self.running.remove(r)
        r.record.finish_s = now
        self._close(r, FINISHED)

    def complete(self, batch: StepBatch, now: float,
                 next_tokens: dict[int, int] | None = None) -> list[SchedRequest]:
        """The batch's tokens are computed at ``now``: each item is committed and
        emits its token (`advance`), then the step ends (`end_step`); the
        requests that finished.

        ``next_tokens`` (rid -> token id) are the tokens an engine that really
        computes generated; without it each request continues with the
        deterministic stand-in `generated_token`.
        """
        finished = []
        emitted = (now,)
        for item in batch.items:
            r = item.req
            if r.state != RUNNING:
                continue
            # a mid-prefill chunk emits nothing
            times = emitted if item.end >= len(r.tokens) else ()
            if self.advance(r, item.end, times, next_tokens):
                finished.append(r)
        self.end_step()
        return finished

    def advance(self, r: SchedRequest, end: int, times,
                next_tokens: dict[int, int] | None = None) -> bool:
        """Running ``r``'s state is computed up to ``end`` and it emitted a token
        at each of ``times`` (none for a mid-prefill chunk; several when a
        stretch brings a decoding request up to date, `harness.scheduler.stretch`):
        the tokens before the last are fed back, the organization commits (a
        popular published checkpoint is retained), and ``r`` finishes with its
        last token or is fed the next one (``next_tokens[r.rid]`` or
        `generated_token`). Returns whether it finished."""
        org, n = self.org, len(times)
        g = r.generated
        if n > 1:       # tokens emitted by the earlier of these completions
            _feed(r, g + 1, g + n)
        published = org.commit(r.rid, r.keys, end, r.prefill_until)
        r.computed = end
        if published and self.policy.retention:
            for j in published:
                if self.popularity.get(key_at(r.keys, j), 0) >= self.policy.retention_threshold:
                    org.retain(r.rid, j, r.keys)
        if not n:
            return False
        r.generated = g = g + n
        r.token_times.extend(times)
        if r.record.first_token_s is None:
            r.record.first_token_s = times[0]
        if g >= r.output_len:
            self.finish_request(r, times[-1])
            return True
        r.tokens.append(generated_token(r.rid, g) if next_tokens is None
                        else next_tokens[r.rid])
        if len(r.tokens) % KEY_TOKENS == 0:
            extend_keys(r.keys, r.tokens, r.salt)
        return False

    def end_step(self) -> bool:
        """A step's commits are done: what the organization held for the step
        falls due (`Organization.end_step`, in vLLM's blocks); whether anything did."""
        if self.org.retiring:
            self.org.end_step()
            return True
        return False


def _feed(r: SchedRequest, first: int, stop: int) -> None:
    """Feed ``r`` its generated tokens ``first`` .. ``stop - 1`` and chain their keys."""
    tokens, n = r.tokens, stop - first
    if n > 32:
        ids = generated_token(r.rid, np.arange(first, stop, dtype=np.int64))
        tokens.frombytes(ids.astype(np.dtype(tokens.typecode)).tobytes())
    else:
        rid = r.rid
        tokens.extend([generated_token(rid, k) for k in range(first, stop)])
    extend_keys(r.keys, tokens, r.salt)
