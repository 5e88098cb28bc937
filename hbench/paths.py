"""Output paths checked before any work: a command that will write somewhere
finds out at start, in one line, that it cannot.

Both checks create nothing that stays: a directory that does not exist yet is
judged by its nearest existing ancestor, which must be a writable directory
(tested by creating and removing an anonymous temporary file there, which
also catches read-only file systems and root-owned trees that a permission
bit check would miss).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from common.errors import HbenchError


def _probe(directory: Path, flag: str, path: Path) -> None:
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise HbenchError(f"{flag} {path}: cannot write in {directory} "
                          f"({exc.strerror or type(exc).__name__})") from None


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a Path if it is, or could be created as, a writable directory."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise HbenchError(f"{flag} {path} exists and is not a directory")
    anchor = _nearest_existing(path.absolute())
    if not anchor.is_dir():
        raise HbenchError(f"{flag} {path}: {anchor} is a file, not a directory")
    _probe(anchor, flag, path)
    return path


def check_writable_file(path: str | os.PathLike, flag: str = "--output") -> Path:
    """``path`` as a Path if a file can be written there (replacing a file is fine)."""
    path = Path(path)
    if path.is_dir():
        raise HbenchError(f"{flag} {path} is a directory; give a file name")
    anchor = _nearest_existing(path.absolute().parent)
    if not anchor.is_dir():
        raise HbenchError(f"{flag} {path}: {anchor} is a file, not a directory")
    _probe(anchor, flag, path)
    return path
