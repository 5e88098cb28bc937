"""The simulator's source digest: a hash of every source file of ours its
numbers depend on, so that `SimEngine.version` (and with it every cell id)
changes whenever the simulator's code does.

The files are found by walking imports (`source_files`), which parses some
60 modules with `ast`: a tenth of a second or more, paid by every run. So
the digest is cached under `common.cache.cache_dir`, keyed by the identity
(path, size, mtime_ns) of every file the walk read and by every module name
it looked up: while none of those changes, the walk would find the same
files with the same bytes, hence the same digest. Any change (an edit, a new
file where a looked-up module name had none) recomputes it. A cache that
cannot be read or written only costs the recomputation.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
import stat
from pathlib import Path

from common.cache import entry_file, read_entry, write_entry
from workloads.kinds import WORKLOAD_KINDS

#: Modules whose code decides a simulated run's numbers: the simulator, the
#: summary metrics, the runner (the application's, which records the run) and
#: the workload builder with its derivers (named in `WORKLOAD_KINDS`, which the
#: builder imports by name, so an import walk alone would miss them). The
#: digest hashes these and every module of ours they import (found by
#: `source_files`, within `_PACKAGES`), so no list of files has to be kept by
#: hand.
_ROOTS = ("adapters.sim.engine", "harness.metrics", "hbench.runner", "workloads.build",
          "workloads.io", *(module for module, _ in WORKLOAD_KINDS.values()))
_PACKAGES = ("adapters", "common", "harness", "hbench", "workloads")
#: Bumped when the cache file's layout changes.
_CACHE_FORMAT = 2
_CACHE_KIND = "sim-digest"
#: What `_hash_files` gives: 12 lowercase hex digits.
_DIGEST = re.compile(r"[0-9a-f]{12}")


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(path: Path, name: str) -> set[str]:
    """Our modules that ``path`` (module ``name``) imports anywhere in its body,
    with every package on the way (their ``__init__`` runs too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    ours = {m for m in found if m.split(".")[0] in _PACKAGES}
    return {".".join(m.split(".")[:i]) for m in ours for i in range(1, m.count(".") + 2)}


def _walk(root: Path) -> dict[str, Path | None]:
    """Every module name the import walk from `_ROOTS` looks up, with the
    file it resolves to (None: an imported name that is not a module, such as
    a function or a class)."""
    seen: dict[str, Path | None] = {}
    todo = list(_ROOTS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = seen[name] = _module_file(root, name)
        if path is not None:
            todo.extend(_imports(path, name) - seen.keys())
    return seen


def source_files(root: Path) -> list[Path]:
    """Every source file of ours reachable by imports from `_ROOTS`, sorted."""
    return sorted({p for p in _walk(root).values() if p is not None})


def _hash_files(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _identity(root: Path, walked: dict[str, Path | None]) -> list[list]:
    """What the digest depends on, in a form cheap to check again: per looked-up
    module name, its file (relative to ``root``) with size and mtime_ns, or None."""
    out = []
    for name in sorted(walked):
        path = walked[name]
        if path is None:
            out.append([name, None, None, None])
        else:
            st = path.stat()
            out.append([name, path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns])
    return out


def _current(root: Path, identity: list[list]) -> bool:
    """Whether every looked-up name still resolves to the same file, unchanged
    (`_module_file`'s lookup, on strings: it runs for ~300 names in every run)."""
    base = str(root)
    for name, rel, size, mtime_ns in identity:
        stem = name.replace(".", "/")
        for found in (f"{stem}.py", f"{stem}/__init__.py"):
            st = _regular_file(os.path.join(base, found))
            if st is not None:
                break
        else:
            found = None
        if found != rel:
            return False
        if st is not None and (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            return False
    return True


def _regular_file(path: str) -> os.stat_result | None:
    """``path``'s stat if it is a regular file (``Path.is_file``), else None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _cache_name(root: Path) -> str:
    return hashlib.sha256(str(root).encode()).hexdigest()[:16]


def _cache_file(root: Path) -> Path:
    return entry_file(_CACHE_KIND, _cache_name(root))


def _cached(root: Path) -> str | None:
    def fits(entry: dict) -> bool:
        return (entry.get("root") == str(root) and isinstance(entry.get("digest"), str)
                and _DIGEST.fullmatch(entry["digest"]) is not None
                and isinstance(entry.get("identity"), list))

    entry = read_entry(_CACHE_KIND, _cache_name(root), _CACHE_FORMAT, fits)
    if entry is None:
        return None
    try:
        return entry["digest"] if _current(root, entry["identity"]) else None
    except (OSError, TypeError, ValueError):   # an entry of the wrong shape
        return None


def compute_digest(root: Path) -> tuple[str, list[list]]:
    """The digest of ``root``'s sources, parsed afresh, and the identity it depends on."""
    walked = _walk(root)
    identity = _identity(root, walked)
    files = sorted({p for p in walked.values() if p is not None})
    return _hash_files(root, files), identity


@functools.cache
def source_digest(root: Path | None = None) -> str:
    """12 hex digits of the sources' hash, from the cache when it is current."""
    root = (root or Path(__file__).resolve().parents[2]).resolve()
    digest = _cached(root)
    if digest is not None:
        return digest
    digest, identity = compute_digest(root)
    write_entry(_CACHE_KIND, _cache_name(root), _CACHE_FORMAT,
                {"root": str(root), "digest": digest, "identity": identity})
    return digest
