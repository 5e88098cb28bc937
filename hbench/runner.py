"""One run, end to end: config -> workload -> engine -> results directory.

`execute` is what `hbench run` calls and what every sweep cell calls, so a
cell and a hand-typed run can never differ. It checks the engine can express
the organization, builds the workload (warm-up requests first, flagged and
excluded from every metric), runs the engine, insists that nothing was lost,
and writes the self-describing results directory atomically.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path

from adapters.registry import check_expressible, check_paging, make_engine
from harness.config import RunConfig
from harness.errors import HbenchError
from harness.results import new_run_id, write_run
from harness.run_setup import validate


def budget_manifest(b) -> dict:
    """The manifest's record of a resolved `harness.budget.OrgBudget`."""
    return {
        "label": b.label, "org": b.org, "target_bytes_per_pool_layer": b.target_bytes,
        "whole_model_bytes": b.whole_model_bytes, "pool_layers": b.pool_layers,
        "d0_attn_fraction": b.d0_attn_fraction, "paging": b.paging,
        "rounding_loss_bytes_per_pool_layer": b.rounding_loss_bytes,
        "pools": [asdict(p) for p in b.pools],
    }


def build_run_workload(config: RunConfig):
    """The workload a config describes, with its warm-up requests in front; or
    the saved workload it names (whose first ``warmup_requests`` are warm-up)."""
    if config.workload_path:
        from workloads.io import load_workload

        workload = load_workload(config.workload_path)
        if config.warmup_requests >= len(workload):
            raise HbenchError(f"--warmup {config.warmup_requests} leaves no measured request "
                              f"in {config.workload_path} ({len(workload)} requests)")
        return workload
    from workloads.build import workload_from_config

    return workload_from_config(config)


def recorded_config(config: RunConfig, workload) -> RunConfig:
    """The config a run's manifest records. For a saved workload the workload
    flags were ignored, so the workload's own generator parameters (seed, q,
    rate, requests, ...) replace them: analysis pairs runs on these fields."""
    if not config.workload_path:
        return config
    from workloads.spec import config_fields_from_meta

    recipe = config_fields_from_meta(dict(workload.meta), len(workload), config.warmup_requests)
    try:
        return dataclasses.replace(config, **recipe)
    except (HbenchError, TypeError) as exc:
        raise HbenchError(f"{config.workload_path}: its recorded recipe is not a valid run "
                          f"configuration ({exc})") from None


def execute(config: RunConfig, out_root: str | Path = "results", *, workload=None,
            progress=None, run_id: str | None = None, allow_oversubscribe: bool = False) -> Path:
    """Run ``config`` and write ``out_root/<run-id>/``; returns that path."""
    setup = validate(config, allow_oversubscribe=allow_oversubscribe)   # geometry, budget: once
    engine = make_engine(config.engine)
    check_expressible(engine.name, engine.supported_orgs, config.org)
    check_paging(engine, config.resolved_paging)
    if workload is None:
        workload = build_run_workload(config)
    config = recorded_config(config, workload)
    setup = setup.with_config(config)
    run = engine.run(workload, setup, progress)
    wl_hash = workload.content_hash
    return write_run(
        Path(out_root), run_id=run_id or new_run_id(config, wl_hash), config=config, run=run,
        workload_hash=wl_hash, workload_meta=dict(workload.meta),
        budget=budget_manifest(setup.budget),
        engine_name=engine.name, engine_version=engine.version(),
        weights_bytes=setup.geometry.weights_bytes,
        extra_manifest={"cache_state": run.engine_info.get("cache_state", "cold"),
                        "warmup_requests": config.warmup_requests},
    )
