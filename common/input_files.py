"""Input files checked before they are opened: they exist, are regular, are readable.

Opening a FIFO for reading blocks until a writer appears, so a named pipe
given as ``--gpu``, ``--grid`` or ``--design`` would hang the command forever;
a device file or a directory has no content hbench could mean. `check_input_file`
stats the path first (``stat`` never blocks on a FIFO) and refuses anything
but a regular file, in one `HbenchError` line naming the input.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from common.errors import HbenchError


def check_input_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path if it names an existing, readable regular file
    (symbolic links followed); HbenchError naming ``what`` otherwise."""
    path = Path(path)
    if not str(path):
        raise HbenchError(f"{what}: empty path; give a file")
    try:
        st = path.stat()
    except FileNotFoundError:
        raise HbenchError(f"{what} {path}: cannot read it (no such file)") from None
    except OSError as exc:
        raise HbenchError(f"{what} {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise HbenchError(f"{what} {path} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise HbenchError(f"{what} {path} is not a regular file (a pipe, socket or device); "
                          "give a file")
    if not os.access(path, os.R_OK):
        raise HbenchError(f"{what} {path}: permission denied")
    return path


def read_input_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of a checked input file (`check_input_file`) of at most
    ``max_bytes``; the size is judged from ``stat`` before anything is read."""
    path = check_input_file(path, what)
    size = path.stat().st_size
    if size > max_bytes:
        raise HbenchError(f"{what} {path} is {size:,} bytes; at most {max_bytes:,} are read")
    try:
        with open(path, "rb") as f:
            blob = f.read(max_bytes + 1)
    except OSError as exc:
        raise HbenchError(f"{what} {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(blob) > max_bytes:   # it grew between stat and read
        raise HbenchError(f"{what} {path} is over {max_bytes:,} bytes; at most that many are read")
    return blob


def read_input_text(path: str | os.PathLike, what: str, max_bytes: int) -> str:
    """`read_input_bytes` decoded as UTF-8; a file in another encoding is refused."""
    blob = read_input_bytes(path, what, max_bytes)
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HbenchError(f"{what} {path} is not UTF-8 text (byte {exc.start}: "
                          f"{blob[exc.start:exc.start + 1]!r})") from None
