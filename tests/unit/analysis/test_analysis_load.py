"""`load_runs` reads the results format (written by `tests.support.results_factory`)."""

from __future__ import annotations

import warnings

import pytest

from analysis.load import RunSkipped, config_keys, load_runs
from common.errors import HbenchError
from tests.support.results_factory import write_run


def test_load_runs_reads_config_summary_and_identity(tmp_path):
    write_run(tmp_path, "a", org="s1", seed=3, q=0.5, summary={"throughput_ledger_tok_s": 400.0})
    write_run(tmp_path, "b", org="s0", seed=3, q=0.5, summary={"throughput_ledger_tok_s": 300.0})
    runs = load_runs(tmp_path)
    assert list(runs["run_id"]) == ["a", "b"]
    assert list(runs["org"]) == ["s1", "s0"]
    assert list(runs["throughput_ledger_tok_s"]) == [400.0, 300.0]
    assert runs["workload_hash"].nunique() == 1
    assert runs.loc[0, "path"] == str(tmp_path / "a")
    assert "seed" in config_keys(runs) and "throughput_ledger_tok_s" not in config_keys(runs)


def test_load_runs_skips_incomplete_with_warning(tmp_path):
    write_run(tmp_path, "done", seed=1)
    write_run(tmp_path, "crashed", status="running", seed=2)
    no_summary = write_run(tmp_path, "nosummary", seed=3)
    (no_summary / "summary.json").unlink()
    (tmp_path / "analysis").mkdir()  # no manifest: not a run, no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path)
    assert list(runs["run_id"]) == ["done"]
    msgs = sorted(str(w.message) for w in caught if issubclass(w.category, RunSkipped))
    assert len(msgs) == 2
    assert "status 'running'" in msgs[0] and "missing summary.json" in msgs[1]


def test_load_runs_errors_on_missing_or_empty_root(tmp_path):
    with pytest.raises(HbenchError, match="no results directory"):
        load_runs(tmp_path / "nope")
    write_run(tmp_path, "crashed", status="failed")
    # the skipped run's reason is in the one error, not a warning line before it
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunSkipped)
        with pytest.raises(HbenchError, match="no complete runs.*crashed"):
            load_runs(tmp_path)
