"""E0's capacity moves priced by the simulator (`adapters.sim.moves`,
`CostModel.move_s`): the remapping of the bytes moved, charged to the step
whose planning moved them, and nothing for a step that moved nothing."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from adapters.sim.cost import CostModel
from adapters.sim.hardware import get_hardware
from adapters.sim.moves import MovePricing
from harness.engine.shape import StepShape
from harness.model_configs import preset
from harness.results import list_runs, read_run
from hbench.cli import cli

GRANULE = 2 * 1024 * 1024
REMAP_S = (25.63 + 1.45 + 35.99) * 1e-6     # unmap + map + set access, one 2 MiB granule


@pytest.fixture(scope="module")
def model():
    return CostModel(preset("falcon-h1-7b"), get_hardware("a100-pcie-40gb"))


class MovingOrg:
    """Just the views `MovePricing` reads: bytes per pool layer moved (e0) and
    copied by compaction (u0) so far."""

    def __init__(self):
        self.moved_capacity_bytes = 0
        self.compacted_bytes = 0


def test_a_move_costs_the_remap_of_its_granules(model):
    assert model.move_s(GRANULE) == pytest.approx(REMAP_S, rel=1e-12)
    assert model.move_s(0) == 0.0
    # one checkpoint unit of Falcon-H1-7B in all 44 layers: 33.45 granules
    assert model.move_s(1_594_368 * 44) == pytest.approx(1_594_368 * 44 / GRANULE * REMAP_S)


def test_the_step_after_a_move_pays_for_it_once(model):
    org = MovingOrg()
    pricing = MovePricing(model, org, layers=44)
    shape = StepShape.from_requests(prefill_chunks=((512, 0),), decode_contexts=(3000,) * 8)
    plain = model.step(shape)
    assert pricing.step(shape) == plain                    # nothing moved: the model's price
    org.moved_capacity_bytes += 98 * 16384                 # one move of 98 attention blocks
    charged = pricing.step(shape)
    extra = model.move_s(98 * 16384 * 44)
    assert charged.total_s == pytest.approx(plain.total_s + extra, rel=1e-12)
    assert charged.overhead_s == pytest.approx(plain.overhead_s + extra, rel=1e-12)
    assert charged.compute_s == plain.compute_s and charged.bound == plain.bound
    assert pricing.step(shape) == plain                    # charged once
    assert pricing.counters() == {"capacity_move_s": pytest.approx(extra, rel=1e-12),
                                  "compaction_copy_s": 0.0}
    assert pricing.priced_moves == 1


def test_a_compaction_costs_a_read_and_a_write_of_its_pages(model):
    """U0's compaction copies pages within device memory: twice the time the
    cost model gives for reading the same bytes (the weights' read, here)."""
    assert model.copy_s(model.weights_read_bytes) == pytest.approx(2 * model._weights_s,
                                                                   rel=1e-12)
    assert model.copy_s(0) == 0.0
    org = MovingOrg()
    pricing = MovePricing(model, org, layers=44)
    shape = StepShape.from_requests(prefill_chunks=((512, 0),), decode_contexts=(3000,) * 8)
    plain = model.step(shape)
    org.compacted_bytes += 112 * 16384                      # 112 attention blocks moved
    charged = pricing.step(shape)
    extra = model.copy_s(112 * 16384 * 44)
    assert charged.total_s == pytest.approx(plain.total_s + extra, rel=1e-12)
    assert pricing.step(shape) == plain
    assert pricing.counters() == {"capacity_move_s": 0.0,
                                  "compaction_copy_s": pytest.approx(extra, rel=1e-12)}


def test_decode_prices_carry_the_move_too(model):
    org = MovingOrg()
    pricing = MovePricing(model, org, layers=44)
    values = model.decode_values(8, 24000)
    assert pricing.decode_values(8, 24000) == values
    org.moved_capacity_bytes += 1_594_368
    moved = pricing.decode_values(8, 24000)
    extra = model.move_s(1_594_368 * 44)
    assert moved[5] == pytest.approx(values[5] + extra) and moved[4] == pytest.approx(values[4] + extra)
    assert moved[:4] == values[:4] and moved[6:] == values[6:]
    org.moved_capacity_bytes += 1_594_368
    step = pricing.decode_step(8, 24000)
    assert step.total_s == pytest.approx(model.decode_step(8, 24000).total_s + extra)
    assert pricing.counters()["capacity_move_s"] == pytest.approx(2 * extra)


def test_an_e0_run_charges_its_moves_to_its_steps(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--json", "--org", "e0",
                                   "--budget", "b63", "--rate", "3", "--seed", "1",
                                   "--requests", "60"])
    assert res.exit_code == 0, res.output
    (path,) = list_runs(tmp_path)
    data = read_run(path)
    s, steps = data["summary"], data["steps"]
    assert s["capacity_moves"] > 0
    assert s["capacity_move_s"] == pytest.approx(s["capacity_moved_bytes"] / GRANULE * REMAP_S,
                                                 rel=1e-9)
    # every step's overhead is the preset's 4 ms, plus the moves charged to it
    assert (steps.overhead_s - 0.004).sum() == pytest.approx(s["capacity_move_s"], rel=1e-6)
    charged = steps[steps.overhead_s > 0.004 + 1e-12]
    assert 0 < len(charged) <= s["capacity_moves"]
