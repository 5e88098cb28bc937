"""``hbench analyze`` end to end on synthetic run directories."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from analysis.default_metrics import DEFAULT_METRICS
from hbench.cli import cli
from tests.support.cli import hbench_run, invoke, one_error_line
from tests.support.results_factory import write_design, write_run

METRIC = "throughput_ledger_tok_s"


def _results(root):
    jitter = np.random.default_rng([5, 0]).lognormal(0, 0.01, (3, 4))
    for i, (org, gain) in enumerate((("s0", 1.0), ("s1", 1.3), ("s2", 1.35))):
        for seed in range(4):
            write_run(root, f"{org}-{seed}", org=org, seed=seed, tables=(seed == 0),
                      summary={METRIC: 300 * gain * (1 + 0.05 * seed) * jitter[i, seed], "ttft_p99_s": 2.0})
    write_run(root, "crashed", status="running", org="s0", seed=9)
    return root


@pytest.mark.slow
def test_analyze_writes_tables_report_and_figures(tmp_path):
    root = _results(tmp_path / "res")
    res = CliRunner().invoke(cli, ["analyze", str(root)])
    assert res.exit_code == 0, res.output
    assert "skipping" in res.output and "status 'running'" in res.output
    out = root / "analysis"
    doc = json.loads((out / "contrasts.json").read_text())
    assert doc["schema_version"] == 1
    # every pair of organizations, on throughput and latency
    assert sorted((c["name"].split(" ")[0], c["metric"]) for c in doc["contrasts"]) == sorted(
        (pair, m) for pair in ("s1/s0", "s2/s0", "s2/s1") for m in DEFAULT_METRICS)
    assert [c["significant"] for c in doc["contrasts"] if c["metric"] == METRIC] == [True] * 3
    assert (out / "contrasts.csv").read_text().startswith("family,name,metric")
    report = (out / "report.md").read_text()
    assert "## Contrasts" in report and "s1/s0" in report and "latency_cdf" in report
    # both reports say whose runs they are (RunConfig's defaults here)
    served = "engine sim, falcon-h1-7b on a100-pcie-40gb"
    assert f"Runs: {served}." in report
    assert f"<h1>hbench report: {root} ({served})</h1>" in (out / "report.html").read_text()
    assert (out / "figures" / "latency_cdf.png").stat().st_size > 0
    assert len(list((out / "figures").glob("memory_*.svg"))) == 1


@pytest.mark.slow
def test_analyze_json_no_figures_and_out(tmp_path):
    root = _results(tmp_path / "res")
    res = CliRunner().invoke(cli, ["analyze", str(root), "--json", "--no-figures", "--out", str(tmp_path / "o"),
                                   "--metric", METRIC, "--metric", "ttft_p99_s"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {c["family"] for c in doc["contrasts"]} == {METRIC, "ttft_p99_s"}
    ttft = [c for c in doc["contrasts"] if c["family"] == "ttft_p99_s"]
    assert all(c["verdict"] == "not significant" and c["p"] == 1.0 for c in ttft)
    assert not (tmp_path / "o" / "figures").exists() and (tmp_path / "o" / "report.md").exists()


@pytest.mark.slow
def test_analyze_with_design_file(tmp_path):
    root = _results(tmp_path / "res")
    design = write_design(tmp_path / "d.toml", """
[[contrast]]
name = "S2/S1"
family = "Q1"
numerator = {org = "s2"}
denominator = {org = "s1"}
""")
    res = CliRunner().invoke(cli, ["analyze", str(root), "--design", str(design), "--no-figures", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["contrasts"]
    assert row["name"] == "S2/S1" and abs(row["effect_pct"] - 100 * (1.35 / 1.3 - 1)) < 2


def test_analyze_errors_are_one_line(tmp_path):
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1].startswith("Error: no results directory")
    root = tmp_path / "res"
    write_run(root, "a", org="s1", seed=0)
    write_run(root, "b", org="s0", seed=0, workload="different")
    res = CliRunner().invoke(cli, ["analyze", str(root), "--no-figures"])
    assert res.exit_code == 2 and "workload hash differs" in res.output


@pytest.mark.slow
def test_analyze_after_a_repeated_run_answers_and_names_the_run_it_set_aside(tmp_path):
    """`hbench run` twice with one configuration (as `make run` twice) then
    `hbench analyze`: one observation per configuration and seed, the newest."""
    out = tmp_path / "res"
    args = ("--budget", "b83", "--rate", "2", "--requests", "20", "--seed", "1")
    older = hbench_run(out, "--org", "s2", *args)[1]
    newer = hbench_run(out, "--org", "s2", *args)[1]
    hbench_run(out, "--org", "d0", *args)
    res = invoke("analyze", out, "--json", "--no-figures")
    assert res.exit_code == 0, res.output
    warning = next(ln for ln in res.output.splitlines() if "repeat a configuration" in ln)
    assert f"kept the newest ({newer})" in warning and f"set aside {older}" in warning
    doc = json.loads(res.output[res.output.index("{"):])
    assert {c["name"].split(" ")[0] for c in doc["contrasts"]} == {"d0/s2"}, doc["contrasts"]


@pytest.mark.slow
def test_analyze_reference_compares_every_organization_with_it(tmp_path):
    root = _results(tmp_path / "res")
    res = invoke("analyze", root, "--json", "--no-figures", "--metric", METRIC, "--reference", "S1")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output[res.output.index("{"):])
    assert sorted(c["name"] for c in doc["contrasts"]) == ["s0/s1", "s2/s1"]
    res = invoke("analyze", root, "--no-figures", "--reference", "d0")
    one_error_line(res, "--reference d0: no run of d0 under the results",
                   "(organizations there: s0, s1, s2)", other_lines=True)
