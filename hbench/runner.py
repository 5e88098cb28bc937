"""One run, end to end: config -> workload -> engine -> results directory.

`execute` is what `hbench run` calls and what every sweep cell calls, so a
cell and a hand-typed run can never differ. It checks the engine can express
the organization, builds the workload (warm-up requests first, flagged and
excluded from every metric), runs the engine, insists that nothing was lost,
and writes the self-describing results directory atomically.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from adapters.registry import check_expressible, check_paging, make_engine
from adapters.sim.profile import check_gpu_memory, hardware_for
from harness.config import RunConfig
from harness.results import free_run_id, write_run
from harness.run_address import new_run_id
from harness.run_grid import grid_record
from harness.run_setup import RunSetup, validate
from harness.run_workload import build_run_workload, recorded_config
from workloads.kinds import WORKLOAD_KINDS

#: Where the import walk of the recording code's digest starts: this runner,
#: the summary metrics and the workload builder with its derivers (named in
#: `WORKLOAD_KINDS`, which the builder imports by name, so an import walk
#: alone would miss them).
RECORDING_ROOTS = ("hbench.runner", "harness.metrics", "workloads.build", "workloads.io",
                   *(module for module, _ in WORKLOAD_KINDS.values()))


def recorded_version(engine) -> str:
    """The version a run records and a sweep cell is addressed by: the
    engine's (its code and package) and the digest of the code that builds
    the workload and summarizes the run (`common.code_digest`)."""
    from common.code_digest import code_digest

    return f"{engine.version()}+{code_digest(RECORDING_ROOTS)}"


def budget_manifest(b) -> dict:
    """The manifest's record of a resolved `harness.budget.OrgBudget`."""
    return {
        "label": b.label, "org": b.org, "target_bytes_per_pool_layer": b.target_bytes,
        "whole_model_bytes": b.whole_model_bytes, "pool_layers": b.pool_layers,
        "d0_attn_fraction": b.d0_attn_fraction, "paging": b.paging,
        "rounding_loss_bytes_per_pool_layer": b.rounding_loss_bytes,
        # what the engine is given: equal (within one page) across organizations
        "allocated_bytes_per_pool_layer": b.allocated_bytes,
        "allocated_whole_model_bytes": b.allocated_bytes * b.pool_layers,
        "pools": [asdict(p) for p in b.pools],
    }


def validate_run(config: RunConfig, *, allow_oversubscribe: bool = False) -> RunSetup:
    """The checks a run passes before any work, every floor's: the config's
    own (`harness.run_setup.validate`, which resolves the model and the
    budget once) and, for the simulator unless ``allow_oversubscribe``, that
    the simulated GPU holds the weights and the budget
    (`adapters.sim.profile.check_gpu_memory`). Returns the resolved `RunSetup`."""
    setup = validate(config)
    if config.endpoint is not None:
        # imported here: the HTTP client (http.client, ssl, email) is a served run's alone
        from adapters.client.http import Endpoint

        Endpoint.parse(config.endpoint)   # a malformed URL is one line before any work
    if config.engine == "sim":
        hardware_for(config.gpu)   # a malformed cost profile is refused here, not after the run
        if not allow_oversubscribe:
            check_gpu_memory(setup)
    return setup


def execute(config: RunConfig, out_root: str | Path = "results", *, workload=None,
            progress=None, run_id: str | None = None, allow_oversubscribe: bool = False,
            setup: RunSetup | None = None) -> Path:
    """Run ``config`` and write ``out_root/<run-id>/``; returns that path.
    ``setup``: what `validate_run` returned for ``config``, where the caller
    validated it before any work (``hbench run``, a sweep's cell), so the run
    is resolved once; None validates and resolves here."""
    if setup is None:
        setup = validate_run(config, allow_oversubscribe=allow_oversubscribe)
    elif setup.config != config:
        raise ValueError("execute: the setup given was resolved for another config")
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
        Path(out_root), run_id=run_id or free_run_id(Path(out_root), new_run_id(config, wl_hash)),
        config=config, run=run,
        workload_hash=wl_hash, workload_meta=dict(workload.meta),
        budget=budget_manifest(setup.budget),
        engine_name=engine.name, engine_version=recorded_version(engine),
        weights_bytes=setup.geometry.weights_bytes,
        extra_manifest={"cache_state": run.engine_info.get("cache_state", "cold"),
                        "warmup_requests": config.warmup_requests,
                        "grid": grid_record(setup.grid, setup.layout, config.grid_from)},
    )
