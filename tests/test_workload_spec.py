"""WorkloadSpec: the workload's identity is derived from the run config."""

from __future__ import annotations

import dataclasses

import pytest

from harness.config import RunConfig
from workloads.spec import CONFIG_NAMES, SavedWorkload, WorkloadSpec, workload_source

# A value different from the default for every RunConfig field a spec reads.
CHANGED = {"seed": 9, "q": 0.25, "rate": 5.0, "arrival": "gamma", "burstiness": 2.0,
           "requests": 17, "duration_s": 30.0, "contexts": 3, "max_model_len": 4096,
           "max_output": 256, "isolate": True, "mean_input": 2000}


def test_from_config_reads_every_spec_field_by_name():
    cfg = RunConfig(**CHANGED)
    spec = WorkloadSpec.from_config(cfg)
    for f in dataclasses.fields(WorkloadSpec):
        assert getattr(spec, f.name) == getattr(cfg, CONFIG_NAMES.get(f.name, f.name)), f.name


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_every_workload_knob_changes_the_cache_key(field):
    assert workload_source(RunConfig(**{field: CHANGED[field]})) != workload_source(RunConfig())


def test_knobs_outside_the_workload_share_the_key():
    base = workload_source(RunConfig())
    for change in ({"org": "d0"}, {"budget": "b63"}, {"headroom": 0.19}, {"cap": 10}):
        assert workload_source(RunConfig(**change)) == base


def test_warmup_requests_extend_the_stream():
    spec = WorkloadSpec.from_config(RunConfig(requests=50, warmup_requests=7))
    assert spec.requests == 57
    assert spec == WorkloadSpec.from_config(RunConfig(requests=57))


def test_a_saved_workload_is_keyed_by_its_content(tmp_path):
    f = tmp_path / "w.parquet"
    f.write_bytes(b"one")
    first = workload_source(RunConfig(workload_path=str(f)))
    assert first == SavedWorkload.of(f)
    f.write_bytes(b"two")
    assert workload_source(RunConfig(workload_path=str(f))) != first
