"""Where hbench keeps what it can recompute: ``$HBENCH_CACHE_DIR`` if set,
else ``$XDG_CACHE_HOME/hbench``, else ``~/.cache/hbench``.

Everything under it (the parsed ShareGPT pairs, derived workloads, the KS
test p-values of arrival streams, the simulator's source digest, the
installed packages' versions, downloaded datasets) is a cache: deleting it
costs time, never a result. Nor may editing it change a result, so nothing
is trusted because its shape fits:

- Small values are one JSON object a file, ``KIND/NAME.json`` (`read_entry`,
  `write_entry`): ``{"format", "value", "digest"}``, the digest the sha256
  of the kind, the name (which hashes the inputs the value answers), the
  layout's format and the value itself. A reader checks the
  digest and then the caller's range check (a p-value in [0, 1], a digest of
  12 hex digits).
- Large files (Arrow tables) are kept beside such an entry recording their
  size and sha256 (`keep_file`, ``NAME.json`` beside ``NAME.arrow``), and read only through `verified_bytes`
  or `verified_map`, which hash the very bytes they hand back.

Every read opens only a regular file (a FIFO would block the reader forever,
a link to ``/dev/zero`` never ends) and reads at most a stated number of
bytes (`common.input_files`, the results readers' helper). An absent entry,
or one of an older layout, is computed again in silence; one that is there
and does not verify (not a regular file, too large, torn, its digest or its
value wrong) is computed again with one line on stderr saying so.

The digest is unkeyed: it catches rot, a torn or hand-edited entry and a
value copied under another key, not a forger who recomputes it with this
code; the cache directory is trusted as much as the user's home is.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from common.atomic import atomic_write_text
from common.errors import HbenchError
from common.input_files import check_input_file, read_input_bytes

#: Largest JSON entry read: hbench's entries hold a few kilobytes.
MAX_ENTRY_BYTES = 4 * 2**20
_NOTED: set[str] = set()


def cache_dir() -> Path:
    if os.environ.get("HBENCH_CACHE_DIR"):
        return Path(os.environ["HBENCH_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hbench"


def entry_file(kind: str, name: str) -> Path:
    """Where the entry ``name`` of ``kind`` is kept."""
    return cache_dir() / kind / f"{name}.json"


def recomputed(path: Path, why: str) -> None:
    """Say, once per file and process, that the cache entry ``path`` did not
    verify (``why``) and is being computed again: one line on stderr."""
    if str(path) in _NOTED:
        return
    _NOTED.add(str(path))
    print(f"hbench: ignoring cache entry {path}: {why}; computing it again", file=sys.stderr)


def _refused(path: Path, exc: HbenchError) -> None:
    """`recomputed` for a file `common.input_files` refused (its message names the path)."""
    recomputed(path, str(exc).split(f"{path}", 1)[-1].strip(" :").removesuffix("; give a file"))


def _digest(kind: str, name: str, fmt: int, value: dict) -> str:
    text = json.dumps([kind, name, fmt, value], sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _present(path: Path) -> bool:
    """Whether anything (a file, a pipe, a dangling link) is at ``path``."""
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def read_entry(kind: str, name: str, fmt: int,
               check: Callable[[dict], bool] = lambda entry: True) -> dict | None:
    """The JSON object kept as ``kind/name`` with layout ``fmt``, if its digest
    and ``check`` (the caller's test of the value's shape and range) hold;
    else None, with one line (`recomputed`) unless the entry is absent or of
    another layout."""
    return _read(entry_file(kind, name), kind, name, fmt, check)


def write_entry(kind: str, name: str, fmt: int, entry: dict) -> None:
    """Keep ``entry`` as ``kind/name`` with its ``format`` and ``digest``, atomically.

    A cache directory that cannot be written only costs the recomputation, so
    that is not an error."""
    _write(entry_file(kind, name), kind, name, fmt, entry)


def _read(path: Path, kind: str, name: str, fmt: int, check: Callable[[dict], bool]) -> dict | None:
    if not _present(path):
        return None
    try:
        stored = json.loads(read_input_bytes(path, "cache entry", MAX_ENTRY_BYTES))
    except HbenchError as exc:   # not a regular file, too large, unreadable
        _refused(path, exc)
        return None
    except ValueError:
        recomputed(path, "not JSON")
        return None
    if not isinstance(stored, dict) or "format" not in stored:
        recomputed(path, "not a cache entry")
        return None
    if stored["format"] != fmt:   # an older layout: computed again, nothing is wrong
        return None
    value = stored.get("value")
    if not isinstance(value, dict):
        recomputed(path, "not a cache entry")
        return None
    try:
        ok = stored.get("digest") == _digest(kind, name, fmt, value)
    except ValueError:   # NaN or Infinity in the value
        ok = False
    if not ok:
        recomputed(path, "its digest does not match its value")
        return None
    try:
        valid = check(value)
    except (TypeError, ValueError, KeyError, AttributeError):
        valid = False
    if not valid:
        recomputed(path, "its value is out of range")
        return None
    return value


def _write(path: Path, kind: str, name: str, fmt: int, entry: dict) -> None:
    try:
        text = json.dumps({"format": fmt, "value": entry,
                           "digest": _digest(kind, name, fmt, entry)}, allow_nan=False)
        atomic_write_text(path, text)
    except (OSError, ValueError, HbenchError):   # a read-only or full cache dir only costs speed
        pass


# ------------------------------------------------------------ large files

#: The layout of `keep_file`'s records, and the kind their digests name.
FILE_FORMAT = 1
_FILE_KIND = "file"


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def record_file(path: Path) -> Path:
    """Where the size and sha256 of the cache file ``path`` are kept: beside it."""
    return path.with_suffix(".json")


def keep_file(path: Path) -> None:
    """Record the size and sha256 of the cache file ``path`` (just written)
    beside it (`record_file`), which its readers verify it against."""
    try:
        entry = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    except OSError:
        return
    _write(record_file(path), _FILE_KIND, path.name, FILE_FORMAT, entry)


def _file_record(path: Path, max_bytes: int) -> dict | None:
    """The verified record of the cache file ``path``, or None: ``path`` is
    not there, or (with a line) its record is missing or does not verify."""
    if not _present(path):
        return None

    def fits(e: dict) -> bool:
        return (type(e.get("bytes")) is int and 0 <= e["bytes"] <= max_bytes
                and isinstance(e.get("sha256"), str))

    record = _read(record_file(path), _FILE_KIND, path.name, FILE_FORMAT, fits)
    if record is None and not _present(record_file(path)):
        recomputed(path, "no record of its size and sha256")
    return record


def verified_bytes(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of the cache file ``path`` if they are what `keep_file`
    recorded (a regular file, at most ``max_bytes``, same size and sha256); else None."""
    record = _file_record(path, max_bytes)
    if record is None:
        return None
    try:
        data = read_input_bytes(path, "cache file", record["bytes"])
    except HbenchError as exc:
        _refused(path, exc)
        return None
    if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
        recomputed(path, "its bytes do not match their recorded sha256")
        return None
    return data


def verified_map(path: Path, max_bytes: int) -> mmap.mmap | None:
    """`verified_bytes` as a read-only memory map, for a file too large to copy:
    the map's own bytes are hashed, then its pages handed back (only the pages
    a reader then touches become resident again)."""
    record = _file_record(path, max_bytes)
    if record is None:
        return None
    try:
        check_input_file(path, "cache file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO swapped in since: no wait
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != record["bytes"] or not st.st_size:
                recomputed(path, f"{st.st_size:,} bytes where {record['bytes']:,} are recorded")
                return None
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
    except HbenchError as exc:
        _refused(path, exc)
        return None
    except OSError as exc:
        recomputed(path, exc.strerror or type(exc).__name__)
        return None
    if hashlib.sha256(mapped).hexdigest() != record["sha256"]:
        mapped.close()
        recomputed(path, "its bytes do not match their recorded sha256")
        return None
    if hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)
    return mapped
