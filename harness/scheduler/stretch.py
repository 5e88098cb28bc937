"""Multi-step decode: a stretch of quiet decode steps the scheduler hands out.

Most steps are pure decode with an unchanged batch: every running request
computes one token, and only token counters, the clock and the growing
context change. `Scheduler.schedule_stretch` hands such a step out as the
first of a `Stretch`; the engine loop runs it (`Stretch.run`) and the
stretch plans and completes each following step without a
`Scheduler.schedule` / `Scheduler.complete` round trip, doing per-request
work only where something happens, by the scheduler's own rules and
methods:

* every step's end comes from the loop (``loop.step_ends``: it advances the
  clock by the step's price and hands the scheduler the arrivals before the
  step's end, in event order); the waiting head is asked again after each
  arrival, finish, admission or eviction of an entry its prefix could use
  (`Scheduler.refusal`); if it would be admitted, `Scheduler.admit` admits
  it after the decodes: the step computes the decodes and the admitted
  chunks (priced from that step's `StepShape.of_step`), the chunks are
  completed by `Scheduler.complete` after the decodes of that step, and the
  requests that then decode join the stretch;
* a request that emits its last token is caught up, committed and finished
  (`Scheduler.finish_request`) in batch order among that step's other
  commits, as `Scheduler.complete` would, and the loop is told
  (``loop.finished``: progress, the next turn of a session); the stretch
  goes on with the others;
* a request whose commit completes an attention block (every ``bt`` tokens,
  16 for D0, 512 for S0-S2) gets its next block as `Scheduler.schedule`
  would give it: in running order, all of that step's new blocks at once
  when they fit; else one after another, and while one does not fit the most
  recently admitted running request is preempted (`Scheduler.preempt`,
  `Stretch._preempt_for`), as `Scheduler.schedule` preempts; the rest
  decode in that step and nobody is admitted in it;
* requests are caught up (tokens, prefix keys, token times: a slice of the
  stretch's step end times, and the organization's computed position: one
  ``commit``) when they finish, are preempted and when the stretch ends. A
  decode commit only registers the blocks it completed, which nothing can
  tell from later until then: the block's key chains tokens only that
  request generated, so no other request's prefix holds it before the
  request has finished (a session's next turn) or been preempted, both of
  which catch it up first, and its page is referenced, so not evictable.
  Where a decode commit may publish a checkpoint (in place, vLLM's blocks)
  a request is caught up and committed at each block it completes, as
  `Scheduler.complete` would.

Step prices come from the executor's pricing, step by step (the context
grows by one token per request per step; ``decode_values``), and the loop
adds them to the clock in the same order as single steps, so times are
bit-identical; the step rows are the same rows (memory read again only after
a step that allocated, admitted or finished a request). `Stretch.run`
returns why the stretch ended, and the loop plans the next step with
`Scheduler.schedule`:

* ``"prefill"``: a request admitted inside the stretch goes on with its
  prefill in chunks;
* ``"idle"``: its last request finished;
* ``"no room"``: a new block does not fit and the stretch may not preempt
  for it (where a decode commit may publish in place, or where the first
  running request itself might be preempted: the scheduler then plans again
  at once);
* ``"release"``: in vLLM's blocks a request went past a state in the last
  step, which is released when the request is planned next, in running
  order (`Organization.release_retired`): the scheduler plans that step
  request by request (`Organization.allocate_all` refuses until then).

``SimEngine(fast=False)`` makes the simulator plan every step with
`Scheduler.schedule`; `tests/unit/harness/scheduler/test_scheduler_stretch.py`
checks that both give identical results.
"""

from __future__ import annotations

from array import array

import numpy as np

from harness.engine.shape import StepShape
from harness.orgs.entries import ATTN_ENTRY
from harness.orgs.keys import KEY_TOKENS, extend_keys
from harness.scheduler.batch import RUNNING, WAIT_MEMORY, BatchItem, StepBatch, generated_token

#: Why a stretch ended (`Stretch.run`; module docstring).
PREFILL, IDLE, NO_ROOM, RELEASE = "prefill", "idle", "no room", "release"


class Stretch:
    """Quiet decode steps from the one `Scheduler.schedule_stretch` planned
    (module docstring). ``pricing`` prices a step (``step(shape)``,
    ``decode_step`` and ``decode_values(requests, context_tokens)``, as
    `adapters.sim.cost.CostModel`); ``recorder`` records each step's row
    (`harness.engine.recorder.StepRecorder`)."""

    def __init__(self, sched, reqs, starts, reason: str, pricing, recorder):
        self.sched, self.org, self.reqs = sched, sched.org, reqs
        self.pricing, self.recorder = pricing, recorder
        self.reason = reason                   # why the waiting head waits in the first step
        bt = self.org.attn_block_tokens
        self.bt = bt
        # catch a request up only when it finishes or the stretch ends, not at
        # each block it completes (module docstring), unless a decode commit may
        # publish a checkpoint in place
        self.defer = not self.org.in_place
        self.starts = starts
        self.done = [0] * len(reqs)        # completions applied to each request
        self.live = [True] * len(reqs)     # not finished yet
        self.times = array("d")            # end time of each completed step
        # completion j makes request i complete a block iff (start_i + 1 + j) % bt == 0
        self.by_phase: dict[int, list[int]] = {}
        for i, c in enumerate(starts):
            self.by_phase.setdefault(-(c + 1) % bt, []).append(i)
        self._head, self._head_keys = None, set()    # the waiting head and its prefix keys
        # completion j emits request i's last token iff j == output_len - generated - 1
        self.finish_at: dict[int, list[int]] = {}
        self.finish_j: list[int] = []      # that completion, per request
        for i, r in enumerate(reqs):
            self._finishes_at(i, r.output_len - r.generated - 1)

    def run(self, loop) -> str:
        """Run the stretch from the loop's current time until it ends; returns
        why (`PREFILL`, `IDLE` or `NO_ROOM`), every step of it completed.
        ``loop`` is the engine loop (`harness.engine.loop.EngineLoop`):
        ``step_ends(duration)`` ends the step in flight, ``finished(requests,
        t)`` is told of requests that finished at t, ``check`` (None or a
        callable) runs after each completed step."""
        sched, org, pricing, recorder = self.sched, self.org, self.pricing, self.recorder
        step_ends, on_finish, on_step = loop.step_ends, loop.finished, loop.check
        d = len(self.reqs)
        context = sum(self.starts)
        now = loop.now
        cost = pricing.decode_step(d, context)
        recorder.decode_step_started(now, cost, d, len(sched.waiting), self.reason)
        token_budget = sched.policy.token_budget
        bt, by_phase, finish_at, times = self.bt, self.by_phase, self.finish_at, self.times
        admitted = None   # the prefill items of the step in flight (admitted in the stretch)
        preempting = False   # the step in flight preempted (`_preempt_for`)
        duration = cost.total_s
        j = 0
        while True:
            # the step in flight ends; the arrivals while it ran are handed over
            end, arrived = step_ends(duration)
            # ---- completion of step j ------------------------------------------
            recorder.step_finished(end)
            times.append(end)
            crossing = by_phase.get(j % bt, ())
            ending = finish_at.pop(j, ())
            finished = []
            if ending:
                crossing = self._complete_with_finishes(crossing, ending, j, end, finished)
            elif not self.defer:
                for i in crossing:
                    self._catch_up(i, j + 1)
            joined = prefilling = ()
            if admitted:
                crossing = list(crossing)   # `_join` may extend the list it came from
                # the admitted requests come after the running ones in the batch;
                # `Scheduler.complete` also ends the step (`Organization.end_step`)
                finished += sched.complete(StepBatch(items=admitted), end)
                joined, prefilling = self._join(admitted, j)
            # in vLLM's blocks an edge continued past in step j falls due as
            # `Scheduler.complete` lets it; a request that finished released its
            # own: pages came free, so the waiting head is asked again and
            # memory read again
            released = bool(org.retiring)
            if released:
                org.end_step()
            if finished:
                on_finish(finished, end)
            now = end
            j += 1
            if on_step is not None:
                on_step()
            # ---- planning of step j: what `Scheduler.schedule` would do --------
            context += d              # every request's context grew by one token
            if ending:
                d -= len(ending)
                context -= sum(self.starts[i] + j for i in ending)
            if joined:
                d += len(joined)
                context += sum(self.starts[i] + j for i in joined)
                crossing = [*crossing, *(i for i in joined if (self.starts[i] + j) % bt == 0)]
            if prefilling:   # a chunked prefill goes on: the scheduler plans the step
                return self._finish(j, PREFILL)
            if not d:
                return self._finish(j, IDLE)
            if org.retired:    # released as each request is planned: `Scheduler.schedule`
                return self._finish(j, RELEASE)
            # the crossing requests need a new block. The waiting head, refused
            # when the stretch began, is asked again only after an arrival, a
            # finish, an admission or an eviction its prefix could feel
            # (`_head_may_differ`): otherwise pages were only taken (fewer
            # available, its hit unchanged) and the blocks registered end in
            # tokens the running requests generated, which no waiting request's
            # prefix holds: it stays refused
            evicted = False
            was_preempting, preempting = preempting, False
            if crossing:
                lost: list = []
                org.watch_invalidations(lost)
                fits = self._allocate(crossing, j)
                org.watch_invalidations(None)
                if not fits:
                    if not self._may_preempt(crossing):
                        return self._finish(j, NO_ROOM)
                    # the step the scheduler plans after preempting: the others
                    # decode, nobody is admitted, and the step after it is asked
                    # about the waiting queue and recorded afresh
                    victims = self._preempt_for(crossing, j)
                    d -= len(victims)
                    context -= sum(self.starts[i] + j for i in victims)
                    batch = self._decode_batch(j, [self.reqs[i].rid for i in victims])
                    cost = pricing.step(StepShape.of_batch(batch))
                    recorder.step_started(now, batch, cost, len(sched.running),
                                          len(sched.waiting))
                    duration = cost.total_s
                    admitted, preempting = None, True
                    continue
                evicted = ((bool(lost) and self._head_may_differ(lost))
                           or not org.takes_keep_refusals)
            reason = None     # the last step's, unless the waiting queue was asked again
            # after a step that admitted or preempted, the waiting queue is asked
            # and the step recorded afresh, as `Scheduler.schedule_stretch` does
            replan, admitted = bool(admitted) or was_preempting, None
            if arrived or evicted or ending or released or replan:
                reason = sched.refusal(token_budget - d)
                if reason is None:
                    # admitted as `Scheduler.schedule` admits after the decodes:
                    # the step computes their chunks too
                    batch = StepBatch()
                    sched.admit(batch, token_budget - d)
                    assert batch.items and not batch.failed, "admission with requests running"
                    admitted = batch.items
                    cost = pricing.step(StepShape.of_step(batch.items, d, context))
                    recorder.admission_step_started(now, cost, d, batch, len(sched.running),
                                                    len(sched.waiting))
                    duration = cost.total_s
                    continue
            if replan:
                cost = pricing.decode_step(d, context)
                duration = cost.total_s
                recorder.decode_step_started(now, cost, d, len(sched.waiting), reason)
            else:
                values = pricing.decode_values(d, context)
                duration = values[5]
                recorder.decode_repeated(now, values, len(sched.waiting),
                                         bool(crossing or ending or released), reason,
                                         d if ending else None)

    def _join(self, admitted, j: int):
        """After completion j: the admitted requests that now decode join the
        stretch (running order: after everyone else); returns their indices and
        the requests whose prefill goes on."""
        joined, prefilling = [], []
        for it in admitted:
            r = it.req
            if r.state != RUNNING:
                continue                  # finished with its first token
            if r.computed < r.prefill_until:
                prefilling.append(r)
                continue
            i = len(self.reqs)
            self.reqs.append(r)
            start = r.computed - 1 - j    # as if it had decoded since the stretch began
            self.starts.append(start)
            self.done.append(j + 1)
            self.live.append(True)
            self.by_phase.setdefault(-(start + 1) % self.bt, []).append(i)
            self._finishes_at(i, r.output_len - r.generated + j)
            joined.append(i)
        return joined, prefilling

    def _finishes_at(self, i: int, j: int) -> None:
        """Request i emits its last token at completion j."""
        self.finish_at.setdefault(j, []).append(i)
        self.finish_j.append(j)

    def _complete_with_finishes(self, crossing, ending, j: int, end: float,
                                finished: list) -> list[int]:
        """Completion j of the requests it finishes (and, unless `defer`, of those
        that complete a block), in batch order as `Scheduler.complete` applies
        them (the finished ones go to ``finished``); returns the crossing
        requests still running."""
        sched, reqs, live = self.sched, self.reqs, self.live
        for i in sorted(ending if self.defer else {*crossing, *ending}):
            if i in ending:
                self._catch_up(i, j + 1, last=True)
                sched.finish_request(reqs[i], end)
                live[i] = False
                finished.append(reqs[i])
            else:
                self._catch_up(i, j + 1)
        for i in ending:
            self.by_phase[-(self.starts[i] + 1) % self.bt].remove(i)
        return [i for i in crossing if live[i]]

    def _head_may_differ(self, lost: list) -> bool:
        """Whether the waiting head's admission may read differently after
        allocations that invalidated the entries ``lost``. An attention block
        whose prefix key the head does not hold is not part of its hit (nor its
        adoption cost): reclaiming its page only took a page, as taking an empty
        one would, so a refused head stays refused for the same reason. Anything
        else (a checkpoint, a block of its prefix) asks again."""
        waiting = self.sched.waiting
        if not waiting:
            return True         # nobody to ask: `refusal` answers "" at once
        head = waiting[0]
        if self._head is not head:
            self._head, self._head_keys = head, set(head.keys)
        keys = self._head_keys
        return any(e.kind != ATTN_ENTRY or e.key in keys for e in lost)

    def _may_preempt(self, crossing: list[int]) -> bool:
        """Whether planning the step whose crossing requests' blocks do not all
        fit may go on here (`_preempt_for`): not where a decode commit may
        publish in place, and not if the first running request might be
        preempted too (nothing would run: the scheduler plans again at once,
        admitting in the same step)."""
        return self.defer and (self.reqs[crossing[0]] is not self.sched.running[0]
                               or self.org.available_pages()[0] > 0)

    def _preempt_for(self, crossing: list[int], j: int) -> list[int]:
        """Planning of step j as `Scheduler.schedule` plans it when the
        crossing requests' blocks do not all fit: in running order each gets
        its block, and while one does not fit the most recently admitted
        running request (the last one here) is caught up and preempted, until
        the block fits or the request was itself preempted. Returns the
        preempted requests' indices in order."""
        sched, reqs, live = self.sched, self.reqs, self.live
        victims = []
        for i in crossing:
            if not live[i]:
                continue
            while not self.org.next_blocks([reqs[i].rid]):
                v = max(k for k, alive in enumerate(live) if alive)
                assert reqs[v] is sched.running[-1], "stretch and scheduler disagree on order"
                self._catch_up(v, j)
                sched.preempt(reqs[v])
                live[v] = False
                self.by_phase[-(self.starts[v] + 1) % self.bt].remove(v)
                self.finish_at[self.finish_j[v]].remove(v)
                victims.append(v)
                if v == i:
                    break
        return victims

    def _decode_batch(self, j: int, preempted: list[int]) -> StepBatch:
        """The batch `Scheduler.schedule` returns for step j after preempting
        ``preempted`` (request ids): a decode per running request, in order."""
        grid = self.org.grid
        items = [BatchItem(r, self.starts[i] + j, self.starts[i] + j + 1, False, grid)
                 for i, r in enumerate(self.reqs) if self.live[i]]
        return StepBatch(items=items, preempted=preempted,
                         wait_reason=WAIT_MEMORY if self.sched.waiting else "")

    def _allocate(self, crossing: list[int], j: int) -> bool:
        """Allocate the next block of each crossing request (running order) if all fit."""
        reqs, starts = self.reqs, self.starts
        if self.defer:     # no checkpoint published in place: blocks are all they need
            return self.org.next_blocks([reqs[i].rid for i in crossing])
        return self.org.allocate_all([(reqs[i].rid, starts[i] + j + 1, reqs[i].prefill_until)
                                      for i in crossing])

    def _catch_up(self, i: int, upto: int, last: bool = False) -> None:
        """Apply completions ``done[i]`` .. ``upto - 1`` to request i as
        `Scheduler.complete` would have, one commit for all of them; ``last``:
        completion ``upto - 1`` emits its last token (nothing is fed back)."""
        n = upto - self.done[i]
        if n <= 0:
            return
        r = self.reqs[i]
        first = self.done[i]
        self.done[i] = upto
        g = r.generated
        computed = self.starts[i] + upto
        tokens = r.tokens
        if n > 32:  # tokens generated by the earlier completions, before this commit
            ids = generated_token(r.rid, np.arange(g + 1, g + n, dtype=np.int64))
            tokens.frombytes(ids.astype(np.dtype(tokens.typecode)).tobytes())
        elif n > 1:
            rid = r.rid
            tokens.extend([generated_token(rid, k) for k in range(g + 1, g + n)])
        if n > 1:
            extend_keys(r.keys, tokens, r.salt)
        self.org.commit(r.rid, r.keys, computed, r.prefill_until)
        r.computed = computed
        r.generated = g + n
        r.token_times.extend(self.times[first:upto])
        if last:
            return
        tokens.append(generated_token(r.rid, g + n))
        if len(tokens) // KEY_TOKENS > len(r.keys):
            extend_keys(r.keys, tokens, r.salt)

    def _finish(self, steps: int, reason: str) -> str:
        """Catch every running request up to the end of the stretch (``steps``
        completed); returns ``reason``."""
        for i in range(len(self.reqs)):
            if self.live[i]:
                self._catch_up(i, steps)
        return reason
