"""hbench sweep: grid expansion, content-addressed cells, resume, parallel
execution and one-line errors. Runs use 20-30 requests to stay fast."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from common.errors import HbenchError
from harness import grid as G
from harness.config import RunConfig
from harness.results import is_complete
from harness.run_address import cell_id
from hbench import sweep as S
from hbench.cli import cli

TINY = {"budget": "b83", "requests": 20}


def _summaries(out, cells):
    return {c.cell_id: json.loads((out / c.cell_id / "summary.json").read_text()) for c in cells}


# ------------------------------------------------------------------ grids

def test_parse_values_ranges_lists_and_types():
    assert G.parse_values("seed", "1-3,7") == (1, 2, 3, 7)
    assert G.parse_values("headroom", "0,0.19") == (0.0, 0.19)
    assert G.parse_values("retention", "off,on") == (False, True)
    assert G.parse_values("q", [0, 1]) == (0.0, 1.0)
    assert G.parse_values("duration_s", "none") == (None,)


@pytest.mark.parametrize("key,raw,msg", [
    ("headroom", "abc", "not a valid float"),
    ("seed", "5-2", "empty range"),
    ("org", "s0,s0", "repeated values"),
    ("colour", "red", "unknown grid key 'colour'"),
    ("cap", 1.5, "not a valid int"),
])
def test_bad_axis_values_are_one_line_errors(key, raw, msg):
    with pytest.raises(HbenchError, match=msg):
        G.parse_values(key, raw)


def test_expand_is_the_cartesian_product_in_order_without_duplicates():
    configs = G.expand([], {"org": "s0,s1", "q": "0,1", "seed": "1-2"})
    assert len(configs) == 8
    assert [(c.org, c.q, c.seed) for c in configs[:3]] == [("s0", 0.0, 1), ("s0", 0.0, 2), ("s0", 1.0, 1)]
    # two axis sets that overlap keep one copy of the shared cell
    union = G.expand([{"cap": 63}, {"cap": [63, 109]}], {"org": "s2"})
    assert [c.cap for c in union] == [63, 109]


def test_invalid_combination_fails_before_running():
    with pytest.raises(HbenchError, match="--headroom must be in"):
        G.expand([], {"headroom": "0,1.5"})


def test_toml_grid_equals_flags_and_grid_tables_form_a_union(tmp_path):
    f = tmp_path / "grid.toml"
    f.write_text('org = ["s2", "d0"]\nseed = "1-2"\nrate = 3\n'
                 '[[grid]]\nbudget = "b63"\ncap = 63\n[[grid]]\nbudget = "b108"\ncap = 109\n')
    base, grids = G.load_grid_file(f)
    configs = G.expand(grids, base)
    assert len(configs) == 8
    assert {(c.budget, c.cap) for c in configs} == {("b63", 63), ("b108", 109)}
    flat = G.expand([], {"org": "s2,d0", "seed": "1-2", "rate": "3", "budget": "b63", "cap": "63"})
    assert flat == [c for c in configs if c.budget == "b63"]


def test_toml_grid_errors_name_the_problem(tmp_path):
    f = tmp_path / "grid.toml"
    f.write_text('orgs = ["s2"]\n')
    with pytest.raises(HbenchError, match="unknown grid key 'orgs'"):
        G.load_grid_file(f)
    f.write_text("org = [\n")
    with pytest.raises(HbenchError, match="cannot read grid file"):
        G.load_grid_file(f)


# ------------------------------------------------------------------ cells

def test_cell_ids_are_stable_and_content_addressed():
    configs = G.expand([], {**TINY, "org": "s0,s2", "seed": "1"})
    a, b = S.plan(configs), S.plan(configs)
    assert [c.cell_id for c in a] == [c.cell_id for c in b]
    assert len({c.cell_id for c in a}) == 2
    c0 = a[0]
    assert c0.cell_id == cell_id(c0.config, c0.workload_hash, c0.engine_version)
    # orgs share a request stream; another seed does not
    assert a[0].workload_hash == a[1].workload_hash
    other = S.plan([RunConfig(org="s0", seed=2, **TINY)])[0]
    assert other.workload_hash != c0.workload_hash and other.cell_id != c0.cell_id


def test_sweep_file_is_the_json_of_its_doc_as_outcomes_change(tmp_path):
    grid = {"org": "s0,s2", "seed": "1,2"}
    cells = S.plan(G.expand([grid], dict(TINY)))
    record = S.SweepFile(tmp_path, [grid], TINY, cells)

    def expected(outcomes):
        doc = S._sweep_doc([grid], TINY, cells, outcomes)
        return json.dumps(S.to_jsonable(doc), indent=1) + "\n"

    def same(outcomes):   # the clock may tick between the two renders
        got, want = record.text(outcomes), expected(outcomes)
        stamp = '"updated_utc": '
        strip = [t[:t.index(stamp)] + t[t.index(stamp) + len(stamp) + 22:] for t in (got, want)]
        return strip[0] == strip[1]

    outcomes = {}
    assert same(outcomes)
    outcomes[cells[1].cell_id] = S.CellOutcome(cells[1].cell_id, "ran", 1.25)
    assert same(outcomes)
    outcomes[cells[1].cell_id] = S.CellOutcome(cells[1].cell_id, "failed", 2.0, 'no "room"\n')
    outcomes[cells[3].cell_id] = S.CellOutcome(cells[3].cell_id, "skipped")
    assert same(outcomes)
    record.write(outcomes)
    assert json.loads((tmp_path / S.SWEEP_FILE).read_text())["cells"][1]["status"] == "failed"


def test_resume_reruns_only_the_missing_cell_and_cleans_stale_tmp(tmp_path):
    out = tmp_path / "sw"
    configs = G.expand([], {**TINY, "org": "s0,s1,s2", "seed": "1"})
    first = S.run_sweep(configs, out)
    assert first.count("ran") == 3
    assert json.loads((out / "sweep.json").read_text())["cells"][0]["status"] == "ran"
    victim = first.cells[1].cell_id
    mtimes = {c.cell_id: (out / c.cell_id / "manifest.json").stat().st_mtime_ns for c in first.cells}
    # a killed sweep: one cell never finished, its writer left a temp dir behind
    import shutil
    shutil.rmtree(out / victim)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f".tmp-{victim}-{dead.pid}"
    stale.mkdir()
    (stale / "summary.json").write_text("{")

    second = S.run_sweep(configs, out)
    assert {o.cell_id: o.status for o in second.outcomes} == {
        c.cell_id: ("ran" if c.cell_id == victim else "skipped") for c in first.cells}
    assert not stale.exists()
    for c in first.cells:
        if c.cell_id != victim:
            assert (out / c.cell_id / "manifest.json").stat().st_mtime_ns == mtimes[c.cell_id]
    assert is_complete(out / victim)


def test_force_reruns_complete_cells(tmp_path):
    configs = [RunConfig(org="s2", seed=1, **TINY)]
    S.run_sweep(configs, tmp_path)
    again = S.run_sweep(configs, tmp_path, force=True)
    assert [o.status for o in again.outcomes] == ["ran"]


@pytest.mark.slow
def test_parallel_sweep_gives_the_serial_summaries(tmp_path):
    configs = G.expand([], {**TINY, "org": "s0,d0", "seed": "1-2"})
    serial = S.run_sweep(configs, tmp_path / "serial", jobs=1)
    parallel = S.run_sweep(configs, tmp_path / "parallel", jobs=2)
    assert [c.cell_id for c in serial.cells] == [c.cell_id for c in parallel.cells]
    assert parallel.count("ran") == 4
    assert _summaries(tmp_path / "serial", serial.cells) == _summaries(tmp_path / "parallel", parallel.cells)


# Resolves (6 pages of s2) but cannot hold the workload's longest request:
# found only once the cell's workload is built, so the cell fails at run time.
TOO_SMALL = dict(org="s2", seed=1, budget="6p", requests=20)


def test_a_failing_cell_is_reported_and_the_rest_run(tmp_path):
    configs = [RunConfig(org="s2", seed=1, **TINY), RunConfig(**TOO_SMALL)]
    result = S.run_sweep(configs, tmp_path)
    assert [o.status for o in result.outcomes] == ["ran", "failed"]
    # the first check that refuses it: the longest request's first chunk, sized
    # by the token budget, does not fit the 6 pages even alone
    assert result.failed[0].error.startswith("budget 6p cannot admit the longest request's first")


def test_an_invalid_cell_refuses_the_whole_sweep_before_any_work(tmp_path):
    configs = [RunConfig(org="s2", seed=1, **TINY), RunConfig(org="s2", seed=1, budget="b1", requests=20)]
    with pytest.raises(HbenchError, match="budget b1 gives s2 3 pages"):
        S.run_sweep(configs, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_ray_executor_without_ray_says_how_to_install(tmp_path):
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(HbenchError, match="pip install ray"):
            S.run_sweep([RunConfig(org="s2", seed=1, **TINY)], tmp_path, executor="ray")
    else:
        pytest.skip("ray is installed")


def _ray():
    return pytest.importorskip("ray", reason="ray is not installed (pip install 'hbench[ray]')")


RAY_GRID = {**TINY, "org": "s0,d0", "seed": "1-2"}


@pytest.mark.slow
def test_ray_executor_matches_serial_and_shuts_down_its_instance(tmp_path):
    ray = _ray()
    assert not ray.is_initialized()
    configs = G.expand([], RAY_GRID)
    serial = S.run_sweep(configs, tmp_path / "serial")
    seen = []
    remote = S.run_sweep(configs, tmp_path / "ray", jobs=2, executor="ray", on_cell=seen.append)
    assert [c.cell_id for c in remote.cells] == [c.cell_id for c in serial.cells]
    assert remote.count("ran") == 4
    assert sorted(o.cell_id for o in seen) == sorted(c.cell_id for c in serial.cells)
    assert _summaries(tmp_path / "serial", serial.cells) == _summaries(tmp_path / "ray", remote.cells)
    assert not ray.is_initialized()  # hbench started this instance, so hbench stopped it


@pytest.fixture(scope="module")
def ray_instance():
    """One local instance shared by the tests below; hbench must leave it running."""
    ray = _ray()
    from hbench.sweep_ray import _ray_connect

    assert _ray_connect(ray, 2, None)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_interrupt_leaves_complete_cells_and_resume_finishes(tmp_path, ray_instance):
    configs = G.expand([], RAY_GRID)

    def ctrl_c(outcome):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        S.run_sweep(configs, tmp_path, executor="ray", on_cell=ctrl_c)
    statuses = [c["status"] for c in json.loads((tmp_path / "sweep.json").read_text())["cells"]]
    assert sorted(statuses) == ["pending", "pending", "pending", "ran"]
    visible = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert visible and all(is_complete(p) for p in visible)
    resumed = S.run_sweep(configs, tmp_path, executor="ray")
    # ray.cancel is asynchronous: a task already renaming its finished cell when
    # the interrupt came may complete it after the listing above. Such a cell is
    # complete, and resuming skips it rather than computing it again.
    assert resumed.count("skipped") >= len(visible)
    assert resumed.count("skipped") + resumed.count("ran") == 4
    assert all(is_complete(tmp_path / c.cell_id) for c in resumed.cells)
    assert ray_instance.is_initialized()  # not ours to stop


@pytest.mark.slow
def test_ray_failing_cell_is_reported_and_the_rest_run(tmp_path, ray_instance):
    configs = [RunConfig(org="s2", seed=1, **TINY), RunConfig(**TOO_SMALL)]
    result = S.run_sweep(configs, tmp_path, executor="ray")
    assert [o.status for o in result.outcomes] == ["ran", "failed"]
    # the first check that refuses it: the longest request's first chunk, sized
    # by the token budget, does not fit the 6 pages even alone
    assert result.failed[0].error.startswith("budget 6p cannot admit the longest request's first")
    assert not (tmp_path / result.cells[1].cell_id).exists()


@pytest.mark.slow
def test_cli_sweep_on_ray_with_a_relative_out(tmp_path, ray_instance, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "--org", "s2", "--budget", "b83", "--seeds", "1", "--requests", "20",
            "--out", "rel", "--executor", "ray"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "1 cells: 1 ran, 0 already done, 0 failed" in result.output
    cell = json.loads((tmp_path / "rel" / "sweep.json").read_text())["cells"][0]["cell_id"]
    assert is_complete(tmp_path / "rel" / cell)


# -------------------------------------------------------------------- CLI

def test_cli_sweep_runs_then_resumes(tmp_path):
    runner = CliRunner()
    args = ["sweep", "--org", "s0,s2", "--budget", "b83", "--seeds", "1", "--requests", "20",
            "--out", str(tmp_path)]
    first = runner.invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert "2 cells: 2 ran, 0 already done, 0 failed" in first.output
    second = runner.invoke(cli, args)
    assert "2 cells: 0 ran, 2 already done" in second.output
    dry = runner.invoke(cli, [*args, "--dry-run"])
    assert "2 cells, 2 done, 0 to run" in dry.output


@pytest.mark.parametrize("args,msg", [
    (["--headroom", "0,abc"], "Error: grid key headroom: 'abc' is not a valid float"),
    (["--set", "colour=red"], "Error: unknown grid key 'colour'"),
    (["--set", "nonsense"], "Error: --set expects KEY=LIST"),
    (["--org", "s9"], "Error: unknown organization 's9'"),
])
def test_cli_bad_grid_is_one_line_error(tmp_path, args, msg):
    result = CliRunner().invoke(cli, ["sweep", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert result.output.startswith(msg)
