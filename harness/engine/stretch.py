"""The engine loop's side of a quiet decode run: pricing and recording its steps.

`Scheduler.schedule` hands out a run of quiet decode steps as a value
(`harness.scheduler.stretch.Stretch`), which applies the scheduler's rules
when a step ends (`Stretch.complete`) and before the next one
(`Stretch.plan`). `run_stretch` is what the loop does with it: each step is
priced (``pricing``: the cost model's ``decode_values`` for a step like the
last, ``step`` of a `StepShape` for one that admits) and recorded
(`harness.engine.recorder.StepRecorder`: a repeated row, memory read again
only when pages changed), and the loop's clock advances to its end
(`EngineLoop.step_ends`, which hands the scheduler the arrivals before it).
Times and rows are those of the same steps planned one by one.
"""

from __future__ import annotations

from harness.engine.shape import StepShape
from harness.scheduler.stretch import ADMIT, FRESH, PREEMPT, QUIET, REPEAT


def run_stretch(loop, stretch, pricing, recorder) -> str:
    """Run ``stretch`` from the loop's time until it ends; why it ended
    (`harness.scheduler.stretch`), every request brought up to date."""
    sched = stretch.sched
    d, context = stretch.decodes, stretch.context
    cost = pricing.decode_step(d, context)
    recorder.decode_step_started(loop.now, cost, d, len(sched.waiting), stretch.reason)
    duration = cost.total_s
    step_ends, on_finish, check = loop.step_ends, loop.finished, loop.check
    while True:
        end, arrived = step_ends(duration)
        recorder.step_finished(end)
        finished = stretch.complete(end)
        if finished:
            on_finish(finished, end)
        if check is not None:
            check()
        kind = QUIET if finished is None and not arrived else stretch.plan(arrived)
        if kind is QUIET:      # the last row again, a token more of context each
            values = pricing.decode_values(d, stretch.context)
            duration = values[5]
            recorder.decode_repeated(end, values, len(sched.waiting), False)
            continue
        d, context = stretch.decodes, stretch.context
        if kind is REPEAT:
            values = pricing.decode_values(d, context)
            duration = values[5]
            recorder.decode_repeated(end, values, len(sched.waiting), stretch.fresh,
                                     stretch.reason, d if stretch.shrunk else None)
        elif kind is FRESH:
            cost = pricing.decode_step(d, context)
            recorder.decode_step_started(end, cost, d, len(sched.waiting), stretch.reason)
            duration = cost.total_s
        elif kind is ADMIT:
            batch = stretch.admitted
            cost = pricing.step(StepShape.of_step(batch.items, d, context))
            recorder.admission_step_started(end, cost, d, batch, len(sched.running),
                                            len(sched.waiting))
            duration = cost.total_s
        elif kind is PREEMPT:
            batch = stretch.preempted
            cost = pricing.step(StepShape.of_step((), d, context))
            recorder.decode_step_started(end, cost, d, len(sched.waiting), batch.wait_reason,
                                         batch.preempted)
            duration = cost.total_s
        else:
            return kind
