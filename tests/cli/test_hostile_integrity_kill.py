"""kill -9 at seeded random points of ``run``, ``sweep``, ``analyze``,
``report`` and ``workload build``: no partial file, no new empty folder,
finished cells intact, and the rerun completes and cleans up.

Each command runs in a process forked from one server that imported hbench
once (so a case costs the command, not Python's start-up), and is sent
SIGKILL after a delay drawn from a seeded generator as a fraction of the
command's own measured duration. What a kill may leave: complete outputs,
and hidden ``.tmp-*`` entries of the dead writer, which the rerun removes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from harness import results
from hbench.cli import cli
from tests.support import REPO_ROOT
from workloads.io import load_workload

SEED = 24
pytestmark = pytest.mark.slow

# Kill points per command: the cheap writers twice, the slow readers once
# (their atomicity under a full disk is covered in test_hostile_integrity_disk).
KILLS = {"run": 2, "sweep": 2, "workload": 2, "analyze": 1, "report": 1}

SERVER = r"""
import json, os, sys
import hbench.cli, hbench.sweep, hbench.commands.run, hbench.commands.sweep, hbench.commands.analyze
import hbench.commands.report, hbench.commands.workload, analysis.figures, analysis.html_report
from hbench.cli import cli

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            cli.main(req, prog_name="hbench")
        except SystemExit as exc:
            os._exit(exc.code if isinstance(exc.code, int) else 1)
        os._exit(0)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


class ForkServer:
    def __init__(self):
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)

    def start(self, args: list[str]) -> int:
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def wait(self) -> int:
        """The forked command's wait status, once it has ended."""
        return int(self.proc.stdout.readline())

    def run(self, args: list[str]) -> float:
        t0 = time.perf_counter()
        self.start(args)
        status = self.wait()
        assert os.waitstatus_to_exitcode(status) == 0, args
        return time.perf_counter() - t0

    def kill_after(self, args: list[str], delay: float) -> int:
        pid = self.start(args)
        time.sleep(delay)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.wait()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    s = ForkServer()
    yield s
    s.close()


def delays(cmd: str, duration: float) -> list[float]:
    rng = random.Random(f"{SEED}-{cmd}")
    return [duration * rng.uniform(0.05, 0.95) for _ in range(KILLS[cmd])]


# ------------------------------------------------------------ what is whole

def assert_whole(path: Path) -> None:
    """A visible output file that a reader can use as it is."""
    data = path.read_bytes()
    assert data, f"{path} is empty"
    suffix = path.suffix
    if suffix == ".png":
        assert data.endswith(b"IEND\xaeB`\x82"), path
    elif suffix == ".svg":
        assert data.rstrip().endswith(b"</svg>"), path
    elif suffix == ".html":
        assert data.endswith(b"</html>\n"), path
    elif suffix == ".json":
        json.loads(data)
    elif suffix == ".csv":
        assert data.endswith(b"\n"), path
        pd.read_csv(path)
    elif suffix == ".parquet":
        pq.read_table(path)
    else:
        assert data.endswith(b"\n"), path


def visible_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(root).parts)]


def empty_dirs(root: Path) -> set[Path]:
    return {Path(d) for d, dirs, files in os.walk(root) if not dirs and not files}


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp-*")] + [p for p in root.rglob(".locks")]


def assert_after_kill(root: Path, empty_before: set[Path]) -> None:
    for p in visible_files(root):
        assert_whole(p)
    for d in root.iterdir() if root.is_dir() else ():
        if (d / results.MANIFEST).exists():
            assert results.is_done(d), d       # a cell is complete or not there at all
    assert empty_dirs(root) - empty_before - {root} <= set(), empty_dirs(root) - empty_before


# ------------------------------------------------------------------ cases

RUN = ["run", "--org", "s2", "--budget", "b83", "--requests", "80", "--seed", "1", "--json"]
SWEEP = ["sweep", "--org", "s2,d0", "--budget", "b83", "--requests", "40", "--seeds", "1", "--jobs", "2"]


@pytest.fixture(scope="module")
def tree(server, tmp_path_factory) -> tuple[Path, float]:
    """A finished sweep to analyze and report on; and how long a sweep of it takes."""
    out = tmp_path_factory.mktemp("tree") / "sweep"
    took = server.run([*SWEEP, "--out", str(out)])
    return out, took


@pytest.fixture(scope="module")
def ref_run(server, tmp_path_factory) -> tuple[Path, float]:
    ref = tmp_path_factory.mktemp("ref") / "results"
    return ref, server.run([*RUN, "--out", str(ref)])


@pytest.mark.parametrize("i", range(KILLS["run"]))
def test_kill_run(server, ref_run, tmp_path, i):
    ref, took = ref_run
    out = tmp_path / "out"
    server.kill_after([*RUN, "--out", str(out)], delays("run", took)[i])
    assert_after_kill(out, set())
    for p in out.iterdir() if out.exists() else ():   # a whole run, or its writer's hidden temp
        assert results.is_done(p) if not p.name.startswith(".") else p.name.startswith(".tmp-"), p
    res = CliRunner().invoke(cli, [*RUN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert not temps(out)
    fresh = Path(json.loads(res.stdout)["run_dir"])
    mine = next(p for p in ref.iterdir())
    for f in ("summary.json", "requests.parquet", "steps.parquet"):
        assert (fresh / f).read_bytes() == (mine / f).read_bytes()


@pytest.mark.parametrize("i", range(KILLS["sweep"]))
def test_kill_sweep(server, tree, tmp_path, i):
    done, took = tree
    out = tmp_path / "out"
    server.kill_after([*SWEEP, "--out", str(out)], delays("sweep", took)[i])
    assert_after_kill(out, set())
    # Finished cells only: a writer killed after its manifest but before its
    # rename leaves a complete hidden ``.tmp-*`` directory, which is not a cell.
    finished = {p.name: (p / "summary.json").read_bytes() for p in out.iterdir()
                if not p.name.startswith(".") and results.is_done(p)} if out.exists() else {}
    res = CliRunner().invoke(cli, [*SWEEP, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"{len(finished)} already done" in res.output
    assert not temps(out)
    for name, summary in finished.items():                 # finished cells were left alone
        assert (out / name / "summary.json").read_bytes() == summary
    for cell in done.iterdir():
        if cell.is_dir():
            assert (out / cell.name / "summary.json").read_bytes() == (cell / "summary.json").read_bytes()
    assert {c["status"] for c in json.loads((out / "sweep.json").read_text())["cells"]} <= {"ran", "skipped"}


@pytest.mark.parametrize("i", range(KILLS["analyze"]))
def test_kill_analyze(server, tree, tmp_path, i):
    src, _ = tree
    root = tmp_path / "tree"
    shutil.copytree(src, root)
    args = ["analyze", str(root), "--no-figures"]   # report.html still inlines its figures
    took = server.run([*args, "--out", str(tmp_path / "ref")])
    server.kill_after(args, delays("analyze", took)[i])
    assert_after_kill(root, set())
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert not temps(root)
    assert sorted(p.name for p in visible_files(root / "analysis")) == \
        sorted(p.name for p in visible_files(tmp_path / "ref"))
    for p in visible_files(root / "analysis"):
        assert_whole(p)


@pytest.mark.parametrize("i", range(KILLS["report"]))
def test_kill_report(server, tree, tmp_path, i):
    src, _ = tree
    out = tmp_path / "reports" / "report.html"
    took = server.run(["report", str(src), "-o", str(tmp_path / "ref.html")])
    server.kill_after(["report", str(src), "-o", str(out)], delays("report", took)[i])
    assert_after_kill(tmp_path / "reports", set())
    res = CliRunner().invoke(cli, ["report", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert not temps(tmp_path) and [p.name for p in out.parent.iterdir()] == ["report.html"]
    assert_whole(out)


WORKLOAD = ["workload", "build", "--requests", "400", "--seed", "3"]


@pytest.fixture(scope="module")
def ref_workload(server, tmp_path_factory) -> tuple[Path, float]:
    ref = tmp_path_factory.mktemp("ref") / "ref.parquet"
    return ref, server.run([*WORKLOAD, "-o", str(ref)])


@pytest.mark.parametrize("i", range(KILLS["workload"]))
def test_kill_workload_build(server, ref_workload, tmp_path, i):
    args = WORKLOAD
    ref, took = ref_workload
    out = tmp_path / "w" / "w.parquet"
    server.kill_after([*args, "-o", str(out)], delays("workload", took)[i])
    assert_after_kill(tmp_path / "w", set())
    if out.exists():
        assert load_workload(out).content_hash == load_workload(ref).content_hash
    res = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert not temps(out.parent) and out.read_bytes() == ref.read_bytes()
