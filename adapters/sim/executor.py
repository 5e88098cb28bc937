"""The simulator's executor: a step takes what the cost model says it takes.

`CostExecutor` is the `harness.engine.executor.Executor` of the simulator:
it prices each planned step with the roofline cost model
(`adapters.sim.cost.CostModel` applied to its `StepShape`), records its row
and completes it with the scheduler's deterministic stand-in tokens. Because
it can price steps ahead it runs the stretches of quiet decode steps the
scheduler hands out (`harness.engine.stretch.run_stretch`).
"""

from __future__ import annotations

from harness.engine.shape import StepShape
from harness.engine.stretch import run_stretch
from harness.scheduler.batch import generated_token


class CostExecutor:
    def __init__(self, sched, cost_model, recorder):
        self.sched, self.cost_model, self.recorder = sched, cost_model, recorder
        self.start = 0.0

    def begin_step(self, now: float) -> None:
        self.start = now

    def execute(self, batch) -> float:
        sched = self.sched
        cost = self.cost_model.step(StepShape.of_batch(batch))
        self.recorder.step_started(self.start, batch, cost, len(sched.running),
                                   len(sched.waiting))
        return self.start + cost.total_s

    def complete(self, batch, now: float) -> list:
        finished = self.sched.complete(batch, now)
        self.recorder.step_finished(now)
        return finished

    def generated_ids(self, request) -> list[int]:
        """The ids the scheduler fed back into the sequence, plus the last one
        (emitted, never fed back)."""
        r = request
        return [*r.tokens[r.prompt_len:], generated_token(r.rid, r.generated)]

    def run_stretch(self, stretch, loop) -> str:
        return run_stretch(loop, stretch, self.cost_model, self.recorder)
