"""`load_runs` reads the results format (written by `tests.support.results_factory`)."""

from __future__ import annotations

import os
import warnings

import pytest

from analysis.load import RepeatedRun, RunSkipped, config_keys, load_runs
from common.errors import HbenchError
from tests.support.results_factory import record_files, run_id_of, write_run


def test_load_runs_reads_config_summary_and_identity(tmp_path):
    write_run(tmp_path, "a", org="s1", seed=3, q=0.5, summary={"throughput_ledger_tok_s": 400.0})
    write_run(tmp_path, "b", org="s0", seed=3, q=0.5, summary={"throughput_ledger_tok_s": 300.0})
    runs = load_runs(tmp_path)
    assert list(runs["run_id"]) == [run_id_of(tmp_path / "a"), run_id_of(tmp_path / "b")]
    assert list(runs["org"]) == ["s1", "s0"]
    assert list(runs["throughput_ledger_tok_s"]) == [400.0, 300.0]
    assert runs["workload_hash"].nunique() == 1
    assert runs.loc[0, "path"] == str(tmp_path / "a")
    assert "seed" in config_keys(runs) and "throughput_ledger_tok_s" not in config_keys(runs)


def test_load_runs_skips_incomplete_with_warning_and_refuses_a_damaged_run(tmp_path):
    done = write_run(tmp_path, "done", seed=1)
    write_run(tmp_path, "crashed", status="running", seed=2)
    (tmp_path / "analysis").mkdir()  # no manifest: not a run, no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path)
    assert list(runs["path"]) == [str(done)]
    msgs = sorted(str(w.message) for w in caught if issubclass(w.category, RunSkipped))
    assert len(msgs) == 1 and "status 'running'" in msgs[0]
    no_summary = write_run(tmp_path, "nosummary", seed=3)
    (no_summary / "summary.json").unlink()
    with pytest.raises(HbenchError, match="summary.json is missing"):
        load_runs(tmp_path)   # never dropped in silence


def test_load_runs_errors_on_missing_or_empty_root(tmp_path):
    with pytest.raises(HbenchError, match="no results directory"):
        load_runs(tmp_path / "nope")
    write_run(tmp_path, "crashed", status="failed")
    # the skipped run's reason is in the one error, not a warning line before it
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunSkipped)
        with pytest.raises(HbenchError, match="no complete runs.*crashed"):
            load_runs(tmp_path)


def _written_at(run_dir, created_utc: str) -> None:
    manifest = run_dir / "manifest.json"
    manifest.write_text(manifest.read_text().replace("2026-01-01T00:00:00Z", created_utc))
    record_files(run_dir)   # as written then: sealed again


def test_a_configuration_run_again_counts_once_the_newest_kept_and_the_rest_named(tmp_path):
    old = write_run(tmp_path, "s2-old", org="s2", seed=1, summary={"ttft_p50_s": 9.0})
    new = write_run(tmp_path, "s2-new", org="s2", seed=1, summary={"ttft_p50_s": 2.0})
    _written_at(old, "2026-01-01T00:00:00Z")
    _written_at(new, "2026-01-02T00:00:00Z")
    other_seed = write_run(tmp_path, "s2-seed2", org="s2", seed=2)
    other_org = write_run(tmp_path, "d0-seed1", org="d0", seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path)
    assert sorted(runs["path"]) == sorted(map(str, (new, other_seed, other_org)))
    assert runs.set_index("run_id").loc[run_id_of(new), "ttft_p50_s"] == 2.0
    repeated = [str(w.message) for w in caught if issubclass(w.category, RepeatedRun)]
    assert len(repeated) == 1
    assert f"kept the newest ({new})" in repeated[0] and f"set aside {old}" in repeated[0]


def test_runs_written_in_the_same_second_keep_the_one_written_last(tmp_path):
    first = write_run(tmp_path, "b-first", org="s2", seed=1)
    second = write_run(tmp_path, "a-second", org="s2", seed=1)   # sorts first by name
    os.utime(first / "manifest.json", ns=(1_000_000_000, 1_000_000_000))
    os.utime(second / "manifest.json", ns=(2_000_000_000, 2_000_000_000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RepeatedRun)
        runs = load_runs(tmp_path)
    assert list(runs["path"]) == [str(second)]


def test_distinct_configurations_raise_no_repeat_warning(tmp_path):
    for org in ("s1", "s2"):
        for seed in (1, 2):
            write_run(tmp_path, f"{org}-{seed}", org=org, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RepeatedRun)
        assert len(load_runs(tmp_path)) == 4
