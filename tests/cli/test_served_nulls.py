"""A served run stores what its client cannot see as null, and every reader
takes it: analyze, report, explain, regress and reuse over the results of
`hbench run --engine vllm --endpoint` against a scripted server (no vLLM)."""

from __future__ import annotations

import json
import math

import pytest

from harness.model_configs import PRESETS
from harness.results import list_runs, read_run
from tests.support.cli import hbench_run, invoke, one_error_line
from tests.support.scripted_server import Script, ScriptedServer

#: per-request counters a served engine's client cannot see
UNSEEN = ("recomputed_tokens", "preemptions", "r_max", "attn_depth")
SMALL = ("--requests", "3", "--rate", "20", "--mean-input", "200", "--max-model-len", "1024",
         "--max-output", "4")


@pytest.fixture(scope="module")
def served_root(tmp_path_factory):
    """Two seeds of stock vLLM served by the scripted server (4 cached tokens a request)."""
    root = tmp_path_factory.mktemp("served")
    config = root / "config.json"
    config.write_text(json.dumps(PRESETS["falcon-h1-7b"]))
    with ScriptedServer(Script(first_delay_s=0.01, interval_s=0.005)) as srv:
        for seed in (1, 2):
            hbench_run(root / "runs", "--engine", "vllm", "--org", "s0", "--endpoint",
                       srv.endpoint.url, "--model", "tiny", "--config", config, "--seed", seed,
                       *SMALL)
    return root / "runs"


@pytest.mark.slow
def test_a_served_runs_unseen_counters_are_null_in_its_table_and_summary(served_root):
    for run_dir in list_runs(served_root):
        run = read_run(run_dir)
        requests, summary = run["requests"], run["summary"]
        for name in UNSEEN:
            assert requests[name].isna().all(), name
        assert (requests["reused_tokens"] == 4).all()       # what the server said it reused
        assert (requests["j_adopt"] == 4).all()
        for key in ("recomputed_tokens", "r_max_mean", "attn_depth_mean", "preemptions"):
            assert summary[key] is None, key                 # not observed, not 0
        assert summary["reused_tokens"] == 12


@pytest.mark.slow
def test_analysis_reads_a_served_runs_nulls(served_root, tmp_path):
    analyze = invoke("analyze", served_root, "--out", tmp_path / "analysis")
    assert analyze.exit_code == 0, analyze.output
    report = invoke("report", served_root, "-o", tmp_path / "report.html")
    assert report.exit_code == 0, report.output
    assert (tmp_path / "report.html").stat().st_size > 0
    regress = invoke("regress", "--baseline", served_root, "--candidate", served_root)
    assert regress.exit_code == 0, regress.output
    reuse = invoke("reuse", served_root, "--per-run", "--json")
    assert reuse.exit_code == 0, reuse.output
    rows = json.loads(reuse.output)
    assert [row["token_hit_rate"] for row in rows] == [pytest.approx(4 / 7)] * 2
    # explain needs the simulator's grid: a served run is refused in one line
    one_error_line(invoke("explain", list_runs(served_root)[0]), "checkpoint grid")


@pytest.mark.slow
def test_a_simulated_run_keeps_its_counts(tmp_path):
    _, run_dir = hbench_run(tmp_path, "--org", "s1", "--budget", "b83", "--requests", "8",
                            "--rate", "4", "--seed", "3")
    run = read_run(run_dir)
    for name in (*UNSEEN, "reused_tokens", "initial_input_tokens", "j_adopt"):
        assert run["requests"][name].notna().all(), name
        assert str(run["requests"][name].dtype) == "int64", name
    for key in ("recomputed_tokens", "r_max_mean", "attn_depth_mean", "preemptions",
                "reused_tokens"):
        value = run["summary"][key]
        assert value is not None and not math.isnan(value), key
