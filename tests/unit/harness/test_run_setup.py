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


@pytest.mark.parametrize("org", ["s2", "d0"])
def test_an_np_label_counts_the_pages_of_the_runs_own_grid(org):
    """``Np`` is N of the run's shared pages: with ``--shared-block-tokens 256``
    half the bytes of N of the model's 512-token pages."""
    default = RunSetup.resolve(RunConfig(org=org, budget="400p"))
    halved = RunSetup.resolve(RunConfig(org=org, budget="400p", shared_block_tokens=256))
    per_token = GEOM.slot_attn_bytes_per_token
    assert default.budget.target_bytes == 400 * 512 * per_token
    assert halved.budget.target_bytes == 400 * 256 * per_token
    if org == "s2":      # its pages are the grid's shared pages: still 400 of them
        assert halved.budget.pools[0].pages == default.budget.pools[0].pages == 400
