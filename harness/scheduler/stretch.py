"""A quiet decode run: the steps the scheduler hands out as one value.

Most steps are pure decode with an unchanged batch: every running request
computes one token, and only token counters, the clock and the growing
context change. `Scheduler.schedule` hands such a step out as the first of
a `Stretch`; the engine loop prices and records its steps
(`harness.engine.stretch.run_stretch`) and tells the stretch when each ends
(`complete`), then asks what the next one is (`plan`). Where something
happens (a request finishes or reaches a new attention block, an arrival, an
admission, a preemption, a state due for release) the stretch applies the
scheduler's own functions: `Scheduler.advance`, `complete`, `refusal`,
`admit`, `make_room`, `admit_unless_preempted`, `end_step`, and the
organization's `allocate_all` for the blocks decodes reach.

A request is brought up to date (one ``commit`` for all the tokens since)
only when it finishes, is preempted, or the stretch ends, unless a decode
commit may publish in place: why that is exact, and which events make the
waiting head be asked again, is in docs/architecture.md ("Quiet decode
stretches").

The stretch ends, and `Scheduler.schedule` plans the next step, when a
request admitted inside it goes on with a chunked prefill (``"prefill"``),
its last request finished (``"idle"``), a new block does not fit and it may
not preempt for it (``"no room"``: in place, or the first running request
might be the victim), or in vLLM's blocks a passed state is due for release
when its request is planned next (``"release"``).

``SimEngine(fast=False)`` plans every step with `Scheduler.schedule`;
`tests/unit/harness/scheduler/test_scheduler_stretch.py` checks that both
give identical results.
"""

from __future__ import annotations

from array import array

from harness.orgs import may_change_lookup
from harness.scheduler.batch import RUNNING, StepBatch

#: What the next step of a stretch is (`Stretch.plan`): the same decodes as the
#: last step with nothing else changed (``QUIET``: no page taken or freed, the
#: waiting requests wait as before), the same decodes or fewer (``REPEAT``),
#: decodes whose row is made afresh after an admission (``FRESH``), or decodes
#: and the chunks of the requests it admits (``ADMIT``).
#: ``PREEMPT``: the decodes left after preempting for a block (``preempted``).
QUIET, REPEAT, FRESH, ADMIT, PREEMPT = "quiet", "repeat", "fresh", "admit", "preempt"
#: Why a stretch ended (`Stretch.plan`; module docstring).
PREFILL, IDLE, NO_ROOM, RELEASE = "prefill", "idle", "no room", "release"


class Stretch:
    """Quiet decode steps from the one `Scheduler.schedule` planned
    (module docstring). Read by the engine loop before each step: ``decodes``
    (requests decoding), ``context`` (their contexts' sum), ``reason`` (why
    the waiting requests wait; None: as in the last step), ``admitted`` (an
    ``ADMIT`` step's batch of first chunks), ``fresh`` (pages changed since
    the last step) and ``shrunk`` (requests finished in the last step)."""

    def __init__(self, sched, reqs, reason: str):
        self.sched, self.org, self.reqs = sched, sched.org, reqs
        self.reason = reason                   # why the waiting head waits in the first step
        self.starts = [r.computed for r in reqs]
        self.decodes, self.context = len(reqs), sum(self.starts)
        self.admitted: StepBatch | None = None
        self.preempted: StepBatch | None = None   # a ``PREEMPT`` step's (no items)
        self.fresh = self.shrunk = False
        bt = self.org.attn_block_tokens
        self.bt = bt
        # bring a request up to date only when it finishes or the stretch ends,
        # not at each block it completes (module docstring), unless a decode
        # commit may publish a checkpoint in place
        self.defer = not self.org.in_place
        self._retiring = self.org.retiring     # requests past a state this step (in place)
        self.done = [0] * len(reqs)        # completions applied to each request
        self.live = [True] * len(reqs)     # not finished yet
        self.times = array("d")            # end time of each completed step
        self.j = 0                         # completions so far
        # completion j makes request i complete a block iff (start_i + 1 + j) % bt == 0
        self.by_phase: dict[int, list[int]] = {}
        for i, c in enumerate(self.starts):
            self.by_phase.setdefault(-(c + 1) % bt, []).append(i)
        # completion j emits request i's last token iff j == output_len - generated - 1
        self.finish_at: dict[int, list[int]] = {}
        self.finish_j: list[int] = []      # that completion, per request
        for i, r in enumerate(reqs):
            self._finishes_at(i, r.output_len - r.generated - 1)
        self._head, self._head_keys = None, set()    # the waiting head and its prefix keys
        # what the last completion left for planning
        self._crossing: list[int] | tuple = ()
        self._ending: list[int] | tuple = ()
        self._joined: list[int] = []
        self._prefilling = False
        self._released = False

    # ---- a step ended ------------------------------------------------------------
    def complete(self, end: float) -> list | None:
        """The step in flight ended at ``end``: its commits by the scheduler's
        rules (module docstring); the requests that finished, or None when
        nothing happened but a token more of context each (no block
        completed, nobody finished, admitted or preempted, nothing released:
        the next step is `QUIET` unless a request arrived)."""
        j = self.j
        self.j = j + 1
        self.times.append(end)
        self.context += self.decodes     # every request's context grew by one token
        crossing = self.by_phase.get(j % self.bt, ())
        ending = self.finish_at.pop(j, ())
        if not (crossing or ending or self.admitted is not None or self.preempted is not None
                or self._retiring):
            self._crossing = self._ending = ()    # nothing to commit yet (module docstring)
            self._released = False
            return None
        sched, finished = self.sched, []
        if ending:
            crossing = self._complete_with_finishes(crossing, ending, j, finished)
        elif not self.defer:
            for i in crossing:
                self._advance(i, j + 1)
        admitted, self._prefilling = self.admitted, False
        if admitted is not None:
            crossing = list(crossing)
            # the admitted requests come after the running ones in the batch;
            # `Scheduler.complete` also ends the step (`Organization.end_step`)
            finished += sched.complete(admitted, end)
            self._joined = self._join(admitted.items, j)
        # in vLLM's blocks an edge continued past in step j falls due as
        # `Scheduler.complete` lets it (`Scheduler.end_step`)
        self._released = bool(self._retiring) and sched.end_step()
        self._crossing, self._ending = crossing, ending
        return finished

    def _join(self, admitted, j: int) -> list[int]:
        """After completion j: the admitted requests that now decode join the
        stretch (running order: after everyone else); returns their indices."""
        joined = []
        for it in admitted:
            r = it.req
            if r.state != RUNNING:
                continue                  # finished with its first token
            if r.computed < r.prefill_until:
                self._prefilling = True
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
        return joined

    def _finishes_at(self, i: int, j: int) -> None:
        """Request i emits its last token at completion j."""
        self.finish_at.setdefault(j, []).append(i)
        self.finish_j.append(j)

    def _complete_with_finishes(self, crossing, ending, j: int, finished: list) -> list[int]:
        """Completion j of the requests it finishes (and, unless `defer`, of those
        that complete a block), in batch order as `Scheduler.complete` applies
        them (the finished ones go to ``finished``); returns the crossing
        requests still running."""
        reqs, live = self.reqs, self.live
        for i in sorted(ending if self.defer else {*crossing, *ending}):
            if self._advance(i, j + 1):
                live[i] = False
                finished.append(reqs[i])
        for i in ending:
            self.by_phase[-(self.starts[i] + 1) % self.bt].remove(i)
        return [i for i in crossing if live[i]]

    def _advance(self, i: int, upto: int) -> bool:
        """Apply completions ``done[i]`` .. ``upto - 1`` to request i by
        `Scheduler.advance`, one commit for all of them; whether it finished."""
        first = self.done[i]
        if upto <= first:
            return False
        self.done[i] = upto
        return self.sched.advance(self.reqs[i], self.starts[i] + upto, self.times[first:upto])

    # ---- the next step -------------------------------------------------------------
    def plan(self, arrived: int) -> str:
        """Plan the next step by the scheduler's rules, after ``arrived``
        arrivals while the last one ran: `QUIET`, `REPEAT`, `FRESH` or `ADMIT` (the
        attributes say the rest), or why the stretch ended (every request is
        then up to date)."""
        crossing, ending = self._crossing, self._ending
        if not (crossing or ending or arrived or self._released or self._joined
                or self._prefilling or self.admitted is not None
                or self.preempted is not None):
            return QUIET
        sched, org = self.sched, self.org
        j = self.j
        if ending:
            self.decodes -= len(ending)
            self.context -= sum(self.starts[i] + j for i in ending)
        joined, self._joined = self._joined, []
        if joined:
            self.decodes += len(joined)
            self.context += sum(self.starts[i] + j for i in joined)
            crossing = [*crossing, *(i for i in joined if (self.starts[i] + j) % self.bt == 0)]
        replan = self.admitted is not None or self.preempted is not None
        self.admitted = self.preempted = None
        if self._prefilling:   # a chunked prefill goes on: the scheduler plans the step
            return self._end(PREFILL)
        if not self.decodes:
            return self._end(IDLE)
        if org.retired:    # released as each request is planned: `Scheduler.schedule`
            return self._end(RELEASE)
        # the crossing requests need a new block. The waiting head, refused
        # when the stretch began, is asked again only after an arrival, a
        # finish, an admission or an eviction its prefix could feel
        # (`_head_may_differ`): otherwise pages were only taken (fewer
        # available, its hit unchanged) and the blocks registered end in
        # tokens the running requests generated, which no waiting request's
        # prefix holds: it stays refused
        evicted = False
        if crossing:
            lost: list = []
            org.watch_invalidations(lost)
            # each one's room for its next token, all together as
            # `Scheduler._decode_rooms` asks (the others have theirs)
            reqs, starts = self.reqs, self.starts
            fits = org.allocate_all([(reqs[i].rid, starts[i] + j + 1, reqs[i].prefill_until)
                                     for i in crossing])
            org.watch_invalidations(None)
            if not fits:
                if not self._may_preempt(crossing):
                    return self._end(NO_ROOM)
                self.preempted = self._preempt_for(crossing, j)
                return PREEMPT
            evicted = ((bool(lost) and self._head_may_differ(lost))
                       or not org.takes_keep_refusals)
        self.reason = None     # the last step's, unless the waiting queue is asked again
        self.fresh = bool(crossing or ending or self._released)
        self.shrunk = bool(ending)
        if arrived or evicted or ending or self._released or replan:
            budget = sched.policy.token_budget - self.decodes
            self.reason = sched.refusal(budget)
            if self.reason is None:
                # admitted as `Scheduler.schedule` admits after the decodes:
                # the step computes their chunks too
                batch = StepBatch()
                sched.admit(batch, budget)
                assert batch.items and not batch.failed, "admission with requests running"
                self.admitted = batch
                return ADMIT
        return FRESH if replan else REPEAT

    def _may_preempt(self, crossing: list[int]) -> bool:
        """Whether the step whose crossing requests' blocks do not all fit may
        be planned here (`_preempt_for`): not where a decode commit may publish
        in place, and not if the first running request might be preempted too
        (nothing would run: the scheduler plans again at once, admitting in the
        same step)."""
        return self.defer and (self.reqs[crossing[0]] is not self.sched.running[0]
                               or self.org.available_pages()[0] > 0)

    def _preempt_for(self, crossing: list[int], j: int) -> StepBatch:
        """The step `Scheduler.schedule` plans when the crossing requests'
        blocks do not all fit: in running order each gets its room by
        `Scheduler.make_room`, which preempts; a victim is brought up to date
        first and leaves the stretch. Returns the step's batch without its
        items (who was preempted, why the waiting wait:
        `Scheduler.admit_unless_preempted`)."""
        sched, reqs, live, starts = self.sched, self.reqs, self.live, self.starts
        where = {reqs[k].rid: k for k in range(len(reqs)) if live[k]}
        batch = StepBatch()

        def leave(victim) -> None:
            k = where[victim.rid]
            self._advance(k, j)
            live[k] = False
            self.by_phase[-(starts[k] + 1) % self.bt].remove(k)
            self.finish_at[self.finish_j[k]].remove(k)
            self.decodes -= 1
            self.context -= starts[k] + j

        for i in crossing:
            if live[i]:
                c = starts[i] + j
                sched.make_room(reqs[i], c, c + 1, False, batch.preempted, leave)
        sched.admit_unless_preempted(batch, sched.policy.token_budget - self.decodes)
        return batch

    def _head_may_differ(self, lost: list) -> bool:
        """Whether the waiting head's admission may read differently after
        allocations that invalidated the entries ``lost``
        (`harness.orgs.entries.may_change_lookup`): reclaiming a page no
        lookup of its prefix reads only took a page, as taking an empty one
        would, so a refused head stays refused for the same reason."""
        waiting = self.sched.waiting
        if not waiting:
            return True         # nobody to ask: `refusal` answers "" at once
        head = waiting[0]
        if self._head is not head:
            self._head, self._head_keys = head, set(head.keys)
        keys = self._head_keys
        return any(may_change_lookup(e, keys) for e in lost)

    def _end(self, reason: str) -> str:
        """Bring every running request up to the end of the stretch; returns ``reason``."""
        for i in range(len(self.reqs)):
            if self.live[i]:
                self._advance(i, self.j)
        return reason
