"""A full disk, a failing disk and failed commands leave nothing partial behind.

Every output goes through `common.atomic` (temp file in the same directory,
fsync, rename). On a full disk (a small tmpfs mounted here; where mounting is
not allowed, the rename that commits a file fails with ENOSPC instead, so no
case is skipped) ``run``, ``sweep``, ``analyze``, ``report``, ``workload
build`` and ``regress --report`` end in one ``Error:`` line naming the path,
and leave no truncated file, no 0-byte report, no empty folder and no
temporary. Commands that fail for other reasons leave no out directory,
``sweep.json`` or lock files they created.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from common import atomic
from common.errors import HbenchError
from harness import grid as G
from harness import results
from hbench import sweep as S
from hbench.cli import cli
from tests.support import REPO_ROOT
from tests.support.cli import one_error_line, overridden

GRID = {"org": "s2,d0", "budget": "b83", "requests": "20", "seed": "1"}
RUN_ARGS = ["run", "--org", "s2", "--budget", "b83", "--requests", "20", "--seed", "1", "--json"]
SWEEP_ARGS = ["sweep", "--org", "s2", "--budget", "b83", "--requests", "20", "--seeds", "1"]
PAGE = 4096


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tree") / "sweep"
    assert S.run_sweep(G.expand([], GRID), out).count("ran") == 2
    return out


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    """A 1 MiB tmpfs (None where this process may not mount one)."""
    where = tmp_path_factory.mktemp("tmpfs")
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                        capture_output=True).returncode == 0
    yield where if ok else None
    if ok:   # lazily: a sweep's pool worker may still be closing a file there as it exits
        subprocess.run(["umount", "--lazy", str(where)], check=True)


class Disk:
    """A nearly full disk: a directory under the tmpfs with ``leave`` bytes
    free, or (without a mount) a directory where committing a file fails."""

    def __init__(self, mount: Path | None, tmp_path: Path, monkeypatch):
        self.mount, self.monkeypatch = mount, monkeypatch
        self.root = (mount / uuid.uuid4().hex) if mount else tmp_path / "full"
        self.root.mkdir()

    def fill(self, leave: int = 0) -> Disk:
        if self.mount is None:
            real_replace, real_rename = os.replace, os.rename

            def refuse(real):
                def f(src, dst, *a, **k):
                    if str(dst).startswith(str(self.root)):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
                    return real(src, dst, *a, **k)
                return f
            self.monkeypatch.setattr(os, "replace", refuse(real_replace))
            self.monkeypatch.setattr(os, "rename", refuse(real_rename))
            return self
        st = os.statvfs(self.mount)
        free = st.f_bavail * st.f_frsize
        (self.mount / f"filler-{self.root.name}").write_bytes(b"\0" * max(0, free - leave))
        return self

    def free(self) -> None:
        for p in self.mount.glob("filler-*") if self.mount else ():
            p.unlink()

    def contents(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*"))


@pytest.fixture
def disk(mount, tmp_path, monkeypatch):
    d = Disk(mount, tmp_path, monkeypatch)
    yield d
    d.free()


NO_SPACE = os.strerror(errno.ENOSPC)


# ------------------------------------------------------------ a full disk

@pytest.mark.parametrize("leave", [0, 2 * PAGE], ids=["full", "two-pages-left"])
@pytest.mark.parametrize("where", ["results", "new/results"])
def test_run_on_a_full_disk_leaves_no_run_directory(disk, leave, where):
    disk.fill(leave)
    out = disk.root / where
    res = CliRunner().invoke(cli, [*RUN_ARGS, "--out", str(out)])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert disk.contents() == []


def test_run_on_a_full_disk_keeps_the_runs_already_there(disk):
    out = disk.root / "results"
    assert CliRunner().invoke(cli, [*RUN_ARGS, "--out", str(out)]).exit_code == 0
    before = disk.contents()
    disk.fill(0)
    res = CliRunner().invoke(cli, ["run", *overridden(RUN_ARGS[1:-1], ["--seed", "2"]), "--json",
                                   "--out", str(out)])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert disk.contents() == before and all(results.is_done(p) for p in out.iterdir())


def test_sweep_on_a_full_disk_leaves_no_sweep_json_nor_directory(disk):
    disk.fill(0)
    res = CliRunner().invoke(cli, [*SWEEP_ARGS, "--out", str(disk.root / "sweep")])
    one_error_line(res, NO_SPACE, "sweep.json", other_lines=True)
    assert disk.contents() == []


def test_sweep_whose_cell_fills_the_disk_fails_that_cell_and_leaves_no_debris(disk, mount):
    if mount is None:
        pytest.skip("needs a real file system to fill between two writes")   # covered above
    disk.fill(2 * PAGE)
    out = disk.root / "sweep"
    res = CliRunner().invoke(cli, [*SWEEP_ARGS, "--out", str(out)])
    one_error_line(res, "1 cells failed", NO_SPACE, code=1, other_lines=True)
    assert disk.contents() == ["sweep", "sweep/sweep.json"]
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["cells"][0]["status"] == "failed" and NO_SPACE in doc["cells"][0]["error"]


@pytest.mark.slow
@pytest.mark.parametrize("figures", [True, False], ids=["figures", "no-figures"])
def test_analyze_on_a_full_disk_leaves_no_empty_folder(disk, tree, figures):
    disk.fill(0)
    out = disk.root / "analysis"
    res = CliRunner().invoke(cli, ["analyze", str(tree), "--out", str(out),
                                   *([] if figures else ["--no-figures"])])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert disk.contents() == []


@pytest.mark.slow
def test_report_on_a_full_disk_leaves_no_truncated_html(disk, tree):
    disk.fill(PAGE)
    out = disk.root / "report.html"
    res = CliRunner().invoke(cli, ["report", str(tree), "-o", str(out)])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert disk.contents() == []


def test_report_over_an_old_one_on_a_full_disk_keeps_the_old_one_whole(disk, tree, monkeypatch):
    import analysis.html_report as H

    monkeypatch.setattr(H, "build_html", lambda *a, **k: "<html>" + "new" * 4000 + "</html>\n")
    out = disk.root / "report.html"
    out.write_text("<html>old</html>\n")
    disk.fill(0)
    res = CliRunner().invoke(cli, ["report", str(tree), "-o", str(out)])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert out.read_text() == "<html>old</html>\n" and disk.contents() == ["report.html"]


@pytest.mark.parametrize("where", ["regress.md", "new/dir/regress.md"])
def test_regress_report_on_a_full_disk_leaves_no_empty_report(disk, tree, where):
    disk.fill(0)
    out = disk.root / where
    res = CliRunner().invoke(cli, ["regress", "--baseline", str(tree), "--candidate", str(tree),
                                   "--report", str(out)])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert disk.contents() == []


@pytest.mark.parametrize("where", ["w.parquet", "new/w.parquet"])
def test_workload_build_on_a_full_disk_leaves_no_partial_file(disk, where):
    disk.fill(0)
    out = disk.root / where
    res = CliRunner().invoke(cli, ["workload", "build", "--requests", "20", "-o", str(out)])
    one_error_line(res, NO_SPACE, str(out), other_lines=True)
    assert disk.contents() == []


# ----------------------------------------------------- the atomic helper

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_a_disk_error_is_one_line_naming_the_path_and_leaves_nothing(tmp_path, code):
    target = tmp_path / "new" / "out.txt"
    with pytest.raises(HbenchError, match=rf"cannot write {target}: {os.strerror(code)}"), \
            atomic.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise OSError(code, os.strerror(code))
    assert list(tmp_path.iterdir()) == []


def test_a_library_error_with_the_errno_only_in_its_message_is_a_disk_error(tmp_path):
    target = tmp_path / "t.parquet"
    with pytest.raises(HbenchError, match=NO_SPACE), atomic.atomic_path(target) as tmp:
        tmp.write_bytes(b"PAR1")
        raise OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_any_other_error_stays_itself_and_leaves_nothing(tmp_path):
    target = tmp_path / "t.txt"
    with pytest.raises(ZeroDivisionError), atomic.atomic_path(target) as tmp:
        tmp.write_text("x")
        1 / 0  # noqa: B018
    assert list(tmp_path.iterdir()) == []


def test_an_atomic_write_replaces_whole_and_keeps_the_usual_permissions(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    atomic.atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and list(tmp_path.iterdir()) == [target]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_a_name_near_the_length_limit_still_gets_a_temporary(tmp_path):
    target = tmp_path / ("x" * 250 + ".csv")
    atomic.atomic_write_text(target, "a,b\n")
    assert target.read_text() == "a,b\n"


def test_a_killed_writers_temporary_is_removed_by_the_next_write_and_a_live_ones_kept(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = tmp_path / f".tmp-{p.pid}-0123abcd-report.html"
    live = tmp_path / f".tmp-{os.getpid()}-0123abcd-report.html"
    other = tmp_path / f".tmp-{p.pid}-0123abcd-other.html"
    for f in (dead, live, other):
        f.write_text("<html>half")
    atomic.atomic_write_text(tmp_path / "report.html", "<html></html>\n")
    assert not dead.exists() and live.exists() and other.exists()


# ------------------------------------------- failed commands leave nothing

def test_sweep_on_ray_without_ray_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    out = tmp_path / "sweep"
    res = CliRunner().invoke(cli, [*SWEEP_ARGS, "--executor", "ray", "--out", str(out)])
    one_error_line(res, "--executor ray needs Ray", other_lines=True)
    assert not out.exists()


def test_sweep_whose_executor_fails_to_start_writes_nothing(tmp_path, monkeypatch):
    import hbench.sweep_local as L

    def broken(*a, **k):
        raise HbenchError("cannot start the workers")
    monkeypatch.setattr(L, "execute_local", broken)
    out = tmp_path / "sweep"
    res = CliRunner().invoke(cli, [*SWEEP_ARGS, "--out", str(out)])
    one_error_line(res, "cannot start the workers", other_lines=True)
    assert not out.exists()


def test_sweep_whose_planning_fails_writes_nothing(tmp_path, monkeypatch):
    def broken(configs):
        raise HbenchError("cannot build the workload")
    monkeypatch.setattr(S, "plan", broken)
    out = tmp_path / "sweep"
    res = CliRunner().invoke(cli, [*SWEEP_ARGS, "--out", str(out)])
    one_error_line(res, "cannot build the workload", other_lines=True)
    assert not out.exists()


def test_sweep_error_in_an_existing_directory_keeps_what_was_there(tmp_path, monkeypatch):
    import hbench.sweep_local as L

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(L, "execute_local", lambda *a, **k: (_ for _ in ()).throw(HbenchError("boom")))
    res = CliRunner().invoke(cli, [*SWEEP_ARGS, "--out", str(out)])
    one_error_line(res, "boom", other_lines=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_capacity_error_leaves_no_out_directory(tmp_path, monkeypatch):
    import hbench.sweep_local as L

    monkeypatch.setattr(L, "execute_local", lambda *a, **k: (_ for _ in ()).throw(HbenchError("boom")))
    out = tmp_path / "cap"
    res = CliRunner().invoke(cli, ["capacity", "--org", "s2", "--budget", "b83", "--rates", "3",
                                   "--seeds", "1", "--requests", "20", "--slo", "ttft_p99<=100s",
                                   "--out", str(out)])
    one_error_line(res, "boom", other_lines=True)
    assert not out.exists()


@pytest.mark.slow
def test_analyze_whose_figures_fail_leaves_no_empty_folder(tmp_path, tree, monkeypatch):
    import analysis.figures as F

    def broken(fig, out_dir, stem):
        raise HbenchError("cannot draw")
    monkeypatch.setattr(F, "save", broken)
    out = tmp_path / "a" / "analysis"
    res = CliRunner().invoke(cli, ["analyze", str(tree), "--out", str(out)])
    one_error_line(res, "cannot draw", other_lines=True)
    assert not (tmp_path / "a").exists()


def test_report_that_fails_leaves_no_new_directory(tmp_path, tree, monkeypatch):
    import analysis.html_report as H

    monkeypatch.setattr(H, "build_html", lambda *a, **k: (_ for _ in ()).throw(HbenchError("no html")))
    out = tmp_path / "new" / "dir" / "report.html"
    res = CliRunner().invoke(cli, ["report", str(tree), "-o", str(out)])
    one_error_line(res, "no html", other_lines=True)
    assert not (tmp_path / "new").exists()


def test_a_run_that_fails_to_write_leaves_no_new_directory(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(results, "_write_json", broken)
    out = tmp_path / "x" / "results"
    res = CliRunner().invoke(cli, [*RUN_ARGS, "--out", str(out)])
    one_error_line(res, os.strerror(errno.EIO), str(out), other_lines=True)
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_compare_results_still_calls_a_verified_tree_identical(tree, tmp_path):
    again = tmp_path / "again"
    assert S.run_sweep(G.expand([], GRID), again).count("ran") == 2
    script = REPO_ROOT / "scripts" / "compare_results.py"
    res = subprocess.run([sys.executable, str(script), str(tree), str(again)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "identical" in res.stdout, res.stdout + res.stderr
    shutil.rmtree(again)
