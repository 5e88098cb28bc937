"""Sweeps under concurrency and interruption: shared --out, SIGTERM/SIGKILL,
cells that served nothing, content-addressed inputs, the simulator version."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import HbenchError
from harness import results as R
from harness.config import RunConfig
from harness.grid import expand
from harness.records import FAILED
from harness.request_table import RequestTable
from harness.results import is_complete, list_runs
from harness.run_address import cell_id
from harness.run_setup import RunSetup
from hbench import sweep as S
from tests.support import REPO_ROOT
from tests.support.waiting import wait_until

GRID = ["--org", "s0,s1,s2,d0", "--budget", "b83", "--rate", "4", "--seeds", "1-2", "--requests", "12"]
TINY = {"budget": "b83", "rate": 4.0, "requests": 12}


def hbench(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hbench.cli", *args], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def children(pid: int) -> set[int]:
    """Live (non-zombie) processes whose parent is ``pid``."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def sweep_doc(out: Path) -> dict:
    return json.loads((out / S.SWEEP_FILE).read_text())


# ------------------------------------------------------------ shared --out

@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_sweeps_into_one_out_compute_each_cell_once(tmp_path, n):
    out = tmp_path / "out"
    procs = [hbench("sweep", *GRID, "--jobs", "2", "--out", str(out)) for _ in range(n)]
    finished = [p.communicate(timeout=300) for p in procs]
    for p, (_, stderr) in zip(procs, finished, strict=True):
        assert p.returncode == 0, stderr[-2000:]
    ran = [int(re.search(r"(\d+) ran", stdout).group(1)) for stdout, _ in finished]
    cells = sweep_doc(out)["cells"]
    assert len(cells) == 8 and sum(ran) == 8, ran       # every cell computed exactly once
    assert all(c["status"] in ("ran", "skipped") for c in cells)
    assert sorted(p.name for p in list_runs(out)) == sorted(c["cell_id"] for c in cells)
    assert not list(out.glob(f"{R.TMP_PREFIX}*"))


def test_a_busy_cell_is_left_to_its_holder_then_found_done(tmp_path):
    cell = S.plan([RunConfig(org="s2", seed=1, **TINY)])[0]
    with S.cell_lock(tmp_path, cell.cell_id, wait=True):
        assert S.run_cell(cell, str(tmp_path), wait=False).status == "busy"
        assert not (tmp_path / cell.cell_id).exists()
    assert S.run_cell(cell, str(tmp_path), wait=False).status == "ran"
    assert S.run_cell(cell, str(tmp_path), wait=True).status == "skipped"


def test_a_lock_dir_removed_by_another_sweep_while_mkdir_looked_is_made_again(tmp_path,
                                                                          monkeypatch):
    """Another sweep's holder removes ``.locks`` once empty. Between mkdir
    finding it made and checking it is a directory, it can be gone: mkdir
    raises FileExistsError, and the lock is taken all the same."""
    from pathlib import Path as P

    real, raced = P.mkdir, []

    def mkdir(self, *a, **k):
        if self.name == S.LOCK_DIR and not raced:
            raced.append(self)
            raise FileExistsError(17, "File exists", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(P, "mkdir", mkdir)
    with S.cell_lock(tmp_path, "c0", wait=False) as held:
        assert held and raced and (tmp_path / S.LOCK_DIR / "c0").is_file()
    assert not (tmp_path / S.LOCK_DIR).exists()


def test_a_file_where_the_lock_dir_goes_is_a_clear_error(tmp_path):
    (tmp_path / S.LOCK_DIR).write_text("not a directory")
    with pytest.raises(HbenchError, match="not a directory"):
        with S.cell_lock(tmp_path, "c0", wait=False):
            pass


def test_the_lock_holder_removes_a_killed_holders_temp_even_while_its_pid_looks_alive(tmp_path):
    """A SIGKILLed sweep's worker can still be exiting when the next sweep
    begins: `clean_stale` sees its pid alive and keeps its ``.tmp-<cell>-<pid>``
    directory. The cell's next lock holder removes it (only a holder writes
    it, and the kernel released the lock only as the holder exited); another
    cell's temp stays."""
    cell, other = S.plan([RunConfig(org="s2", seed=1, **TINY), RunConfig(org="d0", seed=1, **TINY)])
    looks_alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        left = tmp_path / f"{R.TMP_PREFIX}{cell.cell_id}-{looks_alive.pid}"
        left.mkdir()
        (left / R.SUMMARY).write_text("{}")
        kept = tmp_path / f"{R.TMP_PREFIX}{other.cell_id}-{looks_alive.pid}"
        kept.mkdir()
        R.clean_stale(tmp_path)
        assert left.is_dir()                          # what a sweep's start leaves
        assert S.run_cell(cell, str(tmp_path)).status == "ran"
        assert not left.exists() and kept.is_dir()
        assert R.is_done(tmp_path / cell.cell_id)
    finally:
        looks_alive.kill()
        looks_alive.wait()


def test_write_run_loses_a_rename_race_with_one_error_and_no_debris(tmp_path, monkeypatch):
    cfg = RunConfig(org="s2", seed=1, **TINY)
    first = S.plan([cfg])[0]
    S.run_cell(first, str(tmp_path / "a"))
    data = R.read_run(tmp_path / "a" / first.cell_id)
    real_rename = os.rename

    def rival_wins(src, dst):
        shutil.copytree(tmp_path / "a" / first.cell_id, dst)   # the other writer, just before us
        real_rename(src, dst)

    monkeypatch.setattr(R.os, "rename", rival_wins)
    from adapters.registry import make_engine
    from workloads.build import workload_from_config

    run = make_engine("sim").run(workload_from_config(cfg), RunSetup.resolve(cfg))
    with pytest.raises(HbenchError, match="already exists"):
        R.write_run(tmp_path / "b", run_id="cell", config=cfg, run=run, workload_hash="h",
                    workload_meta={}, budget=dict(data["manifest"]["budget"]),
                    engine_name="sim", engine_version="v")
    assert is_complete(tmp_path / "b" / "cell")                 # the rival's directory stands
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["cell"]   # our temp dir is gone


# ------------------------------------------------------------ interruption

def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_long_sweep(out: Path) -> subprocess.Popen:
    proc = hbench("sweep", "--org", "s0,s1,s2,d0", "--budget", "b83", "--seeds", "1-3",
                  "--requests", "240", "--jobs", "2", "--out", str(out))

    def workers_started() -> bool:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        return len(children(proc.pid)) >= 2

    wait_until(workers_started, 120, "the sweep to start its workers")
    return proc


def _a_cell_ran(proc: subprocess.Popen, out: Path) -> bool:
    """sweep.json records a finished cell (the sweep rewrites it after each one)."""
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    try:
        return any(c["status"] == "ran" for c in sweep_doc(out)["cells"])
    except (OSError, ValueError):      # not written yet
        return False


def _workers_exit(workers: set[int]) -> None:
    wait_until(lambda: not any(alive(w) for w in workers), 60, f"workers {workers} to exit")


def _sweep_json_is_accurate(out: Path) -> None:
    doc = sweep_doc(out)
    for c in doc["cells"]:
        if c["status"] in ("ran", "skipped"):
            assert is_complete(out / c["cell_id"]), c["cell_id"]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                       (signal.SIGHUP, 129)], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_an_interrupt_stops_the_sweep_and_its_workers_and_leaves_nothing_behind(tmp_path, sig, code):
    """The sweep exits with the shell's code for the signal and one line,
    its workers are gone, no lock or temporary is left, sweep.json says what
    was done, and the same command finishes the rest."""
    out = tmp_path / "out"
    proc = _start_long_sweep(out)
    workers = children(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and "━" not in ln]
    assert lines[-1:] == [f"Error: interrupted by {sig.name}: stopped, nothing partial kept; "
                          "run the same command again to resume"], err[-2000:]
    assert "Traceback" not in err
    _workers_exit(workers)
    _sweep_json_is_accurate(out)
    assert not (out / ".locks").exists() and not list(out.glob(".tmp-*"))
    resumed = hbench("sweep", "--org", "s0,s1,s2,d0", "--budget", "b83", "--seeds", "1-3",
                     "--requests", "240", "--jobs", "2", "--out", str(out), "--dry-run")
    assert resumed.communicate(timeout=120)[0].strip().endswith("to run")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interrupted_sweep_run_again_runs_only_what_was_left(tmp_path):
    """Stopped by SIGHUP (a closed terminal) after a cell finished: the same
    command runs exactly the cells not done, reads the rest as done, and ends
    with every cell complete."""
    out = tmp_path / "out"
    proc = _start_long_sweep(out)
    wait_until(lambda: _a_cell_ran(proc, out), 300, "the sweep to finish a cell")
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=120)
    assert proc.returncode == 129
    done = sorted(p.name for p in out.iterdir() if is_complete(p))
    assert done and len(done) < 12
    again = hbench("sweep", "--org", "s0,s1,s2,d0", "--budget", "b83", "--seeds", "1-3",
                   "--requests", "240", "--jobs", "2", "--out", str(out))
    said, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-2000:]
    assert f"12 cells: {12 - len(done)} ran, {len(done)} already done, 0 failed" in said, said
    assert sorted(c["status"] for c in sweep_doc(out)["cells"]) == sorted(
        ["ran"] * (12 - len(done)) + ["skipped"] * len(done))
    assert all(is_complete(out / c["cell_id"]) for c in sweep_doc(out)["cells"])
    assert not (out / ".locks").exists() and not list(out.glob(".tmp-*"))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                       (signal.SIGHUP, 129)], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_an_interrupted_run_leaves_nothing_and_runs_again(tmp_path, sig, code):
    out = tmp_path / "out"
    proc = hbench("run", "--requests", "3000", "--rate", "30", "--out", str(out))
    wait_until(lambda: proc.poll() is not None or _cpu_seconds(proc.pid) > 1.5, 120,
               "the run to be past its imports")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == code, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f"Error: interrupted by {sig.name}")
    assert "Traceback" not in err
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and uses PR_SET_PDEATHSIG")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_sweep_json_is_accurate_after_a_kill_and_workers_die_with_the_sweep(tmp_path, sig):
    out = tmp_path / "out"
    proc = _start_long_sweep(out)
    workers = children(proc.pid)
    # interrupted with cells done and others running, so sweep.json has both to get right
    wait_until(lambda: _a_cell_ran(proc, out), 300, "the sweep to finish a cell")
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    _workers_exit(workers)
    _sweep_json_is_accurate(out)


# ------------------------------------------------------------ served nothing

def _every_request_fails(monkeypatch):
    from adapters.sim.engine import SimEngine

    real_run = SimEngine.run

    def failing(self, workload, setup, progress=None):
        run = real_run(self, workload, setup, progress)
        # the rows read back as records: a new table of them, failed
        run.requests = RequestTable.of(
            dataclasses.replace(r, status=FAILED, error="connection refused")
            for r in run.requests)
        return run

    monkeypatch.setattr(SimEngine, "run", failing)


def test_a_cell_whose_requests_all_failed_is_failed_and_rerun_on_resume(tmp_path, monkeypatch):
    configs = [RunConfig(org="s2", seed=1, **TINY)]
    with monkeypatch.context() as m:
        _every_request_fails(m)
        first = S.run_sweep(configs, tmp_path)
    assert [o.status for o in first.outcomes] == ["failed"]
    assert "no request finished" in first.outcomes[0].error
    assert "connection refused" in first.outcomes[0].error
    assert sweep_doc(tmp_path)["cells"][0]["status"] == "failed"
    resumed = S.run_sweep(configs, tmp_path)
    assert [o.status for o in resumed.outcomes] == ["ran"]
    assert sweep_doc(tmp_path)["cells"][0]["status"] == "ran"


# ------------------------------------------------------------ content addresses

def test_the_cell_id_hashes_the_content_of_input_files(tmp_path):
    cfg_file = tmp_path / "config.json"
    shutil.copy(REPO_ROOT / "tests/fixtures/configs/bamba.json", cfg_file)
    wl_file = tmp_path / "w.parquet"
    wl_file.write_bytes(b"first")
    for field, path in (("config_path", cfg_file), ("workload_path", wl_file)):
        cfg = RunConfig(**{field: str(path)})
        before = cell_id(cfg, "h", "v")
        assert cell_id(cfg, "h", "v") == before
        path.write_bytes(path.read_bytes() + b" ")
        assert cell_id(cfg, "h", "v") != before, field


def test_a_config_file_edit_gives_a_new_cell_in_a_sweep(tmp_path):
    cfg_file = tmp_path / "config.json"
    shutil.copy(REPO_ROOT / "tests/fixtures/configs/bamba.json", cfg_file)
    configs = expand([], {"config_path": str(cfg_file), "org": "s2", "seed": 1, "requests": 12})
    before = S.plan(configs)[0].cell_id
    cfg_file.write_text(json.dumps(json.loads(cfg_file.read_text()), indent=4))
    assert S.plan(configs)[0].cell_id != before


def test_sweep_ray_does_not_import_sweep():
    code = "import sys, hbench.sweep_ray, hbench.sweep_local; assert 'hbench.sweep' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_hbench_run_removes_stale_temp_dirs_of_dead_writers(tmp_path):
    from click.testing import CliRunner

    from hbench.cli import cli

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{R.TMP_PREFIX}20260101T000000Z-x-{dead.pid}"
    live = tmp_path / f"{R.TMP_PREFIX}20260101T000000Z-y-{os.getpid()}"
    stale.mkdir()
    live.mkdir()
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--json", "--requests", "8", "--rate", "4"])
    assert res.exit_code == 0, res.output
    assert not stale.exists() and live.exists()
