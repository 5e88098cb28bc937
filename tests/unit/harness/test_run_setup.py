"""RunSetup: a run's geometry, layout and budget, resolved once."""

from __future__ import annotations

import pytest

from adapters.sim.engine import SimEngine
from harness.budget import resolve_budget
from harness.config import RunConfig
from harness.model_configs import preset
from harness.orgs import layout_for
from harness.run_setup import RunSetup

GEOM = preset("falcon-h1-7b")


@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
@pytest.mark.parametrize("paging", ["study", "vllm"])
def test_the_setup_carries_the_layout_of_the_run_and_its_budget_is_resolved_from_it(org, paging):
    setup = RunSetup.resolve(RunConfig(org=org, paging=paging))
    assert setup.layout == layout_for(org, GEOM, paging)
    assert setup.layout.paging == paging == setup.budget.paging
    assert setup.budget == resolve_budget("b83", setup.layout, GEOM)


def test_the_simulator_builds_the_organization_of_the_setups_layout():
    setup = RunSetup.resolve(RunConfig(org="s1", paging="vllm"))
    org = SimEngine().build(setup)
    assert org.layout is setup.layout
    assert org.capacity().pools[0].pages == setup.budget.pools[0].pages
