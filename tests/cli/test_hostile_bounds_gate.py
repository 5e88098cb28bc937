"""Hostile input, bounded judgement: a regression gate whose baseline has no
value to measure against, bad input next to a real regression, arrival
processes that degenerate (they make a run NOT VALID, never valid), SLO
limits that are not finite and a lengths file with no lengths.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from analysis.capacity import parse_slo
from analysis.gated_metrics import GATES
from analysis.regress import compare
from common.errors import HbenchError
from harness import validity as V
from hbench.cli import cli
from tests.support import REPO_ROOT
from tests.support.cli import invoke, one_error_line
from tests.support.results_factory import readdress, record_files, run_id_of

SMOKE = REPO_ROOT / "results" / "baselines" / "smoke"


def smoke_copy(dest: Path) -> Path:
    shutil.copytree(SMOKE, dest)
    return dest


def edit_summary(root: Path, org: str, seed: int, **changes) -> Path:
    """Set (or, for ``...``, delete) summary keys of the (org, seed) run under ``root``."""
    for manifest in sorted(root.glob("*/manifest.json")):
        cfg = json.loads(manifest.read_text())["config"]
        if (cfg["org"], cfg["seed"]) == (org, seed):
            path = manifest.parent / "summary.json"
            summary = json.loads(path.read_text())
            for k, v in changes.items():
                if v is ...:
                    summary.pop(k)
                elif callable(v):
                    summary[k] = v(summary[k])
                else:
                    summary[k] = v
            path.write_text(json.dumps(summary))
            return record_files(manifest.parent)
    raise AssertionError(f"no {org} seed {seed} run")


def regress(base, cand, *extra):
    return CliRunner().invoke(cli, ["regress", "--baseline", str(base), "--candidate", str(cand), *extra])


# ------------------------------------------------------ baseline values

BAD_BASELINE = [
    ("throughput_ledger_tok_s", None, "is null"),
    ("throughput_ledger_tok_s", 0, "is 0, impossible"),
    ("throughput_ledger_tok_s", 0.0, "is 0.0, impossible"),
    ("throughput_ledger_tok_s", -5.0, "is -5.0, impossible"),
    ("throughput_ledger_tok_s", "fast", "'fast', not a finite number"),
    ("throughput_ledger_tok_s", True, "True, not a finite number"),
    ("throughput_ledger_tok_s", [600.0], "[600.0], not a finite number"),
    ("throughput_ledger_tok_s", {"v": 1}, "not a finite number"),
    ("throughput_ledger_tok_s", ..., "is missing"),
    ("throughput_span_tok_s", 0, "is 0, impossible"),
    ("ttft_p99_s", 0, "is 0, impossible"),
    ("ttft_p99_s", "1e400", "not a finite number"),
    ("itl_p99_s", 0.0, "is 0.0, impossible"),
    ("e2e_p99_s", ..., "is missing"),
    ("peak_mem_total_bytes", 0, "is 0, impossible"),
    ("peak_mem_total_bytes", "20 GB", "not a finite number"),
]


@pytest.mark.parametrize("metric, value, needle", BAD_BASELINE,
                         ids=[f"{m}={v!r}" for m, v, _ in BAD_BASELINE])
def test_a_baseline_value_that_cannot_be_gated_is_bad_input(tmp_path, metric, value, needle):
    """Before, any candidate value passed such a cell's metric as "n/a"; the
    candidate here is 100x worse on that metric and must not pass."""
    base = smoke_copy(tmp_path / "base")
    cand = smoke_copy(tmp_path / "cand")
    run = edit_summary(base, "s2", 1, **{metric: value})
    worse = (lambda v: v / 100) if GATES[metric].better == "higher" else (lambda v: v * 100)
    edit_summary(cand, "s2", 1, **{metric: worse})
    report = tmp_path / "report.md"
    line = one_error_line(regress(base, cand, "--report", report), needle)
    assert f"baseline {run.name}: {metric}" in line and "--allow-missing" in line
    assert not report.exists()


def test_allow_missing_lists_the_baseline_gap_and_gates_the_rest(tmp_path):
    base = smoke_copy(tmp_path / "base")
    cand = smoke_copy(tmp_path / "cand")
    run = edit_summary(base, "s2", 1, ttft_p99_s=None)
    res = regress(base, cand, "--allow-missing")
    assert res.exit_code == 0, res.output
    assert "Baseline values that cannot be gated" in res.output
    assert f"- baseline {run.name}: ttft_p99_s is null" in res.output
    # the same cell's other metrics are still gated
    edit_summary(cand, "s2", 1, e2e_p99_s=lambda v: v * 2)
    res = regress(base, cand, "--allow-missing")
    assert res.exit_code == 1 and "e2e_p99_s" in res.output.split("### Regressions")[1]


def test_a_metric_neither_side_reports_is_not_a_problem(tmp_path):
    base = smoke_copy(tmp_path / "base")
    cand = smoke_copy(tmp_path / "cand")
    edit_summary(base, "s0", 2, peak_mem_total_bytes=None)
    edit_summary(cand, "s0", 2, peak_mem_total_bytes=...)
    res = regress(base, cand)
    assert res.exit_code == 0, res.output
    assert "cannot be gated" not in res.output


def test_a_null_baseline_with_a_candidate_value_is_still_bad_input(tmp_path):
    base = smoke_copy(tmp_path / "base")
    edit_summary(base, "s0", 2, peak_mem_total_bytes=None)
    one_error_line(regress(base, SMOKE), "peak_mem_total_bytes is null")


def test_many_baseline_gaps_are_counted_in_one_line(tmp_path):
    base = smoke_copy(tmp_path / "base")
    for org in ("s0", "s1", "s2", "d0"):
        edit_summary(base, org, 1, throughput_ledger_tok_s=0, ttft_p99_s=None)
    line = one_error_line(regress(base, SMOKE), "8 problems in the input")
    assert "and 5 more" in line


# --------------------------------------- regressions next to bad input

def test_a_regression_next_to_a_hash_mismatch_is_named_and_bad_input_wins(tmp_path):
    cand = smoke_copy(tmp_path / "cand")
    edit_summary(cand, "d0", 1, throughput_ledger_tok_s=lambda v: v / 2)
    readdress(edit_summary(cand, "s0", 2), workload_hash="f" * 64)
    report = tmp_path / "r.md"
    line = one_error_line(regress(SMOKE, cand, "--report", report), "workload hash")
    assert "1 problem in the input" in line
    assert "Regressions found as well" in line and "org=d0" in line and "throughput_ledger_tok_s" in line
    assert "worse by 50.00%" in line and not report.exists()


def test_a_regression_next_to_a_baseline_gap_is_named(tmp_path):
    base = smoke_copy(tmp_path / "base")
    cand = smoke_copy(tmp_path / "cand")
    edit_summary(base, "s1", 1, itl_p99_s="n/a")
    edit_summary(cand, "s2", 2, ttft_p99_s=lambda v: v * 3)
    line = one_error_line(regress(base, cand), "itl_p99_s is 'n/a'")
    assert "Regressions found as well" in line and "org=s2" in line and "ttft_p99_s" in line


def test_bad_input_alone_names_no_regression(tmp_path):
    base = smoke_copy(tmp_path / "base")
    edit_summary(base, "s1", 1, itl_p99_s=0)
    assert "Regressions found as well" not in one_error_line(regress(base, SMOKE), "itl_p99_s is 0")


def test_every_pair_unpairable_is_bad_input_not_no_matching_cells(tmp_path):
    cand = smoke_copy(tmp_path / "cand")
    for manifest in list(cand.glob("*/manifest.json")):
        readdress(manifest.parent, workload_hash="0" * 64)
    one_error_line(regress(SMOKE, cand), "8 problems in the input")


# ------------------------------------------------------- noisy engines

BASE = {"throughput_ledger_tok_s": 400.0, "throughput_span_tok_s": 410.0, "ttft_p99_s": 2.0,
        "itl_p99_s": 0.05, "e2e_p99_s": 30.0, "peak_mem_total_bytes": 3e10}


def _noisy(root, edit=None):
    from tests.support.results_factory import write_run

    rng = np.random.default_rng([9, len(root.name)])
    for seed in range(4):
        summary = {k: v * (1 + 0.1 * seed) * rng.lognormal(0, 0.005) for k, v in BASE.items()}
        if edit and seed == 1:
            summary.update(edit)
        write_run(root, f"s2-{seed}", org="s2", seed=seed, engine="vllm", endpoint="http://h:8000",
                  summary=summary)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("value", [None, 0, "x"])
def test_noisy_engine_baseline_gap_is_bad_input_unless_allowed(tmp_path, value):
    base = _noisy(tmp_path / "b", {"ttft_p99_s": value})
    cand = _noisy(tmp_path / "c")
    one_error_line(regress(base, cand), f"baseline {run_id_of(base / 's2-1')}: ttft_p99_s")
    res = regress(base, cand, "--allow-missing")
    assert res.exit_code == 0, res.output
    r = compare(base, cand, allow_missing=True)
    (gap,) = r.baseline_gaps
    assert gap.startswith(f"baseline {run_id_of(base / 's2-1')}: ttft_p99_s is ")
    assert {f.n for f in r.findings if f.metric == "ttft_p99_s"} == {3}   # the other seeds still tested


def test_compare_raises_for_a_baseline_gap(tmp_path):
    """The library call is as strict as the command."""
    base = smoke_copy(tmp_path / "base")
    edit_summary(base, "d0", 2, e2e_p99_s=0)
    with pytest.raises(HbenchError, match="1 problem in the input"):
        compare(base, SMOKE)


# ------------------------------------------------- degenerate arrivals

def _run_json(tmp_path, *args):
    out = tmp_path / "res"
    res = CliRunner().invoke(cli, ["run", "--out", str(out), "--json", *args])
    assert res.exit_code == 0, res.output
    assert "Warning" not in res.output and "RuntimeWarning" not in res.output
    return json.loads(res.output)


@pytest.mark.parametrize("args, needle", [
    (["--rate", "1e-300", "--requests", "20"], "float64 resolves only"),
    (["--rate", "1e-12", "--requests", "20"], "float64 resolves only"),
    (["--arrival", "gamma", "--burstiness", "1e300", "--requests", "20"], "every measured arrival at t = 0"),
    (["--requests", "10"], "10 measured requests, fewer than the 11"),
    (["--requests", "10", "--warmup", "3"], "10 measured requests"),
    (["--requests", "1"], "1 measured requests"),
], ids=["rate 1e-300", "rate 1e-12", "gamma burstiness 1e300", "10 requests", "10 measured after warm-up",
        "one request"])
def test_a_degenerate_arrival_process_makes_the_run_not_valid(tmp_path, args, needle):
    doc = _run_json(tmp_path, *args)
    v = doc["validity"]
    assert v["valid"] is False and "arrival_rate" in v["reasons"], v
    assert needle in v["checks"]["arrival_rate"]["detail"]
    assert v["checks"]["arrival_rate"]["status"] == V.FAIL


def test_a_run_of_the_stated_minimum_is_valid(tmp_path):
    v = _run_json(tmp_path, "--requests", "11", "--rate", "3", "--seed", "2")["validity"]
    assert v["checks"]["arrival_rate"]["status"] == V.PASS


def test_the_table_says_not_valid(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--rate", "1e-300", "--requests", "20"])
    assert res.exit_code == 0 and "NOT VALID: arrival_rate" in res.output


@pytest.mark.parametrize("arrivals, needle", [
    ([5.0] * 40, "every measured arrival at t = 5"),
    (list(np.arange(40) * 1e290), "float64 resolves only"),
    (list(np.arange(10) / 3.0), "fewer than the 11"),
    ([], "0 measured requests"),
])
def test_degenerate_arrivals_fail_the_rate_check(arrivals, needle):
    c = V.check_rate(arrivals, 3.0)
    assert c["status"] == V.FAIL and needle in c["detail"]


def test_the_overload_check_skips_an_unmeasurable_window_quietly():
    t = np.arange(40) * 1e290
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = V.check_overload(t, np.arange(40.0), t)
    assert c["status"] == V.NA


def test_the_resolution_limit_sits_where_float64_spacing_passes_one_microsecond():
    ok = np.linspace(0, 4e9, 200)        # spacing(4e9) = 4.8e-7 s
    assert V.degenerate_arrivals(ok) is None
    assert "resolves only" in V.degenerate_arrivals(np.linspace(0, 1e10, 200))   # 1.9e-6 s


@pytest.mark.parametrize("run_dir", sorted(p.parent.name for p in SMOKE.glob("*/summary.json")))
def test_the_smoke_baselines_runs_still_pass_the_arrival_checks(run_dir):
    """Valid runs stay valid: each committed baseline run's measured arrivals
    are no degenerate window and pass the rate and process checks."""
    cfg = json.loads((SMOKE / run_dir / "manifest.json").read_text())["config"]
    req = pd.read_parquet(SMOKE / run_dir / "requests.parquet")
    arrivals = req.loc[~req["warmup"].astype(bool), "arrival_s"].tolist()
    assert V.degenerate_arrivals(arrivals) is None
    assert V.check_rate(arrivals, cfg["rate"])["status"] == V.PASS
    assert V.check_process(arrivals, cfg["arrival"], cfg["rate"])["status"] == V.PASS


# ------------------------------------------------------ SLO and lengths

@pytest.mark.parametrize("slo", ["ttft_p99<=1e400s", "tpot_p99<=1e999ms", "e2e_p99<=2e308s",
                                 "ttft_p99<=2s,itl_p99<=1e309ms", "ttft_p99<=1e-400s"])
def test_capacity_refuses_an_slo_limit_that_is_not_finite(tmp_path, slo):
    out = tmp_path / "cap"
    one_error_line(invoke("capacity", "--slo", slo, "--out", out), "finite number")
    assert not out.exists()


def test_a_finite_slo_still_parses():
    (lim,) = parse_slo("ttft_p99<=1e3ms")
    assert math.isclose(lim.seconds, 1.0)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "[]", "  \t\n# a\n   # b\n"],
                         ids=["empty", "blank lines", "comment", "empty JSON list", "whitespace and comments"])
def test_ledger_refuses_a_lengths_file_with_no_lengths(tmp_path, text):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text(text)
    one_error_line(invoke("ledger", "--lengths-from", lengths), "no request lengths")


# ------------------------------------------- what a user watches, gated

@pytest.mark.slow
@pytest.mark.parametrize("metric, worse", [
    ("tpot_p99_s", lambda v: v * 3), ("ttft_p50_s", lambda v: v * 3),
    ("finished", lambda v: v // 2), ("reused_tokens", lambda v: 0),
    ("failed", lambda v: v + 3), ("cancelled", lambda v: v + 1), ("preemptions", lambda v: v + 5),
    ("peak_mem_ssm_bytes", lambda v: v * 1.5), ("e2e_p50_s", lambda v: v * 1.2),
])
def test_a_regression_a_user_would_see_fails_the_gate_naming_it(tmp_path, metric, worse):
    """Metrics the gate used to pass over (six were gated): one cell made worse
    exits 1, and the report names that cell and that metric."""
    cand = smoke_copy(tmp_path / "cand")
    edit_summary(cand, "s2", 1, **{metric: worse})
    res = regress(SMOKE, cand)
    assert res.exit_code == 1, res.output
    regressions = res.output.split("### Regressions")[1].split("###")[0]
    rows = [ln for ln in regressions.splitlines() if ln.startswith("| org=")]
    assert len(rows) == 1 and "org=s2" in rows[0] and "seed=1" in rows[0] and f"| {metric} |" in rows[0]


# ------------------------------------------- numbers at a float's edge, output nowhere

@pytest.mark.slow
def test_throughputs_a_float_apart_give_an_analysis_not_a_traceback(tmp_path):
    """1e308 over 1e-300 overflows a ratio, and a log-scale interval of ratios
    near 1e308 overflows math.exp: the pairs are named not comparable, the
    bounds written as unbounded (null in JSON), and every output written."""
    from tests.support.results_factory import write_run

    for org in ("s2", "d0"):
        for seed in (1, 2, 3):
            write_run(tmp_path / "runs", f"{org}-{seed}", org=org, seed=seed,
                      summary={"throughput_ledger_tok_s": 1e308 / seed if org == "d0" else 1.0,
                               "throughput_span_tok_s": 1e308 if org == "d0" else 1e-300 * seed})
    for args in (["analyze", tmp_path / "runs", "--out", tmp_path / "a"],
                 ["analyze", tmp_path / "runs", "--no-figures", "--json", "--out", tmp_path / "b"],
                 ["report", tmp_path / "runs", "-o", tmp_path / "r.html"]):
        res = invoke(*args)
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    json.loads((tmp_path / "a" / "contrasts.json").read_text())   # valid JSON: no Infinity


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["budget", "b83"], ["hardware"],
                                  ["regress", "--baseline", SMOKE, "--candidate", SMOKE]])
def test_output_to_a_full_device_is_one_error_line(args):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "hbench.cli", *map(str, args)], cwd=REPO_ROOT,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["Error: cannot write the output: No space left on device"]


@pytest.mark.parametrize("args, blocked", [
    (["sweep", "--org", "s2", "--requests", "4", "--seeds", "1", "--out", "{o}"], "sweep.json"),
    (["analyze", SMOKE, "--no-figures", "--out", "{o}"], "report.md"),
])
def test_an_output_file_that_is_a_directory_is_one_error_line(tmp_path, args, blocked):
    """A rename cannot replace a directory: the command says so in one line
    (it used to end in a traceback) and leaves the directory as it was."""
    (tmp_path / "o" / blocked).mkdir(parents=True)
    res = invoke(*[str(a).replace("{o}", str(tmp_path / "o")) for a in args])
    one_error_line(res, f"cannot write {tmp_path / 'o' / blocked}: it is a directory",
                   other_lines=True)
    assert (tmp_path / "o" / blocked).is_dir() and not list((tmp_path / "o").glob(".tmp-*"))
