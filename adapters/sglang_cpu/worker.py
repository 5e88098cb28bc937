"""One hbench run served by SGLang's memory code: the process in the SGLang venv.

    $HBENCH_SGLANG_PYTHON -m adapters.sglang_cpu.worker IN.pkl OUT.pkl

``IN.pkl`` holds ``(workload, setup)`` as hbench's process resolved them
(`adapters.sglang_cpu.engine` writes it); ``OUT.pkl`` receives the
`harness.records.EngineRun`. In between, hbench's engine loop
(`harness.engine.loop.EngineLoop`) runs on a virtual clock with
`adapters.sglang_cpu.scheduler.SglangScheduler` over SGLang's pools and radix
cache, each step priced by hbench's cost model (`adapters.sim.cost`), as the
simulator prices its steps.

The pools come from the run's budget: its bytes per pool layer
(``setup.budget.target_bytes``, the same bytes every organization gets) split
by SGLang's rule with ``mamba_full_memory_ratio = (1 - f) / f`` for D0's
attention fraction f (`pools.split`), at SGLang's page size 1: two pools for
``--org d0``, and for ``--org u0`` SGLang's unified memory, one region of the
split's bytes whose KV and Mamba sides move (`pools.build_unified`). The manifest's
``engine_info["sglang"]`` records what SGLang's objects hold, read from them.
"""

from __future__ import annotations

import math
import pickle
import sys
from functools import partial

from adapters.sglang import mamba_full_memory_ratio
from adapters.sglang_cpu import pools as sg_pools
from adapters.sglang_cpu.requests import Memory
from adapters.sglang_cpu.scheduler import SglangScheduler
from adapters.sglang_cpu.tree import build_tree
from adapters.sim.cost import CostModel
from adapters.sim.profile import hardware_for
from harness.engine.clock import VirtualClock
from harness.engine.loop import EngineLoop
from harness.engine.shape import StepShape
from harness.records import EngineRun

POLL_INTERVAL_S = 0.05      # as the simulator's: completions noticed at the next poll


class SglangStepExecutor:
    """Prices each step with the cost model and records a row of it, with the
    KV and Mamba bytes in use in SGLang's pools (whole model)."""

    def __init__(self, sched, cost_model, memory, pool_layers: int, geom):
        self.sched, self.cost_model, self.memory = sched, cost_model, memory
        self.scale = pool_layers
        self.kv_bytes = sg_pools.kv_bytes_per_token(geom)
        self.ssm_bytes, self.conv_bytes = geom.slot_ssm_bytes, geom.slot_conv_bytes
        self.rows: list[dict] = []
        self.peak = {"attention": 0, "ssm": 0, "conv": 0}
        self.start = 0.0

    def begin_step(self, now: float) -> None:
        self.start = now

    def execute(self, batch) -> float:
        cost = self.cost_model.step(StepShape.of_batch(batch))
        m = self.memory
        kv_used = m.pools.kv_pool.size - m.kv.available_size()
        slots_used = m.pools.req_to_token_pool.mamba_pool.size - m.mamba.available_size()
        mem = {"attention": kv_used * self.kv_bytes * self.scale,
               "ssm": slots_used * self.ssm_bytes * self.scale,
               "conv": slots_used * self.conv_bytes * self.scale}
        for k, v in mem.items():
            self.peak[k] = max(self.peak[k], int(v))
        self.rows.append({
            "start_s": self.start, "time_s": self.start + cost.total_s,
            "duration_s": cost.total_s, "batch_tokens": batch.batch_tokens,
            "running": len(self.sched.running), "waiting": len(self.sched.waiting),
            "preempted": len(batch.preempted), "wait_reason": batch.wait_reason,
            **{f"mem_{k}_bytes": int(v) for k, v in mem.items()},
            "sglang_evictions": m.evictions, "sglang_mamba_slots_in_use": int(slots_used),
        })
        return self.start + cost.total_s

    def complete(self, batch, now: float) -> list:
        return self.sched.complete(batch, now)

    def generated_ids(self, request) -> list[int]:
        from harness.scheduler.batch import generated_token
        r = request
        return [*r.tokens[r.prompt_len:], generated_token(r.rid, r.generated)]



def serve(workload, setup) -> EngineRun:
    config, geom, budget = setup.config, setup.geometry, setup.budget
    ratio = mamba_full_memory_ratio(config.d0_attn_fraction)
    pool_split = sg_pools.split(budget.target_bytes, geom, ratio, page_size=1)
    max_context = max(len(wr.prompt_token_ids) + wr.output_len for wr in workload.requests)
    if workload.sessions:
        max_context = max(max_context, config.max_model_len or 0)
    unified = config.org == "u0"
    build = sg_pools.build_unified if unified else partial(sg_pools.build, page_size=1)
    pools = build(geom, pool_split, max_running=config.cap + 1,
                  max_context=max(max_context, 1) + 1)
    memory = Memory(pools, build_tree(pools))
    sched = SglangScheduler(memory, cap=config.cap, token_budget=config.token_budget)
    executor = SglangStepExecutor(sched, CostModel(geom, hardware_for(config.gpu)), memory,
                                  geom.pool_layers, geom)
    loop = EngineLoop(workload, sched, executor, VirtualClock(),
                      warmup_requests=config.warmup_requests)
    table = loop.run()
    last = table.last_finish()
    window_end = math.ceil(last / POLL_INTERVAL_S - 1e-9) * POLL_INTERVAL_S
    described = pools.describe()
    info = {
        "engine": "sglang", "mode": "in-process", "pool_layers": geom.pool_layers,
        "pools": ([{"name": "region", "pages": described["kv_tokens"],   # all of it as KV
                    "page_bytes": sg_pools.kv_bytes_per_token(geom)}] if unified else
                  [{"name": "attention", "pages": described["kv_tokens"],
                    "page_bytes": sg_pools.kv_bytes_per_token(geom)},
                   {"name": "checkpoint", "pages": described["mamba_slots"],
                    "page_bytes": geom.slot_checkpoint_bytes}]),
        "attn_block_tokens": 1, "grid_tokens": config.token_budget,
        "cache_state": "cold", "warmup_requests": config.warmup_requests,
        "hardware": config.gpu, "poll_interval_s": POLL_INTERVAL_S,
        "sglang": {**described, "mamba_full_memory_ratio": ratio,
                   "budget_bytes_per_pool_layer": budget.target_bytes,
                   "tree": "UnifiedRadixCache(FULL, MAMBA)",
                   "memory": "unified" if unified else "dual pools"},
    }
    counters = {
        "preemptions": sched.preemptions,
        "sglang_evictions": memory.evictions,
        "sglang_evicted_kv_tokens": memory.evicted_kv_tokens,
        "sglang_evicted_mamba_slots": memory.evicted_mamba_slots,
        "sglang_tombstoned_nodes": memory.tombstones.count,
        "sglang_mamba_slots_in_use_peak": memory.mamba_in_use_peak,
        "sglang_mamba_slots": described["mamba_slots"],
    }
    return EngineRun(requests=table, steps=executor.rows, window_start_s=0.0,
                     window_end_s=window_end, engine_info=info, peak_memory=executor.peak,
                     counters=counters)


def main(argv=None) -> None:
    src, dst = (argv or sys.argv[1:])[:2]
    with open(src, "rb") as f:
        workload, setup = pickle.load(f)
    run = serve(workload, setup)
    with open(dst, "wb") as f:
        pickle.dump(run, f)


if __name__ == "__main__":
    main()
