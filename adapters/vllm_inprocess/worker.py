"""One hbench run decided by vLLM's scheduler: the process in the vLLM venv.

    $HBENCH_VLLM_PYTHON -m adapters.vllm_inprocess.worker IN.pkl OUT.pkl

``IN.pkl`` holds ``(workload, setup)`` as hbench's process resolved them
(`adapters.vllm_inprocess.engine` writes it); ``OUT.pkl`` receives the
`harness.records.EngineRun`. In between, hbench's engine loop
(`harness.engine.loop.EngineLoop`) runs on a virtual clock with
`adapters.vllm_inprocess.scheduler.VllmScheduler` over vLLM's own
`Scheduler`, `KVCacheManager` and block pool, built for the run by
`adapters.vllm_inprocess.config`, each step priced by hbench's cost model
(`adapters.sim.cost`, the run's ``--gpu``) as the simulator prices its steps.

The manifest's ``engine_info["vllm"]`` records what vLLM resolved, read from
its objects: block size, page bytes, block count and the KV-cache groups.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import sys
import tempfile
from pathlib import Path

from adapters.sim.cost import CostModel
from adapters.sim.profile import hardware_for
from adapters.venv_worker import REFUSED
from common.errors import HbenchError
from harness.engine.clock import VirtualClock
from harness.engine.loop import EngineLoop
from harness.engine.shape import StepShape
from harness.records import EngineRun

POLL_INTERVAL_S = 0.05      # as the simulator's: completions noticed at the next poll


def is_mamba(spec) -> bool:
    """Whether a KV-cache spec is vLLM's Mamba state (or a subclass of it:
    `adapters.vllm_inprocess.config.grid_page_mamba_spec`)."""
    return any(c.__name__ == "MambaSpec" for c in type(spec).__mro__)


class EvictionCount:
    """Cached blocks vLLM's block pools evict, by kind (``attention`` or
    ``checkpoint``): each pool's ``_remove_cached_block_hashes`` (the step of
    `BlockPool._maybe_evict_cached_block` that drops a block from the prefix
    cache, vllm/v1/core/block_pool.py) is wrapped to count the block once, by
    the KV-cache group its hash names. The plugin's S1/S2 invalidate a
    checkpoint through the same call when a member page is reused
    (`adapters.vllm_plugin.pages`)."""

    def __init__(self, core, kv_cache_config):
        from vllm.v1.core.kv_cache_utils import get_group_id

        kinds = ["checkpoint" if is_mamba(g.kv_cache_spec) else "attention"
                 for g in kv_cache_config.kv_cache_groups]
        self.counts = {"attention": 0, "checkpoint": 0}
        managers = core.kv_cache_manager.coordinator.single_type_managers
        pools = {id(m.block_pool): m.block_pool for m in managers}
        for pool in pools.values():
            remove = pool._remove_cached_block_hashes

            def counted(block, remove=remove):
                hashes = remove(block)
                if hashes:
                    self.counts[kinds[get_group_id(hashes[0])]] += 1
                return hashes

            pool._remove_cached_block_hashes = counted


class VllmStepExecutor:
    """Prices each step with the cost model and records a row of it: the
    bytes of vLLM's blocks that running requests hold, by kind (attention or
    Mamba state; for the plugin's S1/S2 a carrier with its member pages and
    its slab page), whole model; the cached blocks evicted so far; S2's slab
    occupancy."""

    def __init__(self, sched, cost_model, page_bytes: int, pool_layers: int, evictions):
        self.sched, self.cost_model = sched, cost_model
        self.block_bytes = page_bytes * pool_layers
        managers = sched.core.kv_cache_manager.coordinator.single_type_managers
        self.managers = [("ssm" if is_mamba(m.kv_cache_spec) else "attention", m)
                         for m in managers]
        self.evictions = evictions
        self.rows: list[dict] = []
        self.peak = {"attention": 0, "ssm": 0}
        self.start = 0.0

    def begin_step(self, now: float) -> None:
        self.start = now

    def held_bytes(self) -> dict[str, int]:
        """Bytes of the distinct real blocks running requests hold, by kind."""
        held = {"attention": set(), "ssm": set()}
        for kind, m in self.managers:
            pool = m.block_pool
            for blocks in m.req_to_blocks.values():
                for b in blocks:
                    if b.is_null:
                        continue
                    held[kind].add(b.block_id)
                    members = getattr(pool, "members", {}).get(b.block_id, ())
                    held[kind].update(p.block_id for p in members)
                    slot = getattr(pool, "slots", {}).get(b.block_id)
                    if slot is not None:
                        held[kind].add(slot[0])
        return {k: len(v) * self.block_bytes for k, v in held.items()}

    def slab_occupancy(self) -> float:
        """S2's used conv slots over the slots of its open slab pages (0.0 with
        none open, as `harness.orgs.slabs` counts); NaN without slabs."""
        pools = [m.block_pool for _, m in self.managers
                 if getattr(getattr(m.block_pool, "layout", None), "uses_slabs", False)]
        if not pools:
            return math.nan
        pool = pools[0]
        total = len(pool.slabs) * pool.layout.slab_slots
        return len(pool.slots) / total if total else 0.0

    def execute(self, batch) -> float:
        cost = self.cost_model.step(StepShape.of_batch(batch))
        core = self.sched.core
        mem = self.held_bytes()
        for k, v in mem.items():
            self.peak[k] = max(self.peak[k], v)
        self.rows.append({
            "start_s": self.start, "time_s": self.start + cost.total_s,
            "duration_s": cost.total_s, "batch_tokens": batch.batch_tokens,
            "running": len(core.running), "waiting": len(core.waiting),
            "preempted": len(batch.preempted), "wait_reason": batch.wait_reason,
            **{f"mem_{k}_bytes": v for k, v in mem.items()},
            **{f"invalidations_{k}": v for k, v in self.evictions.counts.items()},
            "slab_occupancy": self.slab_occupancy(),
            "kv_usage": core.kv_cache_manager.usage,
            "vllm_free_blocks": core.kv_cache_manager.block_pool.get_num_free_blocks(),
        })
        return self.start + cost.total_s

    def complete(self, batch, now: float) -> list:
        return self.sched.complete(batch, now)

    def generated_ids(self, request) -> list[int]:
        """Every sampled token was appended to the request (vLLM's too)."""
        return list(request.tokens[request.prompt_len:])



def describe(vllm_config, kv_cache_config, block_size: int, hash_block_size: int,
             budget_bytes: int) -> dict:
    """What vLLM resolved, read from its config objects."""
    cache = vllm_config.cache_config
    groups = [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
               "block_size": g.kv_cache_spec.block_size,
               "page_bytes": g.kv_cache_spec.page_size_bytes}
              for g in kv_cache_config.kv_cache_groups]
    page = max(g["page_bytes"] for g in groups)
    return {
        "num_blocks": kv_cache_config.num_blocks, "num_gpu_blocks": cache.num_gpu_blocks,
        "block_size": cache.block_size, "scheduler_block_size": block_size,
        "hash_block_size": hash_block_size, "mamba_block_size": cache.mamba_block_size,
        "mamba_cache_mode": cache.mamba_cache_mode,
        "mamba_page_size_padded": cache.mamba_page_size_padded,
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "page_bytes": page, "kv_cache_groups": groups,
        "max_num_seqs": vllm_config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
        "scheduler_reserve_full_isl": vllm_config.scheduler_config.scheduler_reserve_full_isl,
        "max_model_len": vllm_config.model_config.max_model_len,
        "budget_bytes_per_pool_layer": budget_bytes,
        "allocated_bytes_per_pool_layer": kv_cache_config.num_blocks * page,
        "scheduler": "vllm.v1.core.sched.scheduler.Scheduler",
        "block_size_resolved_for": "FlashAttention (a CUDA platform's hybrid alignment)",
    }


def plugin_scheduler(config):
    """For S1, S2 or D0: hbench's plugin installed in this process (as a
    server's plugin loader installs it from HBENCH_ORG, `adapters.vllm_plugin`)
    and its `PinningScheduler`, the class a launched server gets; for S0
    (stock vLLM) None."""
    from adapters.vllm_plugin.plan import PLUGIN_ORGS, Plan

    if config.org not in PLUGIN_ORGS:
        return None
    import vllm

    from adapters.vllm_plugin import check_version
    from adapters.vllm_plugin.hooks import install
    from adapters.vllm_plugin.scheduler import PinningScheduler

    check_version(vllm.__version__)
    install(Plan(config.org, d0_attn_fraction=config.d0_attn_fraction)
            if config.org == "d0" else Plan(config.org))
    return PinningScheduler


def serve(workload, setup) -> EngineRun:
    from adapters.vllm_inprocess.config import build
    from adapters.vllm_inprocess.scheduler import VllmScheduler

    config, geom, budget = setup.config, setup.geometry, setup.budget
    with tempfile.TemporaryDirectory(prefix="hbench-vllm-model-") as tmp:
        vllm_config, kv_config, block_size, hash_block_size = build(
            config, budget.target_bytes, Path(tmp))
    plugin = plugin_scheduler(config)
    sched = VllmScheduler(vllm_config, kv_config, block_size, hash_block_size,
                          **({"scheduler_cls": plugin} if plugin else {}))
    if config.retention:
        sched.core.enable_retention(config.retention_threshold)
    info_vllm = describe(vllm_config, kv_config, block_size, hash_block_size,
                         budget.target_bytes)
    evictions = EvictionCount(sched.core, kv_config)
    executor = VllmStepExecutor(sched, CostModel(geom, hardware_for(config.gpu)),
                                info_vllm["page_bytes"], geom.pool_layers, evictions)
    loop = EngineLoop(workload, sched, executor, VirtualClock(),
                      warmup_requests=config.warmup_requests)
    table = loop.run()
    last = table.last_finish()
    window_end = math.ceil(last / POLL_INTERVAL_S - 1e-9) * POLL_INTERVAL_S
    info = {
        "engine": "vllm", "mode": "in-process", "pool_layers": geom.pool_layers,
        "pools": [{"name": "shared", "pages": kv_config.num_blocks - 1,
                   "page_bytes": info_vllm["page_bytes"]}],
        "attn_block_tokens": block_size, "grid_tokens": block_size,
        "cache_state": "cold", "warmup_requests": config.warmup_requests,
        "hardware": config.gpu, "poll_interval_s": POLL_INTERVAL_S,
        "vllm": info_vllm,
    }
    prefix = sched.prefix
    counters = {
        "preemptions": sched.preemptions,
        "vllm_prefix_requests": prefix["requests"],
        "vllm_prefix_queries": prefix["queries"],
        "vllm_prefix_hits": prefix["hits"],
        "vllm_preempted_prefix_requests": prefix["preempted_requests"],
        "vllm_preempted_prefix_queries": prefix["preempted_queries"],
        "vllm_preempted_prefix_hits": prefix["preempted_hits"],
        "vllm_num_blocks": kv_config.num_blocks,
        **{f"invalidations_{k}": v for k, v in evictions.counts.items()},
    }
    if plugin:
        info["vllm"]["plugin"] = plugin_counters(sched.core)
    return EngineRun(requests=table, steps=executor.rows, window_start_s=0.0,
                     window_end_s=window_end, engine_info=info, peak_memory=executor.peak,
                     counters=counters)


def plugin_counters(core) -> dict:
    """What hbench's plugin counted, read from its objects: the Mamba
    manager's pool (S1/S2 pages and slab, D0's private pool), the pins and
    retention's holds."""
    managers = core.kv_cache_manager.coordinator.single_type_managers
    mamba = [m for m in managers if hasattr(m, "counters")]
    retention = core.retention.snapshot() if core.retention is not None else {}
    return {**(mamba[0].counters() if mamba else {}), **dict(core.pin_counters), **retention}


def quiet_vllm() -> None:
    """vLLM logs every config step, and warns about its CPU platform's
    choices, which `config.resolve_gpu_block_size` replaces; its errors show."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)



def main(argv=None) -> None:
    quiet_vllm()
    src, dst = (argv or sys.argv[1:])[:2]
    with open(src, "rb") as f:
        workload, setup = pickle.load(f)
    try:
        run = serve(workload, setup)
    except HbenchError as exc:
        sys.stderr.write(f"\n{REFUSED}{exc}\n")
        sys.exit(2)
    with open(dst, "wb") as f:
        pickle.dump(run, f)


if __name__ == "__main__":
    main()
