"""Output paths checked before any work: a command that will write somewhere
finds out at start, in one line, that it cannot.

Both checks create nothing that stays: a directory that does not exist yet is
judged by its nearest existing ancestor, which must be a writable directory
(tested by creating and removing an anonymous temporary file there, which
also catches read-only file systems and root-owned trees that a permission
bit check would miss). Before that, the path itself is judged by what
``mkdir`` or ``open`` would later trip on: an empty name, a symbolic link
that leads nowhere (dangling, or a loop), a name component longer than the
file system allows (NAME_MAX), a whole path longer than PATH_MAX, a file
where a directory is expected or the reverse.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from common.errors import HbenchError

#: What POSIX promises when the file system does not say (Linux ext4, tmpfs, xfs).
DEFAULT_NAME_MAX = 255
DEFAULT_PATH_MAX = 4096


def _probe(directory: Path, flag: str, path: Path) -> None:
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise HbenchError(f"{flag} {path}: cannot write in {directory} "
                          f"({exc.strerror or type(exc).__name__})") from None


def _stat(p: Path, flag: str, path: Path) -> os.stat_result | None:
    """``p``'s stat (links followed), None when nothing is there; refuses a
    dangling link, a link loop, or a path that cannot be looked at."""
    try:
        return p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise HbenchError(f"{flag} {path}: {p} is a symbolic link to nothing "
                              "(dangling); remove it or give another path") from None
        return None
    except NotADirectoryError:
        return None   # a file above it: the caller's anchor check names it
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HbenchError(f"{flag} {path}: {p} is a symbolic link loop") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise HbenchError(f"{flag} {path}: name too long for the file system") from None
        raise HbenchError(f"{flag} {path}: cannot look at {p} "
                          f"({exc.strerror or type(exc).__name__})") from None


def _nearest_existing(path: Path, flag: str, shown: Path) -> tuple[Path, os.stat_result]:
    p = path
    while True:
        st = _stat(p, flag, shown)
        if st is not None:
            return p, st
        if p == p.parent:
            raise HbenchError(f"{flag} {shown}: no existing directory above it")
        p = p.parent


def _check_name(path: Path, flag: str, shown: Path, anchor: Path) -> None:
    """Refuse names that ``mkdir`` / ``open`` would reject as too long."""
    try:
        name_max = os.pathconf(anchor, "PC_NAME_MAX")
        path_max = os.pathconf(anchor, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = DEFAULT_NAME_MAX, DEFAULT_PATH_MAX
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise HbenchError(f"{flag}: the name {part[:40]}... is {len(os.fsencode(part))} bytes; "
                              f"the file system allows at most {name_max}")
    if len(os.fsencode(path)) >= path_max:
        raise HbenchError(f"{flag}: the path is {len(os.fsencode(path)):,} bytes; "
                          f"the file system allows at most {path_max - 1}")


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a Path if it is, or could be created as, a writable directory."""
    shown, anchor = _dir_anchor(path, flag)
    _probe(anchor, flag, shown)
    return shown


def check_dir_path(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a Path if it is, or could be created as, a directory; its
    writability is not tested (for a command that only reads there, such as
    ``sweep --dry-run``)."""
    return _dir_anchor(path, flag)[0]


def _dir_anchor(path: str | os.PathLike, flag: str) -> tuple[Path, Path]:
    """(``path``, its nearest existing directory) after the name checks."""
    shown = Path(path)
    if not os.fspath(path).strip():
        raise HbenchError(f"{flag} is empty; give a directory")
    full = shown.absolute()
    anchor, st = _nearest_existing(full, flag, shown)
    _check_name(full, flag, shown, anchor)
    if anchor == full and not stat.S_ISDIR(st.st_mode):
        raise HbenchError(f"{flag} {shown} exists and is not a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise HbenchError(f"{flag} {shown}: {anchor} is a file, not a directory")
    return shown, anchor


def check_writable_file(path: str | os.PathLike, flag: str = "--output") -> Path:
    """``path`` as a Path if a file can be written there (replacing a regular
    file is fine; a directory, a FIFO or a device is not)."""
    shown = Path(path)
    if not os.fspath(path).strip():
        raise HbenchError(f"{flag} is empty; give a file name")
    full = shown.absolute()
    target = _stat(full, flag, shown)
    if target is not None and stat.S_ISDIR(target.st_mode):
        raise HbenchError(f"{flag} {shown} is a directory; give a file name")
    if target is not None and not stat.S_ISREG(target.st_mode):
        raise HbenchError(f"{flag} {shown} is not a regular file (a pipe, socket or device)")
    anchor, st = _nearest_existing(full.parent, flag, shown)
    _check_name(full, flag, shown, anchor)
    if not stat.S_ISDIR(st.st_mode):
        raise HbenchError(f"{flag} {shown}: {anchor} is a file, not a directory")
    _probe(anchor, flag, shown)
    return shown
