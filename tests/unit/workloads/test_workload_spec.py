"""WorkloadSpec: the workload's identity is derived from the run config."""

from __future__ import annotations

import dataclasses

import pytest

from common.errors import HbenchError
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


# RunConfig field -> a refused value, each at or just past one limit of workloads.bounds
REFUSED = [{"mean_input": 4}, {"max_history": 4},
           {"max_model_len": 31}, {"max_output": 0}, {"q": 1.5},
           {"rate": 0.0}, {"rate": float("nan")}, {"burstiness": 0.0}, {"requests": 0},
           {"requests": 1_000_001}, {"duration_s": 0.0}, {"duration_s": 1e9}, {"contexts": 0},
           {"max_turns": 0}, {"think_time_s": -1.0}, {"seed": -1}, {"arrival": "burst"},
           {"think": "lognormal"}, {"workload_kind": "chat"},
           {"workload_kind": "multiturn", "requests": 200_000}]
# ... past a limit relative to the model length (8192 by default): refused by the
# spec a run derives its workload from, not by the config, which also launches
# servers and serves saved workloads
REFUSED_AGAINST_MODEL_LEN = [{"mean_input": 8192}, {"max_history": 8193}, {"max_output": 8192}]
# ... and the values at the limit, which both accept
ACCEPTED = [{"mean_input": 5}, {"mean_input": 8191}, {"max_history": 5}, {"max_history": 8192},
            {"max_model_len": 32, "mean_input": 16, "max_output": 31}, {"max_output": 8191},
            {"workload_kind": "multiturn", "requests": 125_000}]
SPEC_NAMES = {v: k for k, v in CONFIG_NAMES.items()}


def _spec(change: dict) -> WorkloadSpec:
    base = dataclasses.asdict(WorkloadSpec.from_config(RunConfig()))
    return WorkloadSpec(**{**base, **{SPEC_NAMES.get(k, k): v for k, v in change.items()}})


@pytest.mark.parametrize("change", REFUSED, ids=str)
def test_run_config_and_spec_refuse_the_same_values_with_one_message(change):
    with pytest.raises(HbenchError) as by_config:
        RunConfig(**change)
    with pytest.raises(HbenchError) as by_spec:
        _spec(change)
    assert str(by_config.value) == str(by_spec.value)


@pytest.mark.parametrize("change", REFUSED_AGAINST_MODEL_LEN, ids=str)
def test_the_limits_against_the_model_length_hold_where_the_workload_is_derived(change):
    config = RunConfig(**change)       # e.g. a server launched with a short model length
    with pytest.raises(HbenchError) as by_derivation:
        WorkloadSpec.from_config(config)
    with pytest.raises(HbenchError) as by_spec:
        _spec(change)
    assert str(by_derivation.value) == str(by_spec.value)
    assert "max-model-len 8192" in str(by_spec.value)


@pytest.mark.parametrize("change", ACCEPTED, ids=str)
def test_run_config_and_spec_accept_the_values_at_each_limit(change):
    assert WorkloadSpec.from_config(RunConfig(**change)) == _spec(change)


def test_warmup_is_checked_with_the_measured_requests():
    with pytest.raises(HbenchError, match="--requests must be >= 1, got 0"):
        RunConfig(requests=0, warmup_requests=5)
    with pytest.raises(HbenchError, match=r"--warmup must be in \[0, 1,000,000\]"):
        RunConfig(warmup_requests=-1)
