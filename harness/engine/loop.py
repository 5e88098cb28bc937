"""The event loop every in-process engine runs: one event order, one clock.

In the shape of vidur's ``Simulator.run()``: events sit on a heap as
``(time, kind, seq, payload)`` tuples, so the order is defined once, by
``(time, kind, seq)``: earlier first; at equal times a finishing step
(`STEP_DONE`) before an arrival (`ARRIVAL`); then first pushed first. Only
the loop advances the clock (`harness.engine.clock`), to the time of the
event it handles:

* an arrival is handed to the scheduler (its prefix keys chained once per
  shared context, `SharedPrefixKeys`), marked warm-up if it is one of the
  workload's first ``warmup_requests``;
* a step completion is completed by the executor (`Executor.complete`); the
  requests that finished are counted for ``progress`` and, in a multi-turn
  workload, make the next turn of their session arrive
  (`workloads.multiturn.session.SessionLoop`, closed loop: a think time
  after the finish, with the tokens the engine generated in its prompt).

Whenever no step is in flight, there is work and no event before the clock's
time is left (on a virtual clock none ever is; on a wall clock the events
that fell due while a step ran come first), the loop plans
(`Scheduler.schedule`): one step (`Executor.execute`) whose completion goes
on the heap, or a stretch of quiet decode steps (`Executor.run_stretch`
runs them at once, each step's end handed to `step_ends`, which hands the
scheduler the arrivals before that end in the same event order).
At most one step is in flight. When the heap is empty every request has
ended (`Scheduler.check_drained`); `run` returns the run's request table
(`harness.request_table.RequestTable`), a row per request.
"""

from __future__ import annotations

import heapq
from array import array

from harness.orgs.keys import SharedPrefixKeys
from harness.request_table import RequestTable
from harness.scheduler.batch import DONE
from harness.scheduler.stretch import Stretch

#: Event kinds; at equal times a finishing step is handled before an arrival.
STEP_DONE, ARRIVAL = 0, 1


class _Ended:
    """What the scheduler's table holds for a request that ended and went into
    the loop's request table (``compact``): only that it ended."""

    state = DONE


_ENDED = _Ended()


def _session_loop(workload):
    """The closed loop of a multi-turn workload's sessions; imported here, since
    a workload without sessions (the study's) never needs it."""
    from workloads.multiturn.session import SessionLoop

    return SessionLoop(workload)


class EngineLoop:
    """One run of ``workload`` through ``sched`` and ``executor`` on ``clock``.
    ``progress(n)`` is told how many requests have ended (finished or failed)
    whenever that grows; ``check()`` (e.g. the organization's invariants)
    runs after every completed step. Each request's record becomes a row of
    ``table`` (`harness.request_table.RequestTable`, what `run` returns):
    once the run drained, or, ``compact``, as soon as it ends, so that a
    long run holds no Python object and no token time per request to its
    end (the scheduler's entry for it becomes a stand-in that says only
    that it ended)."""

    def __init__(self, workload, sched, executor, clock, *, warmup_requests: int = 0,
                 progress=None, check=None, compact: bool = False):
        self.sched, self.executor, self.clock = sched, executor, clock
        self.progress, self.check = progress, check
        self.compact = compact
        self.table = RequestTable()
        self.warm_ids = workload.warmup_ids(warmup_requests)
        self.sessions = _session_loop(workload) if workload.sessions else None
        self.sent: dict[int, object] = {}          # request id -> its workload request (sessions)
        # the open-loop arrivals come in order (arrival times never decrease):
        # the heap holds the next of them only, as ``(arrival, ARRIVAL, its
        # index, request)``, and the next one is pushed when it is handled, so
        # a long workload is neither held in the heap nor made at once
        # (`workloads.request_seq.MadeOnRead`). Every other event's seq
        # follows the open-loop arrivals', so the order is the one a heap of
        # every arrival gives.
        self.events: list = []
        self.stream = enumerate(workload.requests)
        self.opened = len(workload.requests)
        self.seq = self.opened
        self._next_arrival()
        self.ended = 0
        self.keys = SharedPrefixKeys()

    @property
    def now(self) -> float:
        return self.clock.now

    def _next_arrival(self) -> None:
        """The next open-loop arrival onto the heap, if any is left."""
        nxt = next(self.stream, None)
        if nxt is not None:
            seq, wr = nxt
            heapq.heappush(self.events, (wr.arrival_s, ARRIVAL, seq, wr))

    def push(self, t: float, kind: int, payload) -> None:
        """An event of ``kind`` at ``t``, after every event already pushed for (t, kind)."""
        heapq.heappush(self.events, (t, kind, self.seq, payload))
        self.seq += 1

    def run(self) -> RequestTable:
        """Handle every event (see the module docstring); the request table."""
        events, sched, executor, clock = self.events, self.sched, self.executor, self.clock
        in_flight = False
        while events:
            t, kind, seq, payload = heapq.heappop(events)
            now = clock.advance_to(t)
            if kind == ARRIVAL:
                if seq < self.opened:
                    self._next_arrival()
                self.arrive(payload)
            else:
                finished = executor.complete(payload, t)     # its tokens were computed at t
                in_flight = False
                self.finished(finished, clock.now)
                if self.check is not None:
                    self.check()
                now = clock.now
            # plan at the clock's time once every event before it was handled
            # (on a wall clock the step took time; on a virtual one none is due)
            if not in_flight and sched.has_work and not (events and events[0][0] < now):
                in_flight = self._plan()
        sched.check_drained()
        for r in sched.requests.values():      # all, or (compact) those failed or cancelled
            if r is not _ENDED:
                self.table.append(r.record)
        return self.table.seal()

    def _keep(self, r) -> None:
        """The ended request ``r`` as a row (``compact``)."""
        self.table.append(r.record)
        self.sched.requests[r.rid] = _ENDED

    def _plan(self) -> bool:
        """Start work at the clock's time: stretches while the scheduler hands
        them out, then one step; whether a step is in flight."""
        sched, executor = self.sched, self.executor
        while sched.has_work:
            executor.begin_step(self.clock.now)
            batch = sched.schedule()
            if isinstance(batch, Stretch):
                executor.run_stretch(batch, self)   # every step of it completed: plan anew
                continue
            if batch.failed:
                self._ended(len(batch.failed))
            if not batch.items:
                return False
            self.push(executor.execute(batch), STEP_DONE, batch)
            return True
        return False

    def step_ends(self, duration: float) -> tuple[float, int]:
        """The step a stretch runs ends ``duration`` after the clock's time:
        the arrivals before its end in event order (not one at its end) are
        handed to the scheduler and the clock advances to the end. Returns
        (the end, how many arrived). A stretch's steps are priced, not run,
        so the clock is virtual and its time is set (a wall clock's cannot
        be)."""
        clock, events = self.clock, self.events
        end = clock.now + duration
        done = (end, STEP_DONE)
        n = 0
        while events and events[0] < done:
            t, kind, seq, wr = heapq.heappop(events)
            assert kind == ARRIVAL, kind       # no other step is in flight
            clock.now = t
            if seq < self.opened:
                self._next_arrival()
            self.arrive(wr)
            n += 1
        clock.now = end
        return end, n

    def arrive(self, wr) -> None:
        """Hand the workload request ``wr`` to the scheduler."""
        ids = wr.prompt_token_ids
        keys = self.keys.chain(ids, wr.salt, wr.prefix_group, wr.prefix_tokens)
        added = self.sched.add(wr.request_id, wr.arrival_s, ids, wr.output_len, wr.salt,
                               wr.prefix_group, warmup=wr.request_id in self.warm_ids,
                               keys=keys)
        if self.sessions:
            self.sent[wr.request_id] = wr
            added.record.session, added.record.turn = self.sessions.turn_of[wr.request_id]

    def finished(self, requests, now: float) -> None:
        """``requests`` finished in the step completed at ``now``."""
        for r in requests:
            if self.sessions:
                nxt = self.sessions.next_turn(self.sent.pop(r.rid),
                                              self.executor.generated_ids(r), now)
                if nxt is not None:
                    self.push(nxt.arrival_s, ARRIVAL, nxt)
            # nothing reads a finished request's token ids, prefix keys and
            # token times again (its record keeps what the results need): a
            # long run holds only the unfinished requests'
            r.tokens, r.keys, r.token_times = array("i"), [], array("d")
            if self.compact:
                self._keep(r)
        if requests:
            self._ended(len(requests))

    def _ended(self, n: int) -> None:
        self.ended += n
        if self.progress:
            self.progress(self.ended)
