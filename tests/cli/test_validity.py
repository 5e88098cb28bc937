"""Validity verdicts: each check on hand-made inputs, then through the CLI
(`hbench run`'s table and summary.json, `hbench analyze` leaving contrasts
with invalid arms out of their Holm families, `hbench regress` naming them)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from harness import validity as V
from hbench.cli import cli
from tests.support import REPO_ROOT
from tests.support.cli import hbench_run
from tests.support.results_factory import record_files, run_id_of, write_run

METRIC = "throughput_ledger_tok_s"


def test_rate_check_uses_three_standard_errors():
    arrivals = np.arange(101) / 2.0            # 100 gaps of 0.5 s: exactly 2 req/s
    assert V.delivered_rate(arrivals) == pytest.approx(2.0)
    assert V.check_rate(arrivals, 2.0)["status"] == V.PASS
    # tolerance max(5 %, 3/sqrt(100)) = 30 %: 2.5 req/s nominal is 20 % off -> pass, 3.0 -> fail
    assert V.check_rate(arrivals, 2.5)["status"] == V.PASS
    assert V.check_rate(arrivals, 3.0)["status"] == V.FAIL
    # one arrival measures no load: fewer than MIN_MEASURED_REQUESTS fails; no nominal rate is n/a
    assert V.check_rate([1.0], 2.0)["status"] == V.FAIL
    assert V.check_rate(arrivals, None)["status"] == V.NA


def test_poisson_test_rejects_evenly_spaced_arrivals():
    # Equal gaps of 1/rate: the ECDF jumps from 0 to 1 where the exponential CDF
    # is 1 - 1/e, so the KS statistic is 1 - e^-1 = 0.632 and 200 gaps reject.
    even = np.arange(201) / 3.0
    assert V.check_process(even, "poisson", 3.0)["status"] == V.FAIL
    poisson = np.cumsum(np.random.default_rng([7, 1]).exponential(1 / 3.0, 400))
    assert V.check_process(poisson, "poisson", 3.0)["status"] == V.PASS
    assert V.check_process(even, "constant", 3.0)["status"] == V.PASS
    assert V.check_process(poisson, "constant", 3.0)["status"] == V.FAIL
    assert V.check_process(poisson, "gamma", 3.0)["status"] == V.NA


def test_queue_growth_is_the_fitted_rise_over_the_second_half():
    t = np.linspace(0, 10, 101)
    assert V.queue_growth(t, 2 * t, 0.0, 10.0) == pytest.approx(10.0)   # slope 2 over 5 s
    assert V.queue_growth(t, np.full(t.size, 7.0), 0.0, 10.0) == pytest.approx(0.0)
    grows = V.check_overload(t, 2 * t, np.linspace(0, 10, 20))
    assert grows["status"] == V.FAIL and "transient" in grows["detail"]
    assert V.check_overload(t, np.ones(t.size), np.linspace(0, 10, 20))["status"] == V.PASS


def test_failures_dispatch_and_cache_state():
    assert V.check_failures(0, 0)["status"] == V.PASS
    assert V.check_failures(1, 0)["status"] == V.FAIL
    assert V.check_dispatch([math.nan])["status"] == V.NA
    # p99 of 100 sorted lags sits at rank 98.01: one slow lag moves it to 5.99 ms
    # (under the 10 ms bound), two put it at 500 ms
    assert V.check_dispatch([0.001] * 99 + [0.5])["status"] == V.PASS
    assert V.check_dispatch([0.001] * 98 + [0.5] * 2)["status"] == V.FAIL
    assert V.check_dispatch([0.001] * 100)["status"] == V.PASS
    assert V.check_cache("cold", 0)["status"] == V.PASS
    assert V.check_cache(None, 0)["status"] == V.WARN
    v = V.verdict({"a": {"status": V.PASS, "detail": ""}, "b": {"status": V.FAIL, "detail": "x"}})
    assert v["valid"] is False and v["reasons"] == ["b"]


def test_arm_parity_names_each_difference():
    a = {"workload_hash": "w1", "engine_version": "e1", "delivered_rate_req_s": 3.0}
    assert V.arm_parity(a, dict(a)) == []
    b = {"workload_hash": "w2", "engine_version": "e2", "delivered_rate_req_s": 3.1}
    problems = V.arm_parity(a, b)
    assert problems[0] == "workload hash differs" and problems[1] == "engine version differs"
    assert problems[2].startswith("measured load differs")


@pytest.mark.slow
def test_run_at_light_load_is_valid_and_heavy_load_is_overloaded(tmp_path):
    light, _ = hbench_run(tmp_path / "res", "--org", "s2", "--budget", "b108", "--rate", "0.5", "--requests", "30",
                    "--seed", "3")
    assert light["validity"]["valid"], light["validity"]
    assert light["validity"]["checks"]["overload"]["status"] == V.PASS
    heavy, run_dir = hbench_run(tmp_path / "res", "--org", "s2", "--budget", "b63", "--rate", "20", "--requests", "60",
                          "--seed", "3")
    assert not heavy["validity"]["valid"]
    assert "overload" in heavy["validity"]["reasons"]
    # independently: the queue at the last arrival is longer than at the middle one
    steps = pd.read_parquet(f"{run_dir}/steps.parquet")
    reqs = pd.read_parquet(f"{run_dir}/requests.parquet")
    arrivals = np.sort(reqs["arrival_s"].to_numpy())

    def queue_at(t):
        return int(steps.loc[steps["start_s"] <= t, "waiting"].iloc[-1])

    assert queue_at(arrivals[-1]) > queue_at(arrivals[len(arrivals) // 2]) + 2
    # the printed table says so too
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path / "res2"), "--org", "s2", "--budget", "b63",
                                   "--rate", "20", "--requests", "60", "--seed", "3"])
    assert res.exit_code == 0 and "NOT VALID: overload" in res.output
    assert ("valid: throughput as the sustained service rate (the queue grew: throughput is what "
            "the organization serves); work and cache counters as the served-state ledger of this "
            "request stream") in res.output
    assert "overload: waiting queue" in res.output and "transient" in res.output


def _invalid(reason="overload"):
    return {"valid": False, "reasons": [reason],
            "checks": {reason: {"status": "fail", "detail": "waiting queue still growing"}}}


def _results(root, bad_seed_org=("s2", 1)):
    rng = np.random.default_rng([3, 3])
    for org, gain in (("s0", 1.0), ("s1", 1.3), ("s2", 1.35)):
        for seed in range(4):
            summary = {METRIC: 300 * gain * (1 + 0.05 * seed) * rng.lognormal(0, 0.01),
                       "ttft_p99_s": 2.0 / gain * (1 + 0.05 * seed) * rng.lognormal(0, 0.01),
                       "delivered_rate_req_s": 3.0,
                       "validity": {"valid": True, "reasons": [], "checks": {}}}
            if (org, seed) == bad_seed_org:
                summary["validity"] = _invalid()
            write_run(root, f"{org}-{seed}", org=org, seed=seed, summary=summary)
    return root


def _analyze_rows(root, *args):
    res = CliRunner().invoke(cli, ["analyze", str(root), "--no-figures", "--json", "--metric", METRIC,
                                   "--metric", "ttft_p99_s", *args])
    assert res.exit_code == 0, res.output
    return {(c["name"].split(" ")[0], c["metric"]): c
            for c in json.loads(res.output[res.output.index("{"):])["contrasts"]}


@pytest.mark.slow
def test_analyze_tests_each_metric_where_its_arms_are_valid_for_it(tmp_path):
    """A run whose queue kept growing (overload) spoils latency, not throughput:
    the latency contrasts with that run leave their Holm family, the
    throughput contrasts stay in theirs."""
    root = _results(tmp_path / "res")
    rows = _analyze_rows(root, "--reference", "s0")
    bad, good = rows[("s2/s0", "ttft_p99_s")], rows[("s1/s0", "ttft_p99_s")]
    assert bad["verdict"] == "arms not valid" and bad["p_holm"] is None
    assert bad["arms_invalid"] == ("latency not valid in 1 of 8 runs (overload: the waiting queue "
                                   "kept growing)")
    # the latency family holds one test now: Holm leaves its p unchanged
    assert good["p_holm"] == pytest.approx(good["p"])
    # throughput is valid under a growing queue: both contrasts are tested
    tput = [rows[("s1/s0", METRIC)], rows[("s2/s0", METRIC)]]
    assert all(r["arms_invalid"] == "" and r["p_holm"] is not None for r in tput)
    assert tput[1]["verdict"] == "significant"
    rows = _analyze_rows(root, "--reference", "s0", "--include-invalid")
    assert rows[("s2/s0", "ttft_p99_s")]["p_holm"] is not None
    assert rows[("s2/s0", "ttft_p99_s")]["verdict"] != "arms not valid"
    # requests that failed spoil every metric, throughput too
    s = json.loads((root / "s2-1" / "summary.json").read_text())
    s["validity"] = _invalid("failures")
    (root / "s2-1" / "summary.json").write_text(json.dumps(s))
    record_files(root / "s2-1")
    rows = _analyze_rows(root, "--reference", "s0")
    assert rows[("s2/s0", METRIC)]["verdict"] == "arms not valid"
    assert "throughput not valid in 1 of 8 runs (failures: requests failed)" == \
        rows[("s2/s0", METRIC)]["arms_invalid"]
    # parity: a different measured load makes the arms unfair even when both are valid
    root2 = _results(tmp_path / "res2", bad_seed_org=("none", -1))
    s = json.loads((root2 / "s1-2" / "summary.json").read_text())
    s["delivered_rate_req_s"] = 2.5
    (root2 / "s1-2" / "summary.json").write_text(json.dumps(s))
    record_files(root2 / "s1-2")
    rows = _analyze_rows(root2, "--reference", "s0")
    assert "measured load differs" in rows[("s1/s0", METRIC)]["arms_invalid"]
    assert rows[("s2/s0", METRIC)]["arms_invalid"] == ""


def test_regress_names_runs_that_are_not_valid(tmp_path):
    base = _results(tmp_path / "base", bad_seed_org=("none", -1))
    cand = _results(tmp_path / "cand")
    res = CliRunner().invoke(cli, ["regress", "--baseline", str(base), "--candidate", str(cand)])
    assert "Runs that are not valid" in res.output
    assert (f"candidate {run_id_of(cand / 's2-1')}: throughput, work and cache counters valid; latency, inter-token "
            "latency NOT VALID: overload") in res.output


KS_PROBE = """
import json, sys
import numpy as np
from harness.validity import ks_exponential_pvalue
gaps = np.random.default_rng([7, 2]).exponential(1 / 3.0, 239)
p = ks_exponential_pvalue(gaps, 3.0)
print(json.dumps({"p": p.hex(), "scipy": "scipy" in sys.modules}))
"""


def _ks_probe(cache) -> dict:
    import os
    import subprocess
    import sys

    root = REPO_ROOT
    env = {**os.environ, "HBENCH_CACHE_DIR": str(cache), "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", KS_PROBE], cwd=root, env=env, check=True,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ks_pvalue_is_scipys_and_a_second_process_reads_it_without_scipy(tmp_path):
    from scipy import stats as sps

    gaps = np.random.default_rng([7, 2]).exponential(1 / 3.0, 239)
    expected = float(sps.kstest(gaps, "expon", args=(0, 1 / 3.0)).pvalue)
    first = _ks_probe(tmp_path)
    assert first == {"p": expected.hex(), "scipy": True}     # computed by scipy, remembered
    second = _ks_probe(tmp_path)
    assert second == {"p": expected.hex(), "scipy": False}   # the same bits, no scipy import


def test_ks_pvalue_cache_entries_are_keyed_by_their_inputs_and_checked(tmp_path, monkeypatch):
    from scipy import stats as sps

    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(V, "_KS_MEMO", {})
    gaps = np.random.default_rng([7, 3]).exponential(1 / 2.0, 120)
    p = V.ks_exponential_pvalue(gaps, 2.0)
    assert p == float(sps.kstest(gaps, "expon", args=(0, 0.5)).pvalue)
    # another rate or one gap changed is another entry, with scipy's own value
    assert V.ks_exponential_pvalue(gaps, 2.5) == float(sps.kstest(gaps, "expon",
                                                                  args=(0, 0.4)).pvalue)
    moved = gaps.copy()
    moved[0] += 1e-9
    assert V.ks_exponential_pvalue(moved, 2.0) == float(sps.kstest(moved, "expon",
                                                                   args=(0, 0.5)).pvalue)
    files = sorted((tmp_path / "ks-expon").iterdir())
    assert len(files) == 3
    # a torn or edited entry is not believed: the value is computed again and rewritten
    key = V._ks_key(gaps, 2.0)
    V._ks_file(key).write_text('{"format": 2, "key": "other", "pvalue": 0.5}')
    monkeypatch.setattr(V, "_KS_MEMO", {})
    assert V.ks_exponential_pvalue(gaps, 2.0) == p
    assert json.loads(V._ks_file(key).read_text())["value"]["pvalue"] == p


@pytest.mark.parametrize("pvalue, redigest", [
    ("1e-300", False), ("NaN", False), ("Infinity", False), ("0.5", False),
    ("2.0", True), ("-0.5", True)])
def test_an_edited_ks_pvalue_is_computed_again_with_one_line(tmp_path, monkeypatch, capsys,
                                                             pvalue, redigest):
    """An edit to a remembered p-value never reaches a verdict: its digest no
    longer matches, or (a digest recomputed by hand) the value is out of
    [0, 1]; an in-range forgery with its digest recomputed is the one edit
    an unkeyed digest cannot see, so it is not among these."""
    from common import cache

    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(V, "_KS_MEMO", {})
    monkeypatch.setattr(cache, "_NOTED", set())
    gaps = np.random.default_rng([7, 3]).exponential(1 / 2.0, 120)
    p = V.ks_exponential_pvalue(gaps, 2.0)
    key = V._ks_key(gaps, 2.0)
    stored = json.loads(V._ks_file(key).read_text())
    text = json.dumps(stored).replace(repr(p), pvalue)
    if redigest:
        value = {**stored["value"], "pvalue": float(pvalue)}
        text = json.dumps({**stored, "value": value,
                           "digest": cache._digest(V._KS_CACHE_KIND, key, 2, value)})
    V._ks_file(key).write_text(text)
    monkeypatch.setattr(V, "_KS_MEMO", {})
    capsys.readouterr()
    assert V.ks_exponential_pvalue(gaps, 2.0) == p
    assert V.ks_exponential_pvalue(gaps, 2.0) == p
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "ignoring cache entry" in lines[0] and "computing it again" in lines[0]


def test_ks_remembered_says_whether_the_test_would_import_scipy(tmp_path, monkeypatch):
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(V, "_KS_MEMO", {})
    arrivals = np.cumsum(np.random.default_rng([7, 4]).exponential(1 / 3.0, 60))
    assert not V.ks_remembered(arrivals, 3.0)
    V.check_process(arrivals, "poisson", 3.0)
    assert V.ks_remembered(arrivals, 3.0)
    monkeypatch.setattr(V, "_KS_MEMO", {})
    assert V.ks_remembered(arrivals, 3.0)            # from the disk cache
    assert not V.ks_remembered(arrivals, 2.0)        # another rate is another test
    assert V.ks_remembered(arrivals[:2], 3.0)        # too few arrivals: no test at all
