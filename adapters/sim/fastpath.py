"""Fast-forward through quiet decode stretches: the simulator's opt-in shortcut.

Most simulated steps are pure decode with an unchanged batch: every running
request computes one token, and the only things that change are token
counters, the clock and the growing context. A stretch (`_Stretch`) advances such
steps without a `Scheduler.schedule()` / `Scheduler.complete()` round trip
per step, and does per-request work only where something happens:

* a step is fast-forwarded while the scheduler would admit no one; arrivals
  are handed to the scheduler as the event loop would, and the waiting head
  is asked again after each arrival, finish or eviction of an entry its
  prefix could use (`Scheduler.refusal`); if it would be admitted, the
  normal scheduler plans that step;
* a request that emits its last token is caught up, committed and finished
  (`Scheduler.finish_request`) in batch order among that step's other
  commits, as `Scheduler.complete` would, and the engine is told
  (``on_finish``: progress, the next turn of a session); the stretch goes on
  with the others;
* a request whose commit completes an attention block (every ``bt`` tokens,
  16 for D0, 512 for S0-S2) is caught up and committed exactly as
  `Scheduler.complete` would, and its next block is allocated as
  `Scheduler.schedule` would: in running order, only if all of that step's
  new blocks fit (else the stretch hands over to the normal scheduler, which
  preempts);
* other requests are caught up once, when the stretch ends: tokens, prefix
  keys, token times (a slice of the stretch's step end times) and the
  organization's computed position (one quiet ``commit``).

Step durations come from the cost model step by step (the context grows by
one token per request per step) and are added to the clock in the same order
as the event loop adds them, so times are bit-identical; the step rows are
the same rows (memory read again from ``usage()`` only after a step that
allocated or finished a request). A stretch ends when the scheduler would
admit someone, when a new block does not fit, or when its last request
finished; the next step is then planned by `Scheduler.schedule`.
``HBENCH_SIM_FAST=0`` switches the shortcut off for debugging;
`tests/test_sim_fastpath.py` checks that both paths give identical results.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass

import numpy as np

from adapters.sim.cost import StepCost, StepShape
from harness.orgs.entries import ATTN_ENTRY
from harness.orgs.keys import KEY_TOKENS, extend_keys
from harness.orgs.values import Demand
from harness.scheduler import StepBatch, generated_token


def fast_path_enabled() -> bool:
    """The shortcut is on unless ``HBENCH_SIM_FAST`` is ``0`` (or ``false``/``off``)."""
    return os.environ.get("HBENCH_SIM_FAST", "1").strip().lower() not in ("0", "false", "off")


@dataclass
class StretchEnd:
    """Where a stretch stopped: every step of it completed, the last at ``now``,
    and the next step must be planned by `Scheduler.schedule`."""

    now: float
    steps: int          # steps completed inside the stretch
    reason: str         # what ended it: "admission", "no room", "idle"


def generated_tokens(rid: int, first: int, stop: int) -> np.ndarray:
    """`harness.scheduler.generated_token` for indices ``first`` .. ``stop - 1``,
    as int64 (the same values: every intermediate fits in 64 bits)."""
    index = np.arange(first, stop, dtype=np.int64)
    return 1_000_000 + (rid * 7919 + index * 104729) % 1_000_000_007


def decode_shape(requests: int, context_tokens: int) -> StepShape:
    """The `StepShape` that `StepShape.of_batch` builds for a batch of
    ``requests`` decodes whose contexts sum to ``context_tokens``."""
    return StepShape(prefill_tokens=0, prefill_attn_pairs=0, decode_requests=requests,
                     decode_context_tokens=context_tokens, prefill_context_tokens=0,
                     state_requests=requests, checkpoint_copies=0, checkpoint_loads=0)


def fast_forward(sched, batch: StepBatch, now: float, cost: StepCost, arrive, cost_model,
                 recorder, on_finish, on_step=None) -> StretchEnd | None:
    """Advance ``batch`` (just scheduled at ``now`` with ``cost`` and recorded) through
    the quiet steps that follow it. ``arrive(t)`` hands the scheduler every arrival
    before ``t``, as the event loop would, and returns how many there were;
    ``on_finish(requests, t)`` is told of the requests that finished at ``t``, as
    the event loop is after `Scheduler.complete`. None when the batch is not a
    pure decode batch (nothing was done)."""
    if batch.preempted or batch.failed or len(batch.items) != len(sched.running):
        return None
    items = batch.items
    for it in items:
        if it.prefill:
            return None
    return _Stretch(sched, items).run(now, cost, arrive, cost_model, recorder, on_finish,
                                      on_step)


class _Stretch:
    def __init__(self, sched, items):
        self.sched, self.org, self.items = sched, sched.org, items
        bt = self.org.attn_block_tokens
        self.bt = bt
        self.starts = [it.start for it in items]
        self.done = [0] * len(items)       # completions applied to each request
        self.live = [True] * len(items)    # not finished yet
        self.times = array("d")            # end time of each completed step
        # completion j makes request i complete a block iff (start_i + 1 + j) % bt == 0
        self.by_phase: dict[int, list[int]] = {}
        for i, c in enumerate(self.starts):
            self.by_phase.setdefault(-(c + 1) % bt, []).append(i)
        self._head, self._head_keys = None, set()    # the waiting head and its prefix keys
        # completion j emits request i's last token iff j == output_len - generated - 1
        self.finish_at: dict[int, list[int]] = {}
        for i, it in enumerate(items):
            self.finish_at.setdefault(it.req.output_len - it.req.generated - 1, []).append(i)

    def run(self, now, cost, arrive, cost_model, recorder, on_finish, on_step) -> StretchEnd:
        sched, org = self.sched, self.org
        d = len(self.items)
        context = sum(self.starts)
        token_budget = sched.policy.token_budget
        bt, by_phase, finish_at, times = self.bt, self.by_phase, self.finish_at, self.times
        j = 0
        while True:
            end = now + cost.total_s
            # arrivals while step j runs; one at exactly `end` comes after its planning
            arrived = arrive(end)
            # ---- completion of step j ------------------------------------------
            recorder.step_finished(end)
            times.append(end)
            crossing = by_phase.get(j % bt, ())
            ending = finish_at.pop(j, ())
            if ending:
                crossing = self._complete_with_finishes(crossing, ending, j, end, on_finish)
            else:
                for i in crossing:
                    self._catch_up(i, j + 1)
            # in vLLM's blocks an edge continued past in step j is released as
            # `Scheduler.complete` releases it: pages come free, so the waiting
            # head is asked again and memory read again
            released = bool(org.retiring)
            if released:
                org.end_step()
            now = end
            j += 1
            if on_step is not None:
                on_step()
            # ---- planning of step j: what `Scheduler.schedule` would do --------
            context += d              # every request's context grew by one token
            if ending:
                d -= len(ending)
                context -= sum(self.starts[i] + j for i in ending)
                if not d:
                    return self._finish(StretchEnd(now, j, "idle"))
            # the crossing requests need a new block. The waiting head, refused
            # when the stretch began, is asked again only after an arrival, a
            # finish or an eviction its prefix could feel (`_head_may_differ`):
            # otherwise pages were only taken (fewer available, its hit
            # unchanged) and the blocks registered end in tokens the running
            # requests generated, which no waiting request's prefix holds: it
            # stays refused
            evicted = False
            if crossing:
                lost: list = []
                org.watch_invalidations(lost)
                fits = self._allocate(crossing, j)
                org.watch_invalidations(None)
                if not fits:
                    return self._finish(StretchEnd(now, j, "no room"))
                evicted = bool(lost) and self._head_may_differ(lost)
            reason = None     # the last step's, unless the waiting queue was asked again
            if arrived or evicted or ending or released:
                reason = sched.refusal(token_budget - d)
                if reason is None:
                    # blocks are allocated as `schedule` would; it finds them in place
                    return self._finish(StretchEnd(now, j, "admission"))
            cost = cost_model.step(decode_shape(d, context))
            recorder.step_repeated(now, cost, len(sched.waiting),
                                   fresh=bool(crossing or ending or released),
                                   wait_reason=reason, running=d if ending else None)

    def _complete_with_finishes(self, crossing, ending, j: int, end: float,
                                on_finish) -> list[int]:
        """Completion j of the requests that complete a block and of those it
        finishes, in batch order as `Scheduler.complete` applies them; returns
        the crossing requests still running."""
        sched, items, live = self.sched, self.items, self.live
        finished = []
        for i in sorted({*crossing, *ending}):
            if i in ending:
                self._catch_up(i, j + 1, last=True)
                sched.finish_request(items[i].req, end)
                live[i] = False
                finished.append(items[i].req)
            else:
                self._catch_up(i, j + 1)
        for i in ending:
            self.by_phase[-(self.starts[i] + 1) % self.bt].remove(i)
        on_finish(finished, end)
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

    def _allocate(self, crossing: list[int], j: int) -> bool:
        """Allocate the next block of each crossing request (running order) if all fit."""
        org, items = self.org, self.items
        total = None
        for i in crossing:
            r = items[i].req
            need = org.pages_needed(r.rid, self.starts[i] + j + 1, r.prefill_until).pages
            total = need if total is None else tuple(a + b for a, b in zip(total, need, strict=True))
        if not org.can_allocate(Demand(total)):
            return False
        for i in crossing:
            r = items[i].req
            assert org.allocate(r.rid, self.starts[i] + j + 1, r.prefill_until)
        return True

    def _catch_up(self, i: int, upto: int, last: bool = False) -> None:
        """Apply completions ``done[i]`` .. ``upto - 1`` to request i as
        `Scheduler.complete` would have, one commit for all of them; ``last``:
        completion ``upto - 1`` emits its last token (nothing is fed back)."""
        n = upto - self.done[i]
        if n <= 0:
            return
        r = self.items[i].req
        first = self.done[i]
        self.done[i] = upto
        g = r.generated
        computed = self.starts[i] + upto
        tokens = r.tokens
        if n > 32:  # tokens generated by the earlier completions, before this commit
            tokens.frombytes(generated_tokens(r.rid, g + 1, g + n)
                             .astype(np.dtype(tokens.typecode)).tobytes())
        elif n > 1:
            tokens.extend([generated_token(r.rid, k) for k in range(g + 1, g + n)])
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

    def _finish(self, end: StretchEnd) -> StretchEnd:
        """Catch every running request up to the end of the stretch."""
        for i in range(len(self.items)):
            if self.live[i]:
                self._catch_up(i, end.steps)
        return end
