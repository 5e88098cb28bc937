"""A run's configuration together with what it resolves to, built once.

A `RunConfig` names a model (preset or config.json), a state dtype and a
budget label; turning those into a `ModelGeometry` and the organization's
`OrgBudget` is done exactly once per run, here, and the result travels as
one frozen value: validation checks it, the runner records it in the
manifest, and the engine builds its pools and cost model from it. No engine
re-reads a config.json or re-resolves a budget, so what the manifest says and
what the engine ran cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.budget import OrgBudget, resolve_budget
from harness.config import RunConfig
from harness.geometry import ModelGeometry
from harness.model_configs import geometry_for_run


@dataclass(frozen=True)
class RunSetup:
    config: RunConfig
    geometry: ModelGeometry
    budget: OrgBudget

    @classmethod
    def resolve(cls, config: RunConfig) -> RunSetup:
        """Resolve ``config``'s model and budget (HbenchError if either is unknown)."""
        geom = geometry_for_run(config)
        return cls(config, geom,
                   resolve_budget(config.budget, config.org, geom, config.d0_attn_fraction))

    def with_config(self, config: RunConfig) -> RunSetup:
        """The same resolution under a config that differs only in what the
        geometry and budget do not depend on (e.g. a saved workload's recipe)."""
        for name in ("model", "config_path", "ssm_state_dtype", "budget", "org",
                     "d0_attn_fraction"):
            assert getattr(config, name) == getattr(self.config, name), name
        return dataclasses.replace(self, config=config)
