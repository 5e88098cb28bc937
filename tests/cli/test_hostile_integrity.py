"""Damaged run directories and stale temporaries, as a hostile user makes them.

A finished cell's manifest records each file's size and sha256. Every way of
damaging a file afterwards (cut, emptied, deleted, one byte flipped, one
byte appended; a manifest whose record is edited or malformed) must make the
cell not done, so a sweep rerun reruns exactly that cell and says which and
why; and every reader (analyze, report, regress, explain) must refuse it in
one ``Error:`` line naming the cell and the file, writing nothing. Results
written before manifests had the record still read. ``.tmp-*`` debris of dead
writers (dead, zombie, or a pid reused by a later process) is removed by the
next ``run`` or ``sweep``; a live writer's is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import grid as G
from harness import results
from hbench import sweep as S
from hbench.cli import cli
from tests.support import REPO_ROOT
from tests.support.cli import one_error_line

GRID = {"org": "s2,d0", "budget": "b83", "requests": "20", "seed": "1"}
SWEEP_ARGS = ["--org", "s2,d0", "--budget", "b83", "--requests", "20", "--seeds", "1"]
RUN_ARGS = ["--org", "s2", "--budget", "b83", "--requests", "20", "--seed", "1"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A finished two-cell sweep (s2 and d0), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("pristine") / "sweep"
    res = S.run_sweep(G.expand([], GRID), out)
    assert res.count("ran") == 2
    return out


@pytest.fixture
def tree(pristine, tmp_path) -> Path:
    out = tmp_path / "sweep"
    shutil.copytree(pristine, out)
    return out


def cells(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / results.MANIFEST).is_file())


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``, with a file's bytes (None for a directory)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


# --------------------------------------------------------------- damages

def _cut(n):
    def f(p: Path):
        p.write_bytes(p.read_bytes()[:n])
    return f


def _half(p: Path):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _empty(p: Path):
    p.write_bytes(b"")


def _delete(p: Path):
    p.unlink()


def _flip(p: Path):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))


def _append(p: Path):
    p.write_bytes(p.read_bytes() + b"\0")


def _manifest_edit(change):
    def f(run_dir: Path):
        m = json.loads((run_dir / results.MANIFEST).read_text())
        change(m)
        (run_dir / results.MANIFEST).write_text(json.dumps(m, indent=2) + "\n")
    return f


def _wrong_sha(m):
    m["files"]["summary.json"]["sha256"] = "0" * 64


def _malformed(m):
    m["files"]["requests.parquet"]["bytes"] = "many"


# (id, file the error names, damage of a run directory)
def _on(name, fn):
    def damage(run_dir: Path):
        fn(run_dir / name)
    return damage


FILE_DAMAGES = [(f"{name}-{kind}", name, _on(name, fn))
                for name, cut in (("summary.json", _cut(100)), ("requests.parquet", _cut(1000)),
                                  ("steps.parquet", _half))
                for kind, fn in (("cut", cut), ("emptied", _empty), ("deleted", _delete),
                                 ("flipped", _flip), ("appended", _append))]
MANIFEST_DAMAGES = [("manifest-wrong-sha", "summary.json", _manifest_edit(_wrong_sha)),
                    ("manifest-malformed", "files", _manifest_edit(_malformed))]
DAMAGES = FILE_DAMAGES + MANIFEST_DAMAGES
# What read_run sees without reading a table: sizes, and the summary's bytes.
READ_DAMAGES = [d for d in DAMAGES if not (d[0].endswith("flipped") and d[1] != "summary.json")]


@pytest.mark.slow
@pytest.mark.parametrize("name, file, damage", DAMAGES, ids=[d[0] for d in DAMAGES])
def test_a_damaged_cell_is_not_done_and_the_reason_names_the_file(tree, name, file, damage):
    victim, other = cells(tree)
    assert results.is_done(victim) and results.why_not_done(victim) is None
    damage(victim)
    assert not results.is_done(victim) and not results.is_complete(victim)
    assert file in results.why_not_done(victim)
    assert results.is_done(other)


@pytest.mark.slow
@pytest.mark.parametrize("name, file, damage", DAMAGES, ids=[d[0] for d in DAMAGES])
def test_sweep_reruns_exactly_the_damaged_cell_and_says_why(tree, pristine, name, file, damage):
    victim, other = cells(tree)
    other_before = snapshot(other)
    damage(victim)
    res = CliRunner().invoke(cli, ["sweep", *SWEEP_ARGS, "--out", str(tree)])
    assert res.exit_code == 0, res.output
    assert f"cell {victim.name}: " in res.output and file in res.output and "rerunning it" in res.output
    assert "1 ran, 1 already done, 0 failed" in res.output
    assert snapshot(other) == other_before                     # the sound cell untouched
    for f in ("summary.json", "requests.parquet", "steps.parquet"):   # rerun: bit-identical
        assert (victim / f).read_bytes() == (pristine / victim.name / f).read_bytes()
    assert results.is_done(victim)
    assert sorted(p.name for p in tree.iterdir()) == sorted(p.name for p in pristine.iterdir())


def _reader_cmd(reader: str, tree: Path, victim: Path, scratch: Path) -> list[str]:
    return {"analyze": ["analyze", str(tree), "--out", str(scratch / "analysis")],
            "report": ["report", str(tree), "-o", str(scratch / "report.html")],
            "regress-baseline": ["regress", "--baseline", str(tree), "--candidate", str(scratch / "clean"),
                                 "--report", str(scratch / "regress.md")],
            "regress-candidate": ["regress", "--baseline", str(scratch / "clean"), "--candidate", str(tree),
                                  "--report", str(scratch / "regress.md")],
            "explain": ["explain", str(victim)]}[reader]


READERS = ["analyze", "report", "regress-baseline", "regress-candidate", "explain"]
READER_DAMAGES = [d for d in READ_DAMAGES
                  if d[0] in ("summary.json-cut", "requests.parquet-cut", "steps.parquet-emptied",
                              "steps.parquet-deleted", "summary.json-flipped", "requests.parquet-appended")]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("name, file, damage", READER_DAMAGES, ids=[d[0] for d in READER_DAMAGES])
def test_readers_refuse_a_damaged_cell_in_one_line_naming_it(tree, pristine, tmp_path, reader,
                                                             name, file, damage):
    victim = cells(tree)[0]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shutil.copytree(pristine, scratch / "clean")
    damage(victim)
    before = snapshot(tmp_path)
    res = CliRunner().invoke(cli, _reader_cmd(reader, tree, victim, scratch))
    line = one_error_line(res, str(victim), file)
    assert "damaged run" in line
    assert snapshot(tmp_path) == before                        # nothing written, nothing removed


def test_explain_refuses_a_flipped_step_table_when_it_reads_it(tree):
    victim = cells(tree)[0]
    _flip(victim / "steps.parquet")
    res = CliRunner().invoke(cli, ["explain", str(victim)])
    one_error_line(res, str(victim), "steps.parquet", "sha256")


def test_analyze_with_figures_refuses_a_flipped_step_table(tree, tmp_path):
    victim = cells(tree)[0]
    _flip(victim / "steps.parquet")
    res = CliRunner().invoke(cli, ["analyze", str(tree), "--out", str(tmp_path / "a")])
    one_error_line(res, str(victim), "steps.parquet")
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name, file, damage", [d for d in DAMAGES if d[0] in (
    "summary.json-cut", "requests.parquet-cut", "steps.parquet-emptied")])
def test_capacity_reruns_a_damaged_cell_it_reuses(tmp_path, name, file, damage):
    out = tmp_path / "cap"
    args = ["capacity", "--org", "s2", "--budget", "b83", "--rates", "3", "--seeds", "1",
            "--requests", "20", "--slo", "ttft_p99<=100s", "--out", str(out), "--json"]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    victim = cells(out)[0]
    kept = (victim / file).read_bytes() if file != "files" else None
    damage(victim)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert f"cell {victim.name}: " in res.stderr and file in res.stderr and "rerunning it" in res.stderr
    assert json.loads(res.stdout) == json.loads(first.stdout)
    assert results.is_done(victim) and (victim / file).read_bytes() == kept


# ------------------------------------------------ no record, no verification

def _strip_record(run_dir: Path):
    m = json.loads((run_dir / results.MANIFEST).read_text())
    del m["files"]
    (run_dir / results.MANIFEST).write_text(json.dumps(m, indent=2) + "\n")


def test_the_committed_baseline_records_its_checksums_and_reads():
    smoke = REPO_ROOT / "results" / "baselines" / "smoke"
    assert all("files" in json.loads(m.read_text()) for m in smoke.glob("*/manifest.json"))
    res = CliRunner().invoke(cli, ["regress", "--baseline", str(smoke), "--candidate", str(smoke)])
    assert res.exit_code == 0, res.output


@pytest.mark.slow
def test_a_run_without_a_record_is_refused_not_read_unverified(tree, tmp_path):
    """Its summary could have been edited without a trace: no reader trusts it,
    and a sweep reruns it."""
    for d in cells(tree):
        _strip_record(d)
    before = snapshot(tree)
    res = CliRunner().invoke(cli, ["analyze", str(tree), "--no-figures", "--out", str(tmp_path / "a")])
    one_error_line(res, "records no size and sha256")
    assert snapshot(tree) == before and not (tmp_path / "a").exists()
    assert not results.is_done(cells(tree)[0])


def test_a_baseline_that_dropped_its_step_tables_on_purpose_reads(tree, pristine):
    for d in cells(tree):
        results.drop_files(d, ["steps.parquet"])
        assert not (d / "steps.parquet").exists()
        manifest = json.loads((d / results.MANIFEST).read_text())
        assert "steps.parquet" not in manifest["files"] and manifest["dropped_files"] == ["steps.parquet"]
    res = CliRunner().invoke(cli, ["regress", "--baseline", str(tree), "--candidate", str(pristine)])
    assert res.exit_code == 0, res.output
    run = results.read_run(cells(tree)[0])
    assert len(run.table("requests")) > 0 and not run.has_table("steps")


def test_a_dropped_table_that_reappears_damaged_is_not_trusted(tree):
    victim = cells(tree)[0]
    results.drop_files(victim, ["steps.parquet"])
    (victim / "summary.json").write_bytes(b"{}")
    res = CliRunner().invoke(cli, ["explain", str(victim)])
    one_error_line(res, str(victim), "summary.json")


def test_ci_smoke_script_drops_step_tables_with_the_manifest_record():
    script = (REPO_ROOT / "scripts" / "ci_smoke.sh").read_text()
    assert "drop_files" in script and "-name steps.parquet -delete" not in script


# ------------------------------------------------------------ stale temps

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


class Zombie:
    """A child that has exited and is not reaped (as a killed sweep's workers
    under an init that never reaps them)."""

    def __enter__(self) -> int:
        self.pid = os.fork()
        if self.pid == 0:
            os._exit(0)
        for _ in range(500):
            if Path(f"/proc/{self.pid}/stat").read_text().split(") ")[1][0] == "Z":
                break
            time.sleep(0.002)
        return self.pid

    def __exit__(self, *exc):
        os.waitpid(self.pid, 0)


def _tmp_dir(root: Path, pid: int, *, old: bool = False) -> Path:
    d = root / f".tmp-20260101T000000Z-sim-s2-b83-s1-deadbeef-{pid}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    if old:   # written long before any process now running started: its pid was reused
        os.utime(d, (946684800, 946684800))
    return d


def _invoke_writer(cmd: str, out: Path):
    args = ["run", *RUN_ARGS, "--out", str(out), "--json"] if cmd == "run" else \
        ["sweep", "--org", "s2", "--budget", "b83", "--requests", "20", "--seeds", "1", "--out", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("cmd", ["run", "sweep"])
@pytest.mark.parametrize("writer", ["dead", "zombie", "reused"])
def test_stale_tmp_dirs_of_dead_writers_are_removed(tmp_path, cmd, writer):
    out = tmp_path / "out"
    if writer == "zombie":
        with Zombie() as pid:
            stale = _tmp_dir(out, pid)
            _invoke_writer(cmd, out)
    else:
        stale = _tmp_dir(out, _dead_pid() if writer == "dead" else os.getpid(), old=writer == "reused")
        _invoke_writer(cmd, out)
    assert not stale.exists()
    assert not [p for p in out.rglob(".tmp-*")]
    assert len(cells(out)) == 1


@pytest.mark.parametrize("cmd", ["run", "sweep"])
def test_a_live_writers_tmp_dir_is_kept(tmp_path, cmd):
    out = tmp_path / "out"
    live = _tmp_dir(out, os.getpid())
    _invoke_writer(cmd, out)
    assert live.is_dir() and (live / "summary.json").read_text() == "{}"


def test_a_killed_sweep_json_write_is_removed_by_the_next_sweep(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    debris = out / f".tmp-{_dead_pid()}-0123abcd-sweep.json"
    debris.write_text('{"cells": [')
    _invoke_writer("sweep", out)
    assert not debris.exists()
    assert json.loads((out / "sweep.json").read_text())["cells"][0]["status"] == "ran"


def test_a_sweep_leaves_no_lock_files(tmp_path):
    out = tmp_path / "out"
    _invoke_writer("sweep", out)
    assert not (out / ".locks").exists()
    assert sorted(p.name for p in out.iterdir() if not (p / results.MANIFEST).exists()) == ["sweep.json"]
