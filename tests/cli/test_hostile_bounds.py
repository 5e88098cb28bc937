"""Hostile input, bounded work: workload files whose identity was tampered
with, saved workloads and recipes too large to run, and grids too large to
plan. Each case asserts the exit status, exactly one ``Error:`` line (no
traceback) naming what is wrong, and that nothing was written; where the
risk is a hang or a memory blowup, a time and memory bound too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.config import GRID_FIELDS, MAX_RUN_MEMORY_BYTES, RunConfig, run_bytes
from harness.grid import MAX_GRID_CELLS, count_cells, expand, normalize_axes
from harness.run_setup import check_memory, run_requests, validate
from tests.support import REPO_ROOT
from tests.support.cli import invoke, one_error_line
from workloads.build import build_workload
from workloads.io import file_hash, load_workload, save_workload, stored_hashes
from workloads.workload import stream_hash

META = b"hbench.workload.meta"
STREAM = b"hbench.workload.content_hash"
FILE = b"hbench.workload.file_hash"


# ------------------------------------------------------------ workload identity

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A seed-1, q=1 saved workload of 12 requests."""
    path = tmp_path_factory.mktemp("wl") / "w.parquet"
    save_workload(build_workload(seed=1, q=1.0, rate=4.0, requests=12), path)
    return path


def _table(path):
    return pq.read_table(path)


def _write(table, md, dst):
    pq.write_table(table.replace_schema_metadata(md), dst)
    return dst


def edit_meta(src, dst, **changes):
    """``src`` with its meta edited; both stored hashes left as they were."""
    table = _table(src)
    md = dict(table.schema.metadata)
    meta = {**json.loads(md[META]), **changes}
    md[META] = json.dumps(meta, sort_keys=True).encode()
    return _write(table, md, dst)


def edit_arrivals(src, dst, *, drop=(), restamp_stream=False):
    """``src`` with its first arrival moved (still a valid stream); the keys
    in ``drop`` deleted; with ``restamp_stream`` the stream hash is recomputed
    for the edit (a forger who knows the stream hash) but the file hash is not."""
    table = _table(src)
    arrivals = table.column("arrival_s").to_pylist()
    arrivals[0] = arrivals[0] / 2
    table = table.set_column(table.column_names.index("arrival_s"), "arrival_s",
                             pa.array(arrivals, pa.float64()))
    md = dict(table.schema.metadata)
    if restamp_stream:
        md[STREAM] = stored_hashes(table.replace_schema_metadata(md))[STREAM]
    for key in drop:
        md.pop(key)
    return _write(table, md, dst)


META_EDITS = [("seed", 99), ("q", 0.0), ("rate", 40.0), ("arrival", "constant"), ("burstiness", 9.0),
              ("requests", 500), ("mean_input_target", 100), ("contexts", 1), ("isolate", True),
              ("max_model_len", 65536), ("workload_kind", "multiturn"), ("max_output", 2)]


@pytest.mark.parametrize("key, value", META_EDITS, ids=[k for k, _ in META_EDITS])
def test_a_run_refuses_a_workload_whose_meta_was_edited(tmp_path, saved, key, value):
    """The stream hash still matches (the rows are untouched), but the run
    would record the edited recipe for the original stream."""
    bad = edit_meta(saved, tmp_path / "meta.parquet", **{key: value})
    out = tmp_path / "out"
    line = one_error_line(invoke("run", "--out", out, "--workload", bad), "content hash mismatch")
    assert str(bad) in line and "metadata" in line
    assert not out.exists()


@pytest.mark.parametrize("key, value", [("seed", 99), ("q", 0.0), ("rate", 0.5)])
def test_describe_refuses_a_workload_whose_meta_was_edited(tmp_path, saved, key, value):
    bad = edit_meta(saved, tmp_path / "meta.parquet", **{key: value})
    png = tmp_path / "h.png"
    one_error_line(invoke("workload", "describe", bad, "--png", png), "content hash mismatch")
    assert not png.exists()


TAMPERED = {
    "arrivals edited, stream hash deleted": (dict(drop=(STREAM,)), "content hash missing"),
    "arrivals edited, both hashes deleted": (dict(drop=(STREAM, FILE)), "content hash missing"),
    "arrivals edited, file hash deleted": (dict(drop=(FILE,)), "content hash missing"),
    "arrivals edited, hashes kept": (dict(), "content hash mismatch"),
    "arrivals edited, stream hash forged": (dict(restamp_stream=True), "content hash mismatch"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
@pytest.mark.parametrize("command", ["run", "describe", "sweep", "sweep --dry-run"])
def test_tampered_workload_files_are_refused_by_every_reader(tmp_path, saved, case, command):
    kwargs, needle = TAMPERED[case]
    bad = edit_arrivals(saved, tmp_path / "bad.parquet", **kwargs)
    out = tmp_path / "out"
    if command == "run":
        res = invoke("run", "--out", out, "--workload", bad)
    elif command == "describe":
        res = invoke("workload", "describe", bad, "--json")
    else:
        res = invoke("sweep", "--set", f"workload_path={bad}", "--out", out,
                     *command.split()[1:])
    assert str(bad) in one_error_line(res, needle)
    assert not out.exists()


def test_a_file_without_either_hash_key_is_refused_even_when_untouched(tmp_path, saved):
    """A file of the previous format (stream hash only) is not trusted: its
    meta could have been edited and nothing would tell."""
    table = _table(saved)
    md = dict(table.schema.metadata)
    md.pop(FILE)
    old = _write(table, md, tmp_path / "old.parquet")
    one_error_line(invoke("workload", "describe", old), "content hash missing (hbench.workload.file_hash)")


@pytest.mark.parametrize("value", [b"", b"0" * 64, b"\xff\xfe not utf-8", b"x" * 10_000])
def test_a_garbage_stored_hash_is_a_mismatch(tmp_path, saved, value):
    table = _table(saved)
    md = {**table.schema.metadata, STREAM: value}
    bad = _write(table, md, tmp_path / "garbage.parquet")
    one_error_line(invoke("run", "--out", tmp_path / "out", "--workload", bad), "content hash mismatch")
    assert not (tmp_path / "out").exists()


def test_a_forged_file_hash_over_an_edited_meta_is_a_mismatch(tmp_path, saved):
    """Recomputing the file hash with the wrong schema, or over the old meta,
    does not make an edited meta pass."""
    table = _table(saved)
    md = dict(table.schema.metadata)
    md[META] = json.dumps({**json.loads(md[META]), "seed": 99}, sort_keys=True).encode()
    md[FILE] = file_hash(json.loads(_table(saved).schema.metadata[META]), md[STREAM].decode()).encode()
    bad = _write(table, md, tmp_path / "forged.parquet")
    one_error_line(invoke("workload", "describe", bad), "content hash mismatch")


def test_an_intact_file_keeps_the_stream_hash_runs_record(tmp_path, saved):
    """The stored stream hash is the derived stream's own hash: a run of the
    saved file and a run that derives the stream record the same workload_hash."""
    derived = build_workload(seed=1, q=1.0, rate=4.0, requests=12)
    md = _table(saved).schema.metadata
    assert md[STREAM].decode() == derived.content_hash == stream_hash(derived.requests)
    assert md[FILE].decode() == file_hash(derived.meta, derived.content_hash)
    back = load_workload(saved)
    assert back.content_hash == derived.content_hash and back.meta == derived.meta


def test_the_committed_smoke_baseline_still_pairs_on_its_workload_hash():
    """results/baselines/smoke records the stream hash of each cell's derived
    workload; that hash is unchanged, so the baseline stays comparable."""
    manifest = json.loads(next((REPO_ROOT / "results/baselines/smoke").glob("*/manifest.json")).read_text())
    cfg = RunConfig.from_dict(manifest["config"])
    from workloads.build import workload_from_config

    assert workload_from_config(cfg).content_hash == manifest["workload_hash"]


# ------------------------------------------------------- memory of saved workloads

def _footer_only_file(path, rows: int, tokens_per_row: int, group: int = 1000, **meta):
    """A file whose footer says ``rows`` requests of ``tokens_per_row`` tokens
    (all zeros, so it stays small on disk) and which has no hashes: were it
    loaded, it would be refused as hash-less, so refusing it for its size
    shows the estimate came first."""
    schema = pa.schema([("request_id", pa.int64()), ("arrival_s", pa.float64()),
                        ("prompt_text", pa.large_string()), ("prompt_token_ids", pa.list_(pa.int64())),
                        ("output_len", pa.int64()), ("prefix_group", pa.int64()),
                        ("prefix_tokens", pa.int64()), ("salt", pa.string())],
                       metadata={META: json.dumps({"seed": 1, **meta}).encode(),
                                 b"hbench.workload.schema": b"1"})
    group = min(group, rows)
    flat = pa.array(np.zeros(group * tokens_per_row, dtype=np.int64))
    offsets = pa.array(np.arange(group + 1, dtype=np.int32) * tokens_per_row)
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, rows, group):
            ids = np.arange(start, start + group)
            w.write_table(pa.table({
                "request_id": ids, "arrival_s": ids / 3.0,
                "prompt_text": pa.array(["x"] * group, pa.large_string()),
                "prompt_token_ids": pa.ListArray.from_arrays(offsets, flat),
                "output_len": np.ones(group, dtype=np.int64),
                "prefix_group": np.full(group, -1, dtype=np.int64),
                "prefix_tokens": np.zeros(group, dtype=np.int64),
                "salt": pa.array([None] * group, pa.string())}, schema=schema))
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """33,000 requests of 3,332 prompt tokens: what ``--requests 33000`` asks for."""
    return _footer_only_file(tmp_path_factory.mktemp("big") / "big.parquet", 33_000, 3332)


@pytest.mark.slow
def test_run_refuses_a_saved_workload_as_large_as_a_refused_recipe(tmp_path, big):
    out = tmp_path / "out"
    t0 = time.perf_counter()
    line = one_error_line(invoke("run", "--out", out, "--workload", big), "GiB of memory")
    assert time.perf_counter() - t0 < 20
    assert "33,000 requests of 3332 prompt tokens" in line
    assert not out.exists()
    # the recipe is made request by request as it is served, so it holds no
    # prompt: 33,000 requests fit where the saved file, held whole, does not,
    # and so do a million; a multi-turn recipe holds its prompts and is
    # refused (in the same words)
    validate(RunConfig(requests=33_000))
    validate(RunConfig(requests=1_000_000))
    recipe = one_error_line(invoke("run", "--out", out, "--requests", "100000",
                              "--workload-kind", "multiturn"), "GiB of memory")
    assert recipe.split("about")[0] == line.split("about")[0]


@pytest.mark.slow
def test_sweep_refuses_a_saved_workload_too_large_to_run(tmp_path, big):
    out = tmp_path / "out"
    one_error_line(invoke("sweep", "--set", f"workload_path={big}", "--out", out),
              "GiB of memory")
    assert not out.exists()


@pytest.mark.parametrize("rows, tokens, meta", [
    (400_000, 1, {}),                                      # many tiny requests
    (5_000, 3332, {"workload_kind": "multiturn", "max_turns": 8}),   # 40,000 turns
])
def test_footer_sizes_of_every_shape_are_refused_before_loading(tmp_path, rows, tokens, meta):
    f = _footer_only_file(tmp_path / "f.parquet", rows, tokens, group=min(rows, 2000), **meta)
    one_error_line(invoke("run", "--out", tmp_path / "out", "--workload", f), "GiB of memory")
    assert not (tmp_path / "out").exists()


def test_a_saved_workloads_estimate_is_the_recipes(saved):
    w = load_workload(saved)
    n, mean = run_requests(RunConfig(workload_path=str(saved)))
    assert n == len(w) and mean == pytest.approx(np.mean([r.prompt_len for r in w.requests]))
    assert run_bytes(n, mean) == pytest.approx(RunConfig(requests=12, mean_input=round(mean)).estimated_run_bytes,
                                               rel=1e-3)


BUILD_CASES = [
    (["--requests", "1000000"], "1,000,000 requests"),
    (["--requests", "33000"], "33,000 requests"),
    (["--duration", "100000", "--rate", "10"], "1,000,000 requests"),
    (["--requests", "300000", "--mean-input", "100"], "300,000 requests"),
    (["--requests", "5000", "--workload-kind", "multiturn", "--max-turns", "8"], "40,000 requests"),
]


@pytest.mark.parametrize("args, needle", BUILD_CASES)
def test_workload_build_refuses_a_workload_too_large_to_run_before_deriving(tmp_path, args, needle):
    out = tmp_path / "w.parquet"
    t0 = time.perf_counter()
    line = one_error_line(invoke("workload", "build", "-o", out, *args), "GiB of memory")
    assert needle in line and time.perf_counter() - t0 < 20
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_memory_limit_is_a_strict_bound():
    per = run_bytes(1, 3332)
    fits = MAX_RUN_MEMORY_BYTES // per
    check_memory(fits, 3332)
    with pytest.raises(Exception, match="GiB of memory"):
        check_memory(fits + 1, 3332)


# --------------------------------------------------------------------- grids

def _limited(args, timeout=60, mem_bytes=3 * 2**30):
    """``hbench ARGS`` in a child limited to ``mem_bytes`` of address space."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", "from hbench.cli import cli; cli()", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    return proc, time.perf_counter() - t0


@pytest.mark.slow
def test_a_300_million_seed_sweep_is_refused_quickly_in_bounded_memory(tmp_path):
    """Listing the seeds took 12.7 GB; under a 3 GiB address-space limit the
    refusal must come from counting them."""
    out = tmp_path / "out"
    proc, seconds = _limited(["sweep", "--seeds", "1-300000000", "--out", str(out), "--dry-run"])
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert "300,000,000 cells" in lines[0] and f"limit is {MAX_GRID_CELLS:,} cells" in lines[0]
    assert seconds < 30 and not out.exists()


GRID_CASES = [
    (["--seeds", "1-100000"], "100,000 cells"),
    (["--seeds", f"1-{MAX_GRID_CELLS + 1}"], f"{MAX_GRID_CELLS + 1:,} cells"),
    (["--seeds", "1-6000,7000-12000"], "11,001 cells"),
    (["--seeds", "1-5000", "--org", "s0,s1,s2"], "expands to 15,000 cells"),
    (["--seeds", "1-1000", "--org", "s0,s1,s2,d0", "--budget", "b63,b83,b108"], "expands to 12,000 cells"),
    (["--seeds", "1-100", "--q", "0,0.5,1", "--rate", "1,2,3,4,5,6,7,8,9,10", "--headroom", "0,0.1,0.2,0.3"],
     "expands to 12,000 cells"),
    (["--set", "requests=" + ",".join(str(i) for i in range(1, MAX_GRID_CELLS + 3))], "at least"),
]


@pytest.mark.parametrize("args, needle", GRID_CASES)
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_grid_above_the_limit_is_refused_before_planning(tmp_path, args, needle, dry):
    out = tmp_path / "out"
    t0 = time.perf_counter()
    line = one_error_line(invoke("sweep", "--out", out, *args, *(["--dry-run"] if dry else [])), needle)
    assert f"limit is {MAX_GRID_CELLS:,} cells" in line and "GiB" in line
    assert time.perf_counter() - t0 < 15 and not out.exists()


@pytest.mark.parametrize("toml", [
    'seed = "1-300000000"\n',
    'org = ["s0", "s2"]\nseed = "1-4000"\n[[grid]]\nbudget = "b63"\n[[grid]]\nbudget = "b83"\n',
], ids=["huge range", "union of tables"])
def test_a_grid_file_above_the_limit_is_refused(tmp_path, toml):
    grid = tmp_path / "grid.toml"
    grid.write_text(toml)
    out = tmp_path / "out"
    one_error_line(invoke("sweep", "--grid", grid, "--out", out, "--dry-run"), "the limit is 10,000 cells")
    assert not out.exists()


@pytest.mark.parametrize("args", [["--seeds", "1-300000000"],
                                  ["--seeds", "1-1000", "--rates", "1,2,3,4,5,6"]])
def test_capacity_refuses_a_grid_above_the_limit(tmp_path, args):
    out = tmp_path / "cap"
    one_error_line(invoke("capacity", "--out", out, *args), "the limit is 10,000 cells")
    assert not out.exists()


def test_cells_are_counted_without_building_them():
    sets = [{**normalize_axes({"seed": "1-3", "org": "s0,s2"}), **normalize_axes(g)}
            for g in ({"budget": "b63"}, {"budget": "b83,b108"})]
    assert count_cells(sets) == 18 == len(expand([{"budget": "b63"}, {"budget": "b83,b108"}],
                                                 {"seed": "1-3", "org": "s0,s2"}))


def test_to_dict_is_asdict():
    """Every field, in order, but the grid fields at their defaults (left out
    so a default run hashes as it did before they existed)."""
    for cfg in (RunConfig(seed=4, q=0.5, dataset="x.json"),
                RunConfig(seed=4, grid_from="rule", shared_block_tokens=256,
                          dual_block_tokens=32, dual_grid_tokens=64)):
        full = {k: v for k, v in dataclasses.asdict(cfg).items()
                if k not in GRID_FIELDS or v != RunConfig.__dataclass_fields__[k].default}
        assert cfg.to_dict() == full
        assert list(cfg.to_dict()) == list(full)
    assert set(GRID_FIELDS) <= set(RunConfig(grid_from="vllm", shared_block_tokens=1,
                                             dual_block_tokens=1, dual_grid_tokens=1).to_dict())
    assert not set(GRID_FIELDS) & set(RunConfig().to_dict())


def test_dry_run_of_a_large_allowed_grid_answers_in_seconds_without_deriving(tmp_path, monkeypatch):
    def derive(*a, **k):
        raise AssertionError("--dry-run derived a workload")

    monkeypatch.setattr("hbench.sweep.build_run_workload", derive)
    t0 = time.perf_counter()
    res = invoke("sweep", "--seeds", "1-1000", "--org", "s0,s2", "--out", tmp_path / "out", "--dry-run")
    seconds = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1] == "2000 cells, 0 done, 2000 to run"
    assert seconds < 30, seconds
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished two-cell sweep and its sweep.json cell ids."""
    out = tmp_path_factory.mktemp("sw") / "out"
    res = invoke("sweep", "--org", "s0,s2", "--seeds", "1", "--requests", "12", "--rate", "4", "--out", out)
    assert res.exit_code == 0, res.output
    ids = {c["config"]["org"]: c["cell_id"] for c in json.loads((out / "sweep.json").read_text())["cells"]}
    return out, ids


DRY = ["sweep", "--org", "s0,s1,s2", "--seeds", "1", "--requests", "12", "--rate", "4", "--dry-run", "--out"]


def test_dry_run_names_the_done_cells_by_their_ids(swept, monkeypatch):
    out, ids = swept
    monkeypatch.setattr("hbench.sweep.build_run_workload", lambda c: pytest.fail("derived"))
    res = invoke(*DRY, out)
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[-1] == "3 cells, 2 done, 1 to run"
    done = {ln.split()[0] for ln in lines if "  done  " in ln}
    assert done == set(ids.values())
    assert any(ln.startswith("-" * 16 + "  todo  sim:s1@") for ln in lines)


def test_dry_run_does_not_trust_a_cell_whose_name_is_not_its_address(tmp_path, swept):
    out, ids = swept
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / ids["s0"]).rename(copy / "0123456789abcdef")
    res = invoke(*DRY, copy)
    assert res.output.strip().splitlines()[-1] == "3 cells, 1 done, 2 to run"


def test_dry_run_does_not_count_a_cell_of_another_engine_version(tmp_path, swept):
    out, ids = swept
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    manifest = copy / ids["s2"] / "manifest.json"
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "engine_version": "sim-0000"}))
    res = invoke(*DRY, copy)
    assert res.output.strip().splitlines()[-1] == "3 cells, 1 done, 2 to run"
