"""Run directories: round trip, atomic writes, refusal to overwrite, JSON hygiene, ids,
and provenance."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.errors import HbenchError
from harness import provenance, results, run_address
from harness.config import RunConfig
from harness.metrics import summarize
from harness.per_request import per_request_table
from harness.records import EngineRun, RequestRecord
from harness.request_table import RequestTable
from harness.seal import SEAL, sealed

WORKLOAD_HASH = "ab" * 32


def make_run(*, with_warmup=False):
    reqs = [
        RequestRecord(0, 0.0, 32, 3, first_token_s=1.0, finish_s=2.5,
                      token_times=[1.0, 1.5, 2.5], output_tokens=3, reused_tokens=16),
        RequestRecord(1, 0.5, 48, 2, first_token_s=1.5, finish_s=2.0,
                      token_times=[1.5, 2.0], output_tokens=2),
        RequestRecord(2, 1.0, 16, 1, first_token_s=3.0, finish_s=3.0,
                      token_times=[3.0], output_tokens=1),
    ]
    if with_warmup:
        reqs.insert(0, RequestRecord(9, -3.0, 8, 2, first_token_s=-2.0, finish_s=-1.0,
                                     token_times=[-2.0, -1.0], output_tokens=2, warmup=True))
    steps = [{"t": 0.5, "waiting": 1, "running": 2}, {"t": 1.0, "waiting": 0, "running": 3}]
    return EngineRun(RequestTable.of(reqs), steps, 0.0, 4.0, engine_info={"blocks": 254},
                     peak_memory={"attention": 10, "ssm": 20, "conv": 3})


def rid(n: int = 1) -> str:
    """The ``n``-th run id of `RunConfig()` on `WORKLOAD_HASH` (``-2``, ``-3``, ... as
    `results.free_run_id` names repeats): a content address `read_run` accepts."""
    base = run_address.new_run_id(RunConfig(), WORKLOAD_HASH, now=datetime(2026, 1, 1, tzinfo=UTC))
    return base if n == 1 else f"{base}-{n}"


def write(root, run_id=None, run=None, config=None, **kw):
    return results.write_run(
        root, run_id=rid() if run_id is None else run_id, config=config or RunConfig(), run=run or make_run(),
        workload_hash=WORKLOAD_HASH, workload_meta={"requests": 3},
        engine_name="sim", engine_version="sim-1", **{"budget": {"label": "b83"}, **kw},
    )


def test_round_trip_preserves_manifest_summary_and_tables(tmp_path):
    run = make_run()
    path = write(tmp_path, run=run, weights_bytes=1000, extra_manifest={"sweep": "q1"})
    assert path == tmp_path / rid()
    assert sorted(p.name for p in path.iterdir()) == sorted(results.RUN_FILES)

    data = results.read_run(path)
    m = data["manifest"]
    assert m["schema_version"] == results.SCHEMA_VERSION and m["status"] == "complete"
    assert RunConfig.from_dict(m["config"]) == RunConfig()
    assert (m["workload_hash"], m["engine"], m["engine_version"]) == (WORKLOAD_HASH, "sim", "sim-1")
    assert (m["org"], m["budget"], m["engine_info"], m["sweep"]) == ("s2", {"label": "b83"},
                                                                       {"blocks": 254}, "q1")
    assert {"git_commit", "packages", "host", "created_utc", "workload_meta"} <= set(m)
    assert data["summary"] == results.to_jsonable(summarize(run, weights_bytes=1000, config=RunConfig()))
    # per-kind peaks (no per-step byte columns) are never summed into a total
    assert data["summary"]["peak_mem_total_bytes"] is None
    pd.testing.assert_frame_equal(data["requests"], per_request_table(run).to_pandas())
    pd.testing.assert_frame_equal(data["steps"], pd.DataFrame(run.steps))
    assert results.list_runs(tmp_path) == [path]


def test_summary_excludes_warmup_and_conserves_tokens(tmp_path):
    data = results.read_run(write(tmp_path, run=make_run(with_warmup=True)))
    table = data["requests"]
    assert len(table) == 4 and table.warmup.sum() == 1
    served = table[(table.status == "finished") & ~table.warmup].output_tokens.sum()
    assert data["summary"]["output_tokens"] == served == 6
    assert data["summary"]["requests"] == 3
    assert data["summary"]["ttft_p50_s"] == 1.0   # the warm-up's TTFT is 1.0 too; e2e tells
    assert data["summary"]["e2e_p50_s"] == 2.0


def _fail_steps_write(exc):
    """A stand-in for `write_steps` that finds the requests table written, then fails."""
    calls = []

    def write_steps(steps, path):
        calls.append(path)
        assert (Path(path).parent / results.REQUESTS).is_file()
        raise exc

    return write_steps, calls


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_failure_mid_write_leaves_no_run(tmp_path, monkeypatch, exc):
    failing, calls = _fail_steps_write(exc)
    monkeypatch.setattr(results, "write_steps", failing)
    with pytest.raises(type(exc)):
        write(tmp_path)
    assert len(calls) == 1                    # it really failed in the middle
    assert not (tmp_path / rid()).exists()
    assert list(tmp_path.iterdir()) == []     # the temporary directory is cleaned up
    assert results.list_runs(tmp_path) == []


def test_leftover_tmp_directory_is_ignored(tmp_path):
    done = write(tmp_path)
    # A crash can leave a temporary directory behind even with every file in it.
    shutil.copytree(done, tmp_path / f".tmp-{rid(2)}-12345")
    assert results.list_runs(tmp_path) == [done]


def test_list_runs_finds_nested_runs_and_skips_incomplete(tmp_path):
    a = write(tmp_path / "sweep1", run_id=rid(1))
    b = write(tmp_path / "sweep2", run_id=rid(2))
    broken = tmp_path / "sweep2" / rid(3)
    shutil.copytree(b, broken)
    (broken / results.STEPS).unlink()
    assert results.list_runs(tmp_path) == [a, b]


def test_refuses_to_overwrite_existing_run(tmp_path):
    first = write(tmp_path)
    before = (first / results.MANIFEST).read_text()
    with pytest.raises(HbenchError, match="already exists"):
        write(tmp_path, run=make_run(with_warmup=True))
    assert (first / results.MANIFEST).read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == [rid()]


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b"])
def test_rejects_run_ids_that_are_not_plain_names(tmp_path, bad):
    with pytest.raises(HbenchError, match="invalid run id"):
        write(tmp_path, run_id=bad)


def test_extra_manifest_cannot_replace_core_keys(tmp_path):
    with pytest.raises(ValueError, match="status"):
        write(tmp_path, extra_manifest={"status": "partial"})
    assert list(tmp_path.iterdir()) == []


def _reject_constant(name):
    raise AssertionError(f"non-standard JSON constant {name}")


def test_nan_is_written_as_null(tmp_path):
    run = EngineRun(RequestTable.of([]), [], 0.0, 1.0)   # nothing finished: every latency is NaN
    path = write(tmp_path, run=run)
    summary = json.loads((path / results.SUMMARY).read_text(), parse_constant=_reject_constant)
    assert summary["ttft_p99_s"] is None and summary["waiting_median"] is None
    assert summary["output_tokens"] == 0
    json.loads((path / results.MANIFEST).read_text(), parse_constant=_reject_constant)


def test_to_jsonable_converts_numpy_and_non_finite():
    value = {"a": np.int64(3), "b": np.float32(0.5), "c": np.bool_(True), "d": float("inf"),
             "e": (1, np.nan), "f": np.arange(2), 7: None}
    assert results.to_jsonable(value) == {"a": 3, "b": 0.5, "c": True, "d": None,
                                          "e": [1, None], "f": [0, 1], "7": None}
    assert type(results.to_jsonable(np.int64(3))) is int
    with pytest.raises(TypeError, match="object"):
        results.to_jsonable(object())


def _unsealed(manifest: dict) -> dict:
    """``manifest`` as an older writer left it while it wrote: no seal."""
    return {k: v for k, v in manifest.items() if k != SEAL}


def test_read_run_rejects_missing_incomplete_and_foreign_schema(tmp_path):
    with pytest.raises(HbenchError, match="no run directory"):
        results.read_run(tmp_path / "nope")
    path = write(tmp_path)
    manifest = json.loads((path / results.MANIFEST).read_text())

    (path / results.MANIFEST).write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(HbenchError, match="schema version 99"):
        results.read_run(path)

    (path / results.MANIFEST).write_text(json.dumps({**manifest, "status": "running"}))
    with pytest.raises(results.DamagedRun, match=f"do not match its {SEAL}"):
        results.read_run(path)   # hbench seals only complete runs: an edited status
    (path / results.MANIFEST).write_text(json.dumps(_unsealed({**manifest, "status": "running"})))
    with pytest.raises(results.IncompleteRun, match="not complete"):
        results.read_run(path)   # an older writer's, still running or crashed

    (path / results.MANIFEST).unlink()
    with pytest.raises(HbenchError, match="missing manifest.json"):
        results.read_run(path)


def test_list_runs_of_missing_root_is_an_error(tmp_path):
    with pytest.raises(HbenchError, match="no results directory"):
        results.list_runs(tmp_path / "absent")


def test_run_id_is_readable_and_separates_configs():
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    cfg = RunConfig(org="s1", budget="b83", seed=4)
    rid = run_address.new_run_id(cfg, WORKLOAD_HASH, now=now)
    assert re.fullmatch(r"20240506T070809Z-sim-s1-b83-s4-[0-9a-f]{8}", rid), rid
    assert run_address.new_run_id(cfg, WORKLOAD_HASH, now=now) == rid
    other = run_address.new_run_id(dataclasses.replace(cfg, headroom=0.1), WORKLOAD_HASH, now=now)
    assert other != rid and other.startswith("20240506T070809Z-sim-s1-b83-s4-")


def test_cell_id_addresses_config_workload_and_engine_version():
    cfg = RunConfig()
    base = run_address.cell_id(cfg, WORKLOAD_HASH, "sim-1")
    assert re.fullmatch(r"[0-9a-f]{16}", base)
    assert run_address.cell_id(RunConfig(), WORKLOAD_HASH, "sim-1") == base
    variants = {
        run_address.cell_id(dataclasses.replace(cfg, seed=1), WORKLOAD_HASH, "sim-1"),
        run_address.cell_id(cfg, "cd" * 32, "sim-1"),
        run_address.cell_id(cfg, WORKLOAD_HASH, "sim-2"),
    }
    assert base not in variants and len(variants) == 3


def test_git_commit_outside_a_checkout_is_unknown(tmp_path):
    assert provenance.git_commit(tmp_path) == "unknown"
    assert provenance.git_commit(tmp_path / "does-not-exist") == "unknown"


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_commit_reports_hash_and_dirty_tree(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("1")
    git("add", "f.txt")
    git("commit", "-q", "-m", "one")
    clean = provenance.git_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean), clean
    (tmp_path / "f.txt").write_text("2")
    assert provenance.git_commit(tmp_path) == clean + "-dirty"


def test_package_versions_and_host_info():
    versions = provenance.package_versions()
    assert versions["numpy"] == np.__version__ and versions["pandas"] == pd.__version__
    assert {"python", "hbench", "pyarrow", "scipy", "statsmodels", "click"} <= set(versions)
    host = provenance.host_info()
    assert host["cpu_count"] >= 1 and host["platform"]


def test_read_run_exposes_checked_metadata_and_loads_tables_lazily(tmp_path):
    path = write(tmp_path)
    results.drop_files(path, [results.STEPS])  # a CI baseline keeps no per-step table
    run = results.read_run(path)
    assert (run.run_id, run.engine, run.engine_version) == (rid(), "sim", "sim-1")
    assert run.workload_hash == WORKLOAD_HASH and run.schema_version == results.SCHEMA_VERSION
    assert run.config["org"] == RunConfig().org and run.summary["finished"] == 3
    assert run.has_table("requests") and not run.has_table("steps")
    assert len(run.table("requests")) == 3
    with pytest.raises(HbenchError, match="has no steps.parquet"):
        run.table("steps")
    assert not results.is_complete(path)  # a sweep reruns a cell without every file
    assert results.list_runs(tmp_path) == []


@pytest.mark.parametrize("text, match", [
    ("[]", "JSON list, not an object"), ("{not json", "not valid JSON"), ("null", "JSON NoneType")])
def test_read_run_refuses_a_malformed_summary(tmp_path, text, match):
    path = write(tmp_path)
    # Recorded in the manifest, so the format check is reached.
    (path / results.SUMMARY).write_text(text)
    manifest = json.loads((path / results.MANIFEST).read_text())
    manifest[results.FILES][results.SUMMARY] = {
        "bytes": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    (path / results.MANIFEST).write_text(json.dumps(sealed(manifest)))
    with pytest.raises(HbenchError, match=match):
        results.read_run(path)


def test_iter_runs_skips_only_incomplete_runs_and_refuses_the_rest(tmp_path):
    good = write(tmp_path, run_id=rid(1))
    running = write(tmp_path, run_id=rid(2))
    manifest = json.loads((running / results.MANIFEST).read_text())
    (running / results.MANIFEST).write_text(json.dumps(_unsealed({**manifest, "status": "running"})))
    with pytest.warns(results.RunSkipped, match="'running' is not complete"):
        assert [r.path for r in results.iter_runs(tmp_path)] == [good]
    with pytest.raises(HbenchError, match="'running' is not complete"):
        list(results.iter_runs(tmp_path, strict=True))
    shutil.rmtree(running)
    bad = write(tmp_path, run_id=rid(3))
    (bad / results.SUMMARY).unlink()
    results.drop_files(bad, [results.SUMMARY])   # a run that never had one is not skipped
    with pytest.raises(HbenchError, match="missing summary.json"):
        list(results.iter_runs(tmp_path))
    shutil.rmtree(bad)
    unreadable = write(tmp_path, run_id=rid(4))
    (unreadable / results.MANIFEST).write_text("{")
    with pytest.raises(HbenchError, match="not valid JSON"):
        list(results.iter_runs(tmp_path))
    shutil.rmtree(unreadable)
    foreign = write(tmp_path, run_id=rid(5))
    manifest = json.loads((foreign / results.MANIFEST).read_text())
    (foreign / results.MANIFEST).write_text(json.dumps({**manifest, "schema_version": 2}))
    with pytest.raises(HbenchError, match="schema version 2"):
        list(results.iter_runs(tmp_path))  # never silently mixed in, strict or not


def test_check_pairable_refuses_disagreeing_metadata(tmp_path):
    a = results.read_run(write(tmp_path, run_id=rid(1)))
    b = results.read_run(write(tmp_path, run_id=rid(2)))
    results.check_pairable(a, b)
    other_version = results.read_run(write(tmp_path / "v", run_id=rid(3)))
    other_version.manifest["engine_version"] = "sim-2"
    with pytest.raises(HbenchError, match=r"engine version differs \(sim-1 vs sim-2\)"):
        results.check_pairable(a, other_version)
    results.check_pairable(a, other_version, same_engine_version=False)
    other_stream = results.read_run(write(tmp_path / "w", run_id=rid(4)))
    other_stream.manifest["workload_hash"] = "cd" * 32
    with pytest.raises(HbenchError, match=f"refusing to pair {rid(1)} with {rid(4)}: workload hash differs"):
        results.check_pairable(a, other_stream, same_engine_version=False)


@pytest.mark.parametrize("edit, why", [
    (lambda m: m["config"].update(org="d0"), "org 's2' is not its configuration's 'd0'"),
    (lambda m: (m["config"].update(org="d0"), m.update(org="d0"), m["budget"].update(org="d0")),
     "does not hash to its run id"),
    (lambda m: m["config"].update(budget="b63"), "does not hash to its run id"),
    (lambda m: m["config"].update(seed=7), "does not hash to its run id"),
    (lambda m: m.update(workload_hash="cd" * 32), "does not hash to its run id"),
    (lambda m: m.update(run_id="renamed"), "is not a content address"),
    (lambda m: m.update(engine="torch"), "engine 'torch' is not its configuration's 'sim'"),
    (lambda m: m.pop(results.FILES), "records no size and sha256"),
])
def test_a_manifest_edited_since_the_run_is_refused_by_every_reader(tmp_path, edit, why):
    """The run id hashes the configuration and the workload: an edit to either
    (or to the fields the manifest repeats outside the configuration) is
    damage, refused by `read_run` and `iter_runs` and not done for a sweep."""
    path = write(tmp_path, budget={"label": "b83", "org": "s2"})
    assert results.read_run(path).config["org"] == "s2"
    manifest = json.loads((path / results.MANIFEST).read_text())
    edit(manifest)
    (path / results.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(results.DamagedRun, match=re.escape(why)):
        results.read_run(path)
    with pytest.raises(results.DamagedRun, match=re.escape(why)):
        list(results.iter_runs(tmp_path))
    assert not results.is_complete(path)


def test_a_cell_id_is_checked_against_its_manifest_with_the_named_files(tmp_path):
    """A sweep cell's id covers the engine version and the bytes of the files
    its configuration names, recorded as ``input_files``."""
    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    cfg = dataclasses.replace(RunConfig(), config_path=str(profile))
    cid = run_address.cell_id(cfg, WORKLOAD_HASH, "sim-1")
    path = write(tmp_path / "out", run_id=cid, config=cfg)
    assert results.read_run(path).run_id == cid
    manifest = json.loads((path / results.MANIFEST).read_text())
    assert manifest["input_files"] == {"--config": hashlib.sha256(b"{}").hexdigest()}
    for key, value in (("engine_version", "sim-2"), ("input_files", {})):
        (path / results.MANIFEST).write_text(json.dumps({**manifest, key: value}))
        with pytest.raises(results.DamagedRun):
            results.read_run(path)


def _every_field_edited(manifest: dict):
    """(field path, manifest with that one field changed) for every field,
    nested ones included, and a field added and one removed."""
    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, (*path, k))
        else:
            yield path

    for path in walk(manifest, ()):
        if path == (SEAL,):
            continue
        edited = json.loads(json.dumps(manifest))
        *parents, last = path
        holder = edited
        for k in parents:
            holder = holder[k]
        old = holder[last]
        holder[last] = (not old if isinstance(old, bool) else old + 1 if isinstance(old, int | float)
                        else [*old, 0] if isinstance(old, list) else f"{old}x")
        yield ".".join(path), edited
    yield "added", {**manifest, "note": "edited"}
    yield "host removed", {k: v for k, v in manifest.items() if k != "host"}


def test_an_edit_to_any_manifest_field_is_refused(tmp_path):
    """Fields the run id does not hash (the budget's bytes, the engine's info,
    the workload's meta, the creation time, the versions) still feed what
    readers print and choose: the seal refuses an edit to any of them."""
    path = write(tmp_path, budget={"label": "b83", "org": "s2", "allocated_whole_model_bytes": 7},
                 weights_bytes=1000)
    manifest = json.loads((path / results.MANIFEST).read_text())
    assert manifest[SEAL] and results.read_run(path).manifest == manifest
    cases = list(_every_field_edited(manifest))
    assert {"budget.allocated_whole_model_bytes", "engine_info.blocks", "workload_meta.requests",
            "created_utc", "weights_bytes", "host.platform"} <= {name for name, _ in cases}
    for name, edited in cases:
        (path / results.MANIFEST).write_text(json.dumps(edited))
        # most are the seal's; a few fail an earlier check (a schema version
        # this hbench does not read, a field of the wrong type): one line each
        with pytest.raises(HbenchError) as exc:
            results.read_run(path)
        assert "\n" not in str(exc.value) and "manifest" in str(exc.value), name
        with pytest.raises(HbenchError):   # refused, never passed over with a warning
            list(results.iter_runs(tmp_path))
        assert not results.is_complete(path), name


def test_a_manifest_without_its_seal_is_refused(tmp_path):
    path = write(tmp_path)
    manifest = json.loads((path / results.MANIFEST).read_text())
    (path / results.MANIFEST).write_text(json.dumps(_unsealed(manifest)))
    with pytest.raises(results.DamagedRun, match=f"records no {SEAL}"):
        results.read_run(path)


def test_drop_files_reseals_a_good_manifest_and_refuses_an_edited_one(tmp_path):
    good, edited = write(tmp_path, run_id=rid(1)), write(tmp_path, run_id=rid(2))
    results.drop_files(good, [results.STEPS])
    assert results.read_run(good).manifest[results.DROPPED] == [results.STEPS]
    manifest = json.loads((edited / results.MANIFEST).read_text())
    (edited / results.MANIFEST).write_text(json.dumps({**manifest, "weights_bytes": 1}))
    with pytest.raises(results.DamagedRun, match=f"do not match its {SEAL}"):
        results.drop_files(edited, [results.STEPS])   # re-sealing never launders an edit
    assert (edited / results.STEPS).is_file()


def test_a_manifest_padded_past_its_bound_is_refused_unread(tmp_path):
    path = write(tmp_path)
    manifest = json.loads((path / results.MANIFEST).read_text())
    manifest["host"]["platform"] = "x" * results.MAX_MANIFEST_BYTES
    (path / results.MANIFEST).write_text(json.dumps(sealed(manifest)))
    with pytest.raises(HbenchError, match=f"at most {results.MAX_MANIFEST_BYTES:,} are read"):
        results.read_run(path)
    assert not results.is_complete(path)
