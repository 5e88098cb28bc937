"""The workload a run serves, and the config its manifest records.

Both the application's runner (`hbench.runner.execute`) and an engine's own
checks that serve a config directly (`adapters.torch.continuation`) build a
run's workload here, so a workload and the config it came from are paired in
one place.
"""

from __future__ import annotations

import dataclasses

from common.errors import HbenchError
from harness.config import RunConfig


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
