"""Installed distributions' versions, remembered in the cache directory.

Every manifest records the versions of a dozen distributions
(`harness.provenance.package_versions`). Asking `importlib.metadata` costs
a short run about 25 ms: importing it (with `email`, which parses the
metadata files) and scanning every directory on `sys.path` for each name.
Its answer depends only on what those scans and reads see, so it is kept
under `common.cache.cache_dir`, keyed by a hash of

- the names asked for, the Python build, the working directory, `sys.path`
  in order and the finders on `sys.meta_path`;
- the identity (inode, size, mtime_ns, ctime_ns) of every `sys.path` entry:
  installing, removing or upgrading a distribution adds or removes a
  ``*.dist-info`` (or ``*.egg-info``) entry in its directory, which changes
  the directory's mtime (`importlib.metadata`'s own lookup cache is keyed
  on it too);

and the kept entry lists the identity of each distribution's metadata
directory and files (``METADATA``, ``PKG-INFO``), checked on every read, so
that a file edited in place is read afresh. Only distributions found on
`sys.path` are kept; another finder's are looked up every time.

File times tick coarsely (a few milliseconds on ext4), so a path changed
less than `SETTLE_NS` before the look-up could change again without its
mtime moving: such an answer is used but not kept, as git treats "racily
clean" index entries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common.cache import read_entry, write_entry

#: Bumped when the layout of a kept entry or what its key covers changes.
FORMAT = 2
KIND = "installed-versions"
#: What a kept version may look like (PEP 440 and local labels): printable, no blanks.
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
#: How long a path must have stood unchanged before an answer read through it is kept.
SETTLE_NS = 2 * 10**9
#: The files `importlib.metadata` reads a distribution's version from.
METADATA_FILES = ("METADATA", "PKG-INFO")

Identity = list | None   # [inode, size, mtime_ns, ctime_ns], or None for a missing path


def identity(path: str) -> Identity:
    """What changes when ``path`` is written, replaced or removed."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _finder_names() -> list[str]:
    return [f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', type(f).__qualname__)}"
            for f in sys.meta_path]


def environment_key(names: Sequence[str]) -> tuple[str, list[Identity]]:
    """The hash of what the look-up of ``names`` scans, and the identities of
    the `sys.path` entries in it."""
    cwd = os.getcwd()
    path = [str(p) for p in sys.path]
    entries = [identity(os.path.join(cwd, p or ".")) for p in path]
    text = json.dumps([FORMAT, list(names), sys.version, sys.executable, cwd, path,
                       _finder_names(), entries])
    return hashlib.sha256(text.encode()).hexdigest(), entries


def look_up(names: Sequence[str]) -> tuple[dict[str, str | None], dict[str, Identity] | None]:
    """Each name's installed version (None where none is installed), read by
    `importlib.metadata`, and the identities of the metadata paths read (None
    when a distribution came from elsewhere than a directory on `sys.path`)."""
    from importlib import metadata  # ~15 ms with email's parser: only when not kept

    versions: dict[str, str | None] = {}
    files: dict[str, Identity] | None = {}
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
            continue
        versions[name] = dist.version   # what metadata.version(name) returns
        where = getattr(dist, "_path", None)   # a PathDistribution's dist-info directory
        if not isinstance(where, Path) or files is None:
            files = None
            continue
        for path in (where, *(where / f for f in METADATA_FILES)):
            files[str(path)] = identity(str(path))
    return versions, files


def _settled(identities: list[Identity], now_ns: int) -> bool:
    return all(i is None or max(i[2], i[3]) < now_ns - SETTLE_NS for i in identities)


def _kept(key: str, names: Sequence[str]) -> dict[str, str | None] | None:
    def fits(entry: dict) -> bool:
        versions, files = entry.get("versions"), entry.get("files")
        return (entry.get("key") == key and isinstance(versions, dict)
                and list(versions) == list(names)
                and all(v is None or (isinstance(v, str) and VERSION.fullmatch(v))
                        for v in versions.values())
                and isinstance(files, dict))

    entry = read_entry(KIND, key, FORMAT, fits)
    if entry is None or any(identity(path) != ident for path, ident in entry["files"].items()):
        return None
    return entry["versions"]


def installed_versions(names: Sequence[str]) -> dict[str, str | None]:
    """``{name: version or None}`` for ``names``, as `importlib.metadata.version`
    reads them now: from the cache directory while nothing it read has changed."""
    started_ns = time.time_ns()
    try:
        key, entries = environment_key(names)
    except OSError:   # the working directory is gone: nothing to key the answer on
        return look_up(names)[0]
    versions = _kept(key, names)
    if versions is not None:
        return versions
    versions, files = look_up(names)
    if files is not None and _settled([*entries, *files.values()], started_ns):
        write_entry(KIND, key, FORMAT, {"key": key, "versions": versions, "files": files})
    return versions
