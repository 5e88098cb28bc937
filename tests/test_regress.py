"""``hbench regress``: matching cells, the decision rule, exit codes 0/1/2."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from analysis.load import load_runs
from analysis.regress import compare
from harness.cli import cli
from tests.test_analysis_factory import write_run

BASE = {"throughput_ledger_tok_s": 400.0, "ttft_p99_s": 2.0, "itl_p99_s": 0.05, "e2e_p99_s": 30.0,
        "peak_mem_total_bytes": 3e10}


def _root(root, seeds=(0, 1, 2, 3), scale=None, noise=0.0, workload=None):
    """One run per seed; ``scale`` multiplies metrics, ``noise`` jitters them."""
    rng = np.random.default_rng([6, zlib.crc32(Path(root).name.encode())])
    for seed in seeds:
        summary = {k: v * (1 + 0.1 * seed) for k, v in BASE.items()}
        for k, f in (scale or {}).items():
            summary[k] *= f
        if noise:
            summary = {k: v * rng.lognormal(0, noise) for k, v in summary.items()}
        write_run(root, f"run-{seed}", org="s2", seed=seed, summary=summary, workload=workload)
    return root


def _invoke(*args):
    return CliRunner().invoke(cli, ["regress", *map(str, args)])


def test_identical_roots_exit_zero(tmp_path):
    b, c = _root(tmp_path / "b"), _root(tmp_path / "c")
    res = _invoke("--baseline", b, "--candidate", c, "--report", tmp_path / "r.md")
    assert res.exit_code == 0, res.output
    text = (tmp_path / "r.md").read_text()
    assert "no regression" in text and "4 matched cells" in text


def test_throughput_drop_exits_one(tmp_path):
    b = _root(tmp_path / "b")
    c = _root(tmp_path / "c", scale={"throughput_ledger_tok_s": 0.9})
    res = _invoke("--baseline", b, "--candidate", c)
    assert res.exit_code == 1, res.output
    assert "REGRESSION" in res.output


def test_latency_rise_is_bad_and_improvement_is_not(tmp_path):
    b = _root(tmp_path / "b")
    better = _root(tmp_path / "c1", scale={"throughput_ledger_tok_s": 1.2, "ttft_p99_s": 0.5})
    assert _invoke("--baseline", b, "--candidate", better).exit_code == 0
    worse = _root(tmp_path / "c2", scale={"ttft_p99_s": 1.5})
    r = compare(load_runs(b), load_runs(worse))
    flagged = {v.metric for v in r.verdicts if v.regression}
    assert flagged == {"ttft_p99_s"}


def test_min_effect_gate(tmp_path):
    b = _root(tmp_path / "b")
    c = _root(tmp_path / "c", scale={"throughput_ledger_tok_s": 0.99})  # 1% worse, deterministic
    assert _invoke("--baseline", b, "--candidate", c).exit_code == 0
    assert _invoke("--baseline", b, "--candidate", c, "--min-effect", "0.005").exit_code == 1


def test_noisy_change_needs_significance(tmp_path):
    b = _root(tmp_path / "b", seeds=(0, 1, 2))
    c = _root(tmp_path / "c", seeds=(0, 1, 2), scale={"throughput_ledger_tok_s": 0.97}, noise=0.08)
    r = compare(load_runs(b), load_runs(c))
    v = {v.metric: v for v in r.verdicts}["throughput_ledger_tok_s"]
    assert v.n == 3 and v.p_holm >= 0.05 and not v.regression


def test_single_cell_uses_deterministic_change(tmp_path):
    b = _root(tmp_path / "b", seeds=(0,))
    c = _root(tmp_path / "c", seeds=(0,), scale={"peak_mem_total_bytes": 1.05})
    r = compare(load_runs(b), load_runs(c))
    v = {v.metric: v for v in r.verdicts}["peak_mem_total_bytes"]
    assert v.n == 1 and np.isnan(v.p) and v.regression
    assert v.bad_change == pytest.approx(0.05)
    assert _invoke("--baseline", b, "--candidate", c).exit_code == 1


def test_bad_input_exits_two(tmp_path):
    b = _root(tmp_path / "b")
    res = _invoke("--baseline", b, "--candidate", tmp_path / "missing")
    assert res.exit_code == 2 and "does not exist" in res.output
    other = tmp_path / "other"
    write_run(other, "x", org="d0", seed=0)
    res = _invoke("--baseline", b, "--candidate", other)
    assert res.exit_code == 2 and "no matching cells" in res.output
    changed = _root(tmp_path / "w", workload="changed")
    res = _invoke("--baseline", b, "--candidate", changed)
    assert res.exit_code == 2 and "workload hash" in res.output
