"""Atomic outputs: a file hbench writes appears whole or not at all.

Every output (a report, a figure, a CSV, a workload file, sweep.json, a
profile) is written to a hidden temporary file in the target's own
directory, flushed to disk, and renamed over the target: a reader, a crash
or a full disk never sees a truncated file. `atomic_write_bytes` and
`atomic_write_text` write a value; `atomic_path` yields a temporary path for
libraries that write by name (matplotlib's ``savefig``, pandas' ``to_csv``
and ``to_parquet``) and renames it into place when the block succeeds.

Directories are made only when the first file in them is written, and a
write that fails removes the directories it made, so a failed command leaves
no empty output folder (`new_dirs_removed_on_error` does the same for a
command that writes several files). A disk that is full or failing (ENOSPC,
EIO and their kin) becomes one `HbenchError` naming the path; any other
error propagates unchanged.

The temporary name is ``.tmp-<pid>-<random>-<name>``: hidden (results
readers skip hidden entries), it keeps the target's suffix (matplotlib picks
the format from it) and names its writer, so the next write of the same
target removes what a killed writer left (`remove_stale_temps`).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import HbenchError

TMP_PREFIX = ".tmp-"
_TMP_FILE = re.compile(r"\.tmp-(\d+)-[0-9a-f]{8}-(.+)\Z", re.DOTALL)
_NAME_KEEP = 180          # of the target's name in the temporary one (NAME_MAX is 255)

#: errnos that mean "the disk cannot take this file", reported as bad input
#: (the user's machine), not as a bug.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS,
                         errno.EACCES, errno.EPERM})

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "disk_error",
           "fsync_dir", "new_dirs_removed_on_error", "pid_alive", "remove_stale_temps"]


# ------------------------------------------------------------------ processes

def _proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` from /proc (Linux), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


def _proc_start(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, to 1 s), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rfind(")") + 2:].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def pid_alive(pid: int, wrote_at: float | None = None) -> bool:
    """Whether process ``pid`` still runs, and, given ``wrote_at`` (the mtime
    of something it wrote), could be its writer. A zombie does not run: a
    killed sweep's workers are reparented to an init that may never reap
    them. A process that started after ``wrote_at`` holds a reused pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _proc_state(pid) in ("Z", "X"):
        return False
    started = _proc_start(pid) if wrote_at is not None else None
    return started is None or started <= wrote_at + 2.0   # /proc/stat's btime is whole seconds


# ---------------------------------------------------------------- temp files

def _tmp_for(target: Path) -> Path:
    return target.with_name(f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
                            f"{target.name[-_NAME_KEEP:]}")


def remove_stale_temps(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of ``target`` left by writers that died
    (kill -9 mid-write); return what was removed."""
    target = Path(target)
    removed = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        m = _TMP_FILE.match(name)
        p = target.parent / name
        if m and m.group(2) == target.name[-_NAME_KEEP:]:
            try:
                if not p.is_dir() and not pid_alive(int(m.group(1)), p.stat().st_mtime):
                    p.unlink()
                    removed.append(p)
            except FileNotFoundError:
                pass
    return removed


def disk_error(path: str | os.PathLike, exc: OSError) -> HbenchError | None:
    """The one-line error for a write of ``path`` the disk refused, or None
    when ``exc`` is some other failure (which then stays a bug)."""
    code = exc.errno
    if code is None:   # some libraries only say it in the message: "[Errno 28] ..."
        m = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(m.group(1)) if m else None
    if code not in DISK_ERRNOS:
        return None
    return HbenchError(f"cannot write {path}: {os.strerror(code)}")


def fsync_dir(directory: str | os.PathLike) -> None:
    """Flush a directory's entries (a rename into it) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_parents(directory: Path) -> list[Path]:
    """``mkdir -p directory``; the directories it made, outermost first."""
    made = []
    p = directory
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    made.reverse()
    for d in made:
        try:
            d.mkdir()
        except FileExistsError:
            pass
    return made


def _remove_empty(dirs: list[Path]) -> None:
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            return


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block returns, the
    file written there is flushed and renamed onto ``path``. On any error the
    temporary file, and the directories made for it, are removed; a disk
    error becomes one `HbenchError` naming ``path``."""
    target = Path(path)
    made: list[Path] = []
    tmp = _tmp_for(target)
    if target.is_dir() and not target.is_symlink():   # a rename cannot replace it
        raise HbenchError(f"cannot write {target}: it is a directory; remove it or write elsewhere")
    try:
        try:
            made = _make_parents(target.parent)
            remove_stale_temps(target)
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, target)
            fsync_dir(target.parent)
        except BaseException:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            _remove_empty(made)
            raise
    except OSError as exc:
        err = disk_error(target, exc)
        if err is None:
            raise
        raise err from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see `atomic_path`); return the path."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see `atomic_path`); return the path."""
    return atomic_write_bytes(path, text.encode(encoding))


# ---------------------------------------------------------------- directories

@contextmanager
def new_dirs_removed_on_error(path: str | os.PathLike) -> Iterator[Path]:
    """For a command that writes several files under ``path``: if the block
    fails, remove every directory at or below the first ancestor of ``path``
    that did not exist before, as long as it is empty (files already written
    whole stay; an empty folder is all that goes)."""
    path = Path(path).absolute()
    first_new = None
    p = path
    while not p.exists() and p != p.parent:
        first_new = p
        p = p.parent
    try:
        yield Path(path)
    except BaseException:
        if first_new is not None and first_new.is_dir():
            for dirpath, _dirs, _files in os.walk(first_new, topdown=False):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
        raise
