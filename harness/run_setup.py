"""A run's configuration together with what it resolves to, built once.

A `RunConfig` names a model (preset or config.json), a state dtype, an
organization under a paging and a budget label; turning those into a
`ModelGeometry`, the organization's `OrgLayout` and its `OrgBudget` is done
exactly once per run, here, and the result travels as one frozen value:
validation checks it, the runner records it in the manifest, and the engine
builds its organization, pools and cost model from it. No engine re-reads a
config.json, re-derives a layout or re-resolves a budget, so what the
manifest says and what the engine ran cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.errors import HbenchError
from harness.budget import OrgBudget, resolve_budget
from harness.config import (
    MAX_RUN_MEMORY_BYTES,
    RUN_BYTES_PER_PAGE,
    RunConfig,
)
from harness.geometry import ModelGeometry
from harness.layout import OrgLayout
from harness.model_configs import geometry_for_run
from harness.orgs import layout_for


@dataclass(frozen=True)
class RunSetup:
    config: RunConfig
    geometry: ModelGeometry
    layout: OrgLayout       # the organization's layout under the run's paging
    budget: OrgBudget

    @classmethod
    def resolve(cls, config: RunConfig) -> RunSetup:
        """Resolve ``config``'s model, layout and budget (HbenchError if the
        model or the budget is unknown)."""
        geom = geometry_for_run(config)
        layout = layout_for(config.org, geom, config.resolved_paging)
        return cls(config, geom, layout,
                   resolve_budget(config.budget, layout, geom, config.d0_attn_fraction))

    def with_config(self, config: RunConfig) -> RunSetup:
        """The same resolution under a config that differs only in what the
        geometry and budget do not depend on (e.g. a saved workload's recipe)."""
        for name in ("model", "config_path", "ssm_state_dtype", "budget", "org",
                     "d0_attn_fraction", "resolved_paging"):
            assert getattr(config, name) == getattr(self.config, name), name
        return dataclasses.replace(self, config=config)


def validate(config: RunConfig) -> RunSetup:
    """Refuse (HbenchError, one line) a config that cannot run sensibly, before
    any work: a ``--token-budget`` below the organization's grid (a prefill
    chunk could never be scheduled), and a run estimated to need more than
    `MAX_RUN_MEMORY_BYTES` (its requests plus the simulator's pages). Whether
    the simulated GPU holds the weights and the budget is the simulator's
    check (`adapters.sim.profile.check_gpu_memory`). Resolves the model, the
    layout and the budget once (an unknown model, config.json or budget label
    fails here) and returns them as a `RunSetup` for the run to use."""
    setup = RunSetup.resolve(config)
    budget = setup.budget
    grid = setup.layout.grid_tokens
    if config.token_budget < grid:
        raise HbenchError(f"--token-budget {config.token_budget} is smaller than {config.org}'s "
                          f"grid of {grid} tokens; the minimum for {config.org} is {grid}")
    requests_bytes = 0.0 if config.workload_path else config.estimated_run_bytes
    pages_bytes = RUN_BYTES_PER_PAGE * budget.total_pages if config.engine == "sim" else 0
    if requests_bytes + pages_bytes > MAX_RUN_MEMORY_BYTES:
        raise HbenchError(
            f"this run would need about {(requests_bytes + pages_bytes) / 2**30:,.1f} GiB of memory "
            f"({config.expected_requests:,.0f} requests of {config.mean_input} prompt tokens, "
            f"{budget.total_pages:,} pages); the limit is {MAX_RUN_MEMORY_BYTES / 2**30:.0f} GiB: "
            "ask for fewer requests or a smaller budget")
    return setup
