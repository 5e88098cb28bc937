"""What turns a planned step into time: the engine loop's one door to an engine.

The loop (`harness.engine.loop.EngineLoop`) owns the order of events; an
`Executor` owns what a step costs. The simulator's executor prices a step
with its cost model (`adapters.sim.executor.CostExecutor`); the torch
engine's runs it with real tensors and measures it
(`adapters.torch.engine.TensorExecutor`). Either records the step's row.
Per step the loop calls, in this order::

    executor.begin_step(now)          # the scheduler is about to plan a step
    batch = sched.schedule()
    end = executor.execute(batch)     # the step runs; its tokens are computed at `end`
    ... events before `end` (arrivals) ...
    finished = executor.complete(batch, end)

A scheduler built with ``stretches`` (the simulator's) may instead hand out a
run of quiet decode steps (`harness.scheduler.stretch.Stretch`); the loop
gives it to `run_stretch`, which only an executor that prices steps ahead
has (`harness.engine.stretch`).
"""

from __future__ import annotations

from typing import Protocol

from harness.scheduler.batch import SchedRequest, StepBatch
from harness.scheduler.stretch import Stretch


class Executor(Protocol):
    def begin_step(self, now: float) -> None:
        """A step starts at ``now``: the scheduler plans it next."""

    def execute(self, batch: StepBatch) -> float:
        """Run (or price) the step over ``batch``, started at the last
        `begin_step`, and record its row; the time its tokens are computed."""

    def complete(self, batch: StepBatch, now: float) -> list[SchedRequest]:
        """The step over ``batch`` ended at ``now``: commit it through the
        scheduler (with the token ids it computed) and close its row; the
        requests that finished."""

    def generated_ids(self, request: SchedRequest) -> list[int]:
        """Every token id finished ``request`` generated (a session's next
        turn continues with them)."""

    def run_stretch(self, stretch: Stretch, loop) -> str:
        """Price and record the steps of ``stretch`` as they end (only an
        executor whose scheduler hands out stretches is asked)."""
