"""The embedded default engine: a discrete-event simulation in virtual time.

The engine core's loop (`harness.engine.loop.EngineLoop`) on a virtual clock,
with the simulator's executor (`adapters.sim.executor.CostExecutor`): each
step's duration comes from the roofline cost model (`adapters.sim.cost`)
applied to the batch the scheduler built, so the simulator needs no GPU and
is deterministic: the same workload and config give identical results, bit
for bit.
"""

from __future__ import annotations

import math

from adapters.sim.cost import CostModel
from adapters.sim.executor import CostExecutor
from adapters.sim.moves import MovePricing
from adapters.sim.profile import hardware_for
from common.code_digest import code_digest
from harness import __version__
from harness.config import ORG_NAMES
from harness.engine.clock import VirtualClock
from harness.engine.fits import check_fits
from harness.engine.info import engine_info
from harness.engine.loop import EngineLoop
from harness.engine.recorder import StepRecorder
from harness.layout import PAGINGS
from harness.orgs import CheckpointPolicy, build_organization
from harness.records import EngineRun
from harness.scheduler import Scheduler, SchedulerPolicy

#: The benchmark notices completions by polling at this interval (assumed, like a
#: serving benchmark's client loop); the ledger window ends at the next poll.
POLL_INTERVAL_S = 0.05

#: Where the import walk of the simulator's code digest starts: the engine,
#: and through its imports the scheduler, organizations and cost model.
DIGEST_ROOTS = ("adapters.sim.engine",)


class SimEngine:
    """The simulator. ``fast=False`` plans every step with `Scheduler.schedule`
    instead of handing quiet decode steps out as stretches
    (`harness.scheduler.stretch`); tests hold the two to identical results."""

    name = "sim"
    supported_orgs = ORG_NAMES   # the simulator expresses every registered organization
    supported_pagings = PAGINGS  # the study's pages, or vLLM's blocks to mirror a vLLM run

    def __init__(self, fast: bool = True):
        self.fast = fast

    def version(self) -> str:
        """Changes whenever the simulator's code (hence possibly its outputs) changes."""
        return f"sim-{__version__}-{code_digest(DIGEST_ROOTS)}"

    def build(self, setup):
        """The organization a resolved run serves with (its pools from the budget)."""
        return build_organization(setup.layout, tuple(p.pages for p in setup.budget.pools),
                                  CheckpointPolicy.from_config(setup.config, setup.geometry))

    def run(self, workload, setup, progress=None) -> EngineRun:
        config, geom, budget = setup.config, setup.geometry, setup.budget
        org = self.build(setup)
        check_fits(org, workload, config, budget.label)
        hardware = hardware_for(config.gpu)
        sched = Scheduler(org, SchedulerPolicy.from_config(config), stretches=self.fast)
        recorder = StepRecorder(org, geom.pool_layers, spill=True)   # steps.parquet as it fills
        pricing = CostModel(geom, hardware)
        if org.region() is not None:   # pools that trade capacity within one region (u0, e0)
            pricing = MovePricing(pricing, org, geom.pool_layers)
        executor = CostExecutor(sched, pricing, recorder)
        loop = EngineLoop(workload, sched, executor, VirtualClock(),
                          warmup_requests=config.warmup_requests, progress=progress,
                          check=org.check_invariants if config.debug_invariants else None,
                          compact=True)   # an ended request leaves its row only
        table = loop.run()
        last = table.last_finish()
        window_end = math.ceil(last / POLL_INTERVAL_S - 1e-9) * POLL_INTERVAL_S
        info = engine_info(self.name, setup, org)
        info.update(hardware=config.gpu, poll_interval_s=POLL_INTERVAL_S)
        if hasattr(hardware, "describe"):      # a measured cost profile (hbench calibrate)
            info["cost_profile"] = hardware.describe()
        counters = recorder.counters(sched.preemptions, budget.rounding_loss_bytes)
        priced = pricing.counters() if isinstance(pricing, MovePricing) else {}
        if "capacity_moves" in counters:      # an organization that moves capacity (e0)
            counters["capacity_move_s"] = priced["capacity_move_s"]
        if "compactions" in counters:         # one that compacts its sides (u0)
            counters["compaction_copy_s"] = priced["compaction_copy_s"]
        counters.update(org.policy_counters())   # --utility-alpha auto: the tuned alpha
        return EngineRun(requests=table, steps=recorder.table(), window_start_s=0.0,
                         window_end_s=window_end, engine_info=info, peak_memory=recorder.peak,
                         counters=counters)
