"""The step recorder's memory columns are the organization's `usage()`.

`harness.engine.recorder.StepRecorder` reads a row's memory columns through
the organization's `step_memory` view (`harness.orgs.audit.StepMemory`: once
per step that changed pages, so it keeps its checkpoint figures until their
page counts change); this holds them to `harness.orgs.audit.usage` at every
step of small runs of every organization, values, types and column names
alike, and the run's peaks to the largest values in its rows.
"""

from __future__ import annotations

import dataclasses

import pytest

from adapters.sim.engine import SimEngine
from harness.config import ORG_NAMES, RunConfig
from harness.engine import recorder as rec
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload
from tests.support.compare import same


def usage_row(recorder) -> dict:
    """The memory columns as `usage()` gives them (the recorder's former code)."""
    org, layers = recorder.org, recorder.layers
    u = org.usage()
    by_kind = org.invalidations_by_kind
    row = {"invalidations_attention": by_kind["attention"],
           "invalidations_checkpoint": by_kind["checkpoint"],
           "slab_occupancy": u.slab_occupancy}
    for pool, counts in u.pages.items():
        for state, n in counts.items():
            row[f"pages_{pool}_{state}"] = n
    for k in ("attention", "ssm", "conv"):
        row[f"blocks_{k}_referenced"] = u.pages_by_kind[k]["referenced"]
        row[f"blocks_{k}_cached"] = u.pages_by_kind[k]["cached"]
        row[f"mem_{k}_bytes"] = u.bytes_by_kind[k]["referenced"] * layers
        row[f"cached_{k}_bytes"] = u.bytes_by_kind[k]["cached"] * layers
        row[f"waste_{k}_bytes"] = u.waste_by_kind[k] * layers
    return row


@pytest.mark.parametrize("org", ORG_NAMES)
@pytest.mark.parametrize("budget", ["b40", "b83"])
def test_memory_columns_are_usage(org, budget, monkeypatch):
    checked = []
    memory = rec.StepRecorder._memory

    def checking(self):
        want = usage_row(self)
        got = memory(self)
        cols = self._memory_columns()
        assert list(cols) == list(want)
        bad = [c for c, v in zip(cols, got, strict=True) if not same(v, want[c], typed=True)]
        assert not bad, [(c, want[c], got[cols.index(c)]) for c in bad]
        checked.append(1)
        return got

    monkeypatch.setattr(rec.StepRecorder, "_memory", checking)
    config = dataclasses.replace(RunConfig(), org=org, budget=budget, requests=30, rate=4.0,
                                 seed=2)
    run = SimEngine().run(build_run_workload(config), RunSetup.resolve(config))
    assert checked and len(run.steps) > 0
    rows = [run.steps[i] for i in range(len(run.steps))]
    kinds = ("attention", "ssm", "conv")
    assert run.peak_memory == {k: max(r[f"mem_{k}_bytes"] for r in rows) for k in kinds}
    assert run.counters["rounding_waste_bytes"]["pages"] == max(
        sum(r[f"waste_{k}_bytes"] for k in kinds) for r in rows)
