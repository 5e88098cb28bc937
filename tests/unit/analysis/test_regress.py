"""``hbench regress`` through the CLI: cell-by-cell gating for the
deterministic simulator (on a copy of the committed smoke baseline), paired
seed groups for noisy engines, invalid and missing cells, and exit codes
0 (no regression) / 1 (regression) / 2 (bad input)."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from analysis import stats
from analysis.gated_metrics import GATES
from analysis.regress import compare
from hbench.cli import cli
from tests.support import REPO_ROOT
from tests.support.results_factory import record_files, write_run

SMOKE = REPO_ROOT / "results" / "baselines" / "smoke"


def _invoke(*args):
    return CliRunner().invoke(cli, ["regress", *map(str, args)])


def _smoke_copy(dest: Path) -> Path:
    shutil.copytree(SMOKE, dest)
    return dest


def _edit(root: Path, org: str, seed: int | None = None, **changes) -> list[Path]:
    """Rewrite the summary of every run of ``org`` (and ``seed``) under ``root``:
    a callable value maps the old value, anything else replaces it."""
    edited = []
    for manifest in sorted(root.glob("*/manifest.json")):
        config = json.loads(manifest.read_text())["config"]
        if config["org"] != org or (seed is not None and config["seed"] != seed):
            continue
        path = manifest.parent / "summary.json"
        summary = json.loads(path.read_text())
        for key, value in changes.items():
            summary[key] = value(summary[key]) if callable(value) else value
        path.write_text(json.dumps(summary))
        edited.append(record_files(manifest.parent))
    assert edited, f"no {org} run to edit"
    return edited


def _error_line(res) -> str:
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert lines[0].startswith("Error: ")
    return lines[0]


# ------------------------------------------------ deterministic (simulator) cells

def test_identical_smoke_trees_exit_zero_and_report_both_sides(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    report = tmp_path / "out" / "report.md"
    res = _invoke("--baseline", SMOKE, "--candidate", cand, "--report", report)
    assert res.exit_code == 0, res.output
    text = report.read_text()
    assert text.startswith("## hbench regress: no regression")
    assert "each of the 8 matched cells is compared on its own" in text
    manifest = json.loads(next(SMOKE.glob("*/manifest.json")).read_text())
    assert text.count(manifest["engine_version"]) == 2 and text.count(manifest["git_commit"]) == 2


def test_d0_only_throughput_halving_is_a_regression_naming_the_d0_cells(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    _edit(cand, "d0", throughput_ledger_tok_s=lambda v: v / 2)
    res = _invoke("--baseline", SMOKE, "--candidate", cand)
    assert res.exit_code == 1, res.output
    regressions = res.output.split("### Regressions")[1].split("<details>")[0]
    rows = [line for line in regressions.splitlines() if line.startswith("| org=")]
    assert [r.split(" | ")[0] for r in rows] == ["| org=d0, budget=b83, seed=1", "| org=d0, budget=b83, seed=2"]
    assert all("throughput_ledger_tok_s" in r and "-50.00%" in r and "worse by 50.00%" in r for r in rows)


@pytest.mark.parametrize("value", [0, None, -3.0, "fast", [1.0]])
def test_zero_null_or_non_numeric_throughput_in_one_cell_is_a_regression(tmp_path, value):
    cand = _smoke_copy(tmp_path / "cand")
    _edit(cand, "s1", seed=2, throughput_span_tok_s=value)
    res = _invoke("--baseline", SMOKE, "--candidate", cand)
    assert res.exit_code == 1, res.output
    (finding,) = compare(SMOKE, cand).regressions
    assert (finding.where["org"], finding.where["seed"], finding.metric) == ("s1", 2, "throughput_span_tok_s")
    assert finding.candidate is None and "is not a positive number" in finding.reason


def test_missing_cell_is_a_regression_unless_allowed(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    (s0_run,) = _edit(cand, "s0", seed=1)  # find its directory
    shutil.rmtree(s0_run)
    res = _invoke("--baseline", SMOKE, "--candidate", cand)
    assert res.exit_code == 1, res.output
    assert "Missing cells (regressions)" in res.output and "- org=s0, budget=b83, seed=1" in res.output
    res = _invoke("--baseline", SMOKE, "--candidate", cand, "--allow-missing")
    assert res.exit_code == 0, res.output
    assert "Missing cells (allowed by --allow-missing)" in res.output


def test_tolerance_is_per_cell_and_direction_aware(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    _edit(cand, "s2", seed=1, ttft_p99_s=lambda v: v * 1.01)  # 1% slower, one cell
    assert _invoke("--baseline", SMOKE, "--candidate", cand).exit_code == 0
    assert _invoke("--baseline", SMOKE, "--candidate", cand, "--min-effect", "0.005").exit_code == 1
    better = _smoke_copy(tmp_path / "better")
    _edit(better, "d0", throughput_ledger_tok_s=lambda v: v * 1.5, e2e_p99_s=lambda v: v / 2)
    assert _invoke("--baseline", SMOKE, "--candidate", better, "--min-effect", "0").exit_code == 0


def test_summary_keys_that_are_not_gated_are_tolerated(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    for org in ("s0", "s1", "s2", "d0"):
        _edit(cand, org, unknown_key=None, running_median=999.0, slab_occupancy_mean="n/a",
              requests=1, initial_input_tokens=5, delivered_rate_req_s=0.1)
    assert _invoke("--baseline", SMOKE, "--candidate", cand).exit_code == 0


def test_every_summary_key_is_gated_or_said_to_have_no_direction():
    """A metric added to the summary must be placed: gated with a direction and
    a rule, or named as having none, with why."""
    from analysis.gated_metrics import RULES, UNGATED
    from harness import metrics

    keys = {*metrics.SUMMARY_KEYS, *metrics.TURN_SUMMARY_KEYS, *metrics.SERVED_SUMMARY_KEYS,
            *metrics.REGION_SUMMARY_KEYS, *metrics.POLICY_SUMMARY_KEYS, *metrics.SGLANG_SUMMARY_KEYS}
    assert keys == set(GATES) | set(UNGATED) and not set(GATES) & set(UNGATED)
    assert all(g.better in ("higher", "lower") and g.rule in RULES for g in GATES.values())


def _worse_by(gate, fraction):
    """A value ``fraction`` worse than ``v`` by ``gate``'s rule (one unit from 0)."""
    def worse(v):
        if v == 0:
            return 1 if gate.better == "lower" else v
        return v * (1 - fraction) if gate.better == "higher" else v * (1 + fraction)
    return worse


SMOKE_GATED = sorted(m for m in GATES
                     if json.loads(next(SMOKE.glob("*/summary.json")).read_text()).get(m) is not None)


@pytest.mark.slow
@pytest.mark.parametrize("metric", SMOKE_GATED)
def test_a_ten_percent_regression_of_one_cell_is_caught_in_every_gated_metric(tmp_path, metric):
    """Each gated metric the smoke runs report, 10 % worse in one cell (from a
    baseline of 0: one unit worse), fails the gate naming that cell and metric;
    the other cells and metrics pass."""
    gate = GATES[metric]
    cand = _smoke_copy(tmp_path / "cand")
    seed1 = {}
    for m in sorted(SMOKE.glob("*/manifest.json")):
        config = json.loads(m.read_text())["config"]
        if config["seed"] == 1:
            seed1[config["org"]] = json.loads((m.parent / "summary.json").read_text())[metric]
    # a higher-is-better count cannot get worse from 0: take a cell where it is above
    org = next(o for o in ("s2", "s1", "s0", "d0") if gate.better == "lower" or seed1[o] > 0)
    _edit(cand, org, seed=1, **{metric: _worse_by(gate, 0.10)})
    r = compare(SMOKE, cand)
    assert [(f.where["org"], f.where["seed"], f.metric) for f in r.regressions] == [(org, 1, metric)]


def _every_metric_root(root: Path, worse: str | None = None) -> Path:
    """Simulator runs of s2 and d0 (seeds 1, 2) whose summaries hold every gated
    metric, at 2.0; with ``worse``, that metric 10 % worse in d0's seed-1 cell."""
    for org in ("s2", "d0"):
        for seed in (1, 2):
            summary = dict.fromkeys(GATES, 2.0)
            if worse and (org, seed) == ("d0", 1):
                summary[worse] = _worse_by(GATES[worse], 0.10)(2.0)
            write_run(root, f"{org}-{seed}", org=org, seed=seed, summary=summary)
    return root


@pytest.mark.slow
def test_a_ten_percent_regression_of_one_cell_is_caught_in_every_gated_metric_of_any_engine(tmp_path):
    """The metrics the smoke runs do not report (a served run's, SGLang's, the
    multi-turn and u0/e0 ones) too: each, 10 % worse in one cell, is the one
    regression found."""
    base = _every_metric_root(tmp_path / "base")
    assert compare(base, _every_metric_root(tmp_path / "same")).regressions == ()
    for metric in sorted(GATES):
        r = compare(base, _every_metric_root(tmp_path / metric, worse=metric))
        assert [(f.where["org"], f.where["seed"], f.metric) for f in r.regressions] == [
            ("d0", 1, metric)], metric


def test_the_report_says_which_metrics_it_gated_and_by_which_rule(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    report = tmp_path / "r.md"
    assert _invoke("--baseline", SMOKE, "--candidate", cand, "--report", report).exit_code == 0
    text = report.read_text()
    assert f"Gated: {len(SMOKE_GATED)} metrics" in text
    for metric in SMOKE_GATED:
        assert f"`{metric}`" in text
    assert "lower is better, count rule" in text and "higher is better, relative rule" in text


# ------------------------------------------------------------------ bad input

def test_empty_list_summary_exits_two(tmp_path):
    cand = _smoke_copy(tmp_path / "cand")
    (run,) = _edit(cand, "d0", seed=1)
    (run / "summary.json").write_text("[]")
    record_files(run)
    res = _invoke("--baseline", SMOKE, "--candidate", cand)
    assert res.exit_code == 2
    assert "JSON list, not an object" in _error_line(res)


@pytest.mark.slow
@pytest.mark.parametrize("breakage, message", [
    (lambda root: (next(root.glob("*/summary.json"))).write_text("{oops"), "summary.json has 5 bytes"),
    (lambda root: (next(root.glob("*/summary.json"))).unlink(), "summary.json is missing"),
    (lambda root: (next(root.glob("*/manifest.json"))).write_text("3"), "not an object"),
    (lambda root: [shutil.rmtree(p) for p in root.iterdir() if p.is_dir()], "no run directories"),
    (lambda root: shutil.rmtree(root), "no results directory"),
])
def test_unreadable_candidate_exits_two_with_one_line(tmp_path, breakage, message):
    cand = _smoke_copy(tmp_path / "cand")
    breakage(cand)
    res = _invoke("--baseline", SMOKE, "--candidate", cand)
    assert res.exit_code == 2
    assert message in _error_line(res)


def test_unwritable_report_exits_two_before_comparing(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    # The candidate does not exist: a check that ran after reading would name it.
    for report in (blocker / "report.md", tmp_path):
        res = _invoke("--baseline", SMOKE, "--candidate", tmp_path / "absent", "--report", report)
        assert res.exit_code == 2
        assert "--report" in _error_line(res)


@pytest.mark.parametrize("option, value", [
    ("--alpha", "0"), ("--alpha", "1.5"), ("--alpha", "nan"),
    ("--min-effect", "-0.01"), ("--min-effect", "inf"), ("--min-effect", "nan")])
def test_bad_thresholds_exit_two_before_reading(tmp_path, option, value):
    res = _invoke("--baseline", tmp_path / "absent", "--candidate", tmp_path / "absent", option, value)
    assert res.exit_code == 2
    assert option in _error_line(res)


def test_runs_of_another_request_stream_are_refused(tmp_path):
    b = write_run(tmp_path / "b", "x", org="s2", seed=0).parent
    c = write_run(tmp_path / "c", "x", org="s2", seed=0, workload="changed").parent
    res = _invoke("--baseline", b, "--candidate", c)
    assert res.exit_code == 2
    assert "workload hash differs" in _error_line(res)
    other = write_run(tmp_path / "o", "y", org="d0", seed=0).parent
    res = _invoke("--baseline", b, "--candidate", other)
    assert res.exit_code == 2 and "no matching cells" in _error_line(res)


# ------------------------------------------------------------ noisy engines

BASE = {"throughput_ledger_tok_s": 400.0, "throughput_span_tok_s": 410.0, "ttft_p99_s": 2.0,
        "itl_p99_s": 0.05, "e2e_p99_s": 30.0, "peak_mem_total_bytes": 3e10}


def _noisy_root(root, seeds=(0, 1, 2, 3), orgs=("s2", "d0"), scale=None, noise=0.0):
    """vLLM-engine runs: one per (org, seed); ``scale`` multiplies metrics of
    the orgs it names ({org: {metric: factor}}), ``noise`` jitters every metric."""
    rng = np.random.default_rng([6, zlib.crc32(Path(root).name.encode())])
    for org in orgs:
        for seed in seeds:
            summary = {k: v * (1 + 0.1 * seed) for k, v in BASE.items()}
            for k, f in ((scale or {}).get(org) or {}).items():
                summary[k] *= f
            if noise:
                summary = {k: v * rng.lognormal(0, noise) for k, v in summary.items()}
            write_run(root, f"{org}-{seed}", org=org, seed=seed, engine="vllm", endpoint="http://h:8000",
                      summary=summary)
    return root


@pytest.mark.slow
def test_noisy_engine_consistent_drop_in_one_group_is_a_regression(tmp_path):
    b = _noisy_root(tmp_path / "b", noise=0.005)
    c = _noisy_root(tmp_path / "c", noise=0.005, scale={"d0": {"throughput_ledger_tok_s": 0.85}})
    res = _invoke("--baseline", b, "--candidate", c)
    assert res.exit_code == 1, res.output
    r = compare(b, c)
    assert not r.deterministic
    (finding,) = r.regressions
    assert finding.where == {"org": "d0", "budget": "b83"} and finding.n == 4
    assert finding.metric == "throughput_ledger_tok_s" and finding.change == pytest.approx(-0.15, abs=0.02)
    tested = [f for f in r.findings if not np.isnan(f.p)]
    reported = {m for m in GATES if m in json.loads(next(b.glob("*/summary.json")).read_text())}
    assert len(tested) == 2 * len(reported)  # two groups x gated metrics: one Holm family
    assert [f.p_holm for f in tested] == pytest.approx(list(stats.holm([f.p for f in tested])))


def test_noisy_engine_change_needs_significance(tmp_path):
    b = _noisy_root(tmp_path / "b", seeds=(0, 1, 2), orgs=("s2",))
    c = _noisy_root(tmp_path / "c", seeds=(0, 1, 2), orgs=("s2",), noise=0.08,
                    scale={"s2": {"throughput_ledger_tok_s": 0.97}})
    r = compare(b, c)
    assert not r.regressed
    f = {f.metric: f for f in r.findings}["throughput_ledger_tok_s"]
    assert f.n == 3 and f.p_holm >= 0.05 and f.reason == "not significant"


@pytest.mark.slow
def test_noisy_engine_null_cell_is_a_regression(tmp_path):
    b = _noisy_root(tmp_path / "b", noise=0.01)
    c = _noisy_root(tmp_path / "c", noise=0.01)
    kept = json.loads((c / "s2-1" / "summary.json").read_text())
    (c / "s2-1" / "summary.json").write_text(json.dumps({**kept, "ttft_p99_s": None}))
    record_files(c / "s2-1")
    (finding,) = compare(b, c).regressions
    assert finding.where == {"org": "s2", "budget": "b83", "seed": 1} and finding.metric == "ttft_p99_s"
    assert _invoke("--baseline", b, "--candidate", c).exit_code == 1


def test_noisy_engine_one_seed_is_refused(tmp_path):
    b = _noisy_root(tmp_path / "b", seeds=(0,))
    c = _noisy_root(tmp_path / "c", seeds=(0,))
    res = _invoke("--baseline", b, "--candidate", c)
    assert res.exit_code == 2
    assert "engine vllm is noisy" in _error_line(res) and "at least 2 seeds" in res.output


def test_noisy_engine_missing_seed_is_a_missing_cell_not_a_refusal(tmp_path):
    b = _noisy_root(tmp_path / "b", seeds=(0, 1), orgs=("s2",), noise=0.01)
    c = _noisy_root(tmp_path / "c", seeds=(0, 1), orgs=("s2",), noise=0.01)
    shutil.rmtree(c / "s2-1")
    r = compare(b, c)
    assert r.missing == ({"org": "s2", "budget": "b83", "seed": 1},) and r.regressed
    assert {f.reason for f in r.findings} == {"one valid seed: not tested"}
    assert _invoke("--baseline", b, "--candidate", c, "--allow-missing").exit_code == 0


@pytest.mark.parametrize("metric, base_value, factor, regressed", [
    ("failed", 0.0, None, True),        # none failed in the baseline, some in every candidate seed
    ("preemptions", 10.0, 1.5, True),   # half as many again on every seed
    ("preemptions", 10.0, 1.01, False),  # within the 2 % tolerance
    ("reused_tokens", 1000.0, 0.5, True),
])
def test_noisy_engine_gates_counts_on_paired_differences(tmp_path, metric, base_value, factor, regressed):
    """A count is zero when nothing happened: a noisy group is tested on the
    seeds' differences, judged over the baseline mean (one unit from 0)."""
    def root(path, value):
        for org in ("s2", "d0"):
            for seed in range(4):
                summary = {k: v * (1 + 0.1 * seed) for k, v in BASE.items()}
                summary[metric] = value(seed) if org == "d0" else base_value
                write_run(path, f"{org}-{seed}", org=org, seed=seed, engine="vllm",
                          endpoint="http://h:8000", summary=summary)
        return path

    b = root(tmp_path / "b", lambda seed: base_value)
    c = root(tmp_path / "c", lambda seed: 3.0 if factor is None else base_value * factor)
    r = compare(b, c)
    assert [(f.where["org"], f.metric) for f in r.regressions] == ([("d0", metric)] if regressed else [])


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_a_cell_copied_under_another_name_is_bad_input_naming_both(tmp_path, side):
    """Two runs of one cell would let either stand for it (a copy of the
    baseline's could hide a candidate's regression): refused, naming both."""
    tree = _smoke_copy(tmp_path / side)
    cell = sorted(p for p in tree.iterdir() if p.is_dir())[0]
    shutil.copytree(cell, tree / "zz-copy")
    args = ("--baseline", tree, "--candidate", SMOKE) if side == "baseline" else (
        "--baseline", SMOKE, "--candidate", tree)
    res = _invoke(*args)
    assert res.exit_code == 2, res.output
    line = _error_line(res)
    assert line.startswith(f"Error: {side}: runs ") and str(cell) in line and "zz-copy" in line
