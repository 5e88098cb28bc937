"""A digest of the source files whose code decides a result: every engine's
version and the runner's (`hbench.runner.recorded_version`) are made of
these, so a result's version, and with it every sweep cell id, changes
whenever code that decides its numbers does.

The files are found by walking imports from a few root modules
(`source_files`), every module of ours each imports, anywhere in its body,
transitively: no list of files is kept by hand. "Ours" is any module under
the source root's top-level packages. Parsing some 60 modules with `ast`
takes a tenth of a second or more, paid by every run, so the digest is
cached under `common.cache.cache_dir`, keyed by the roots and by the
identity (path, size, mtime_ns) of every file the walk read and every
module name it looked up: while none of those changes, the walk would find
the same files with the same bytes, hence the same digest. Any change (an
edit, a new file where a looked-up module name had none) recomputes it. A
cache that cannot be read or written only costs the recomputation.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from common.cache import entry_file, read_entry, write_entry

#: The source root: the directory holding this package.
SOURCE_ROOT = Path(__file__).resolve().parents[1]
#: Bumped when the cache file's layout changes.
_CACHE_FORMAT = 2
_CACHE_KIND = "code-digest"
#: What `_hash_files` gives: 12 lowercase hex digits.
_DIGEST = re.compile(r"[0-9a-f]{12}")


def _packages(root: Path) -> frozenset[str]:
    """The top-level packages under ``root``: what counts as ours."""
    return frozenset(p.name for p in root.iterdir() if (p / "__init__.py").is_file())


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(path: Path, name: str, packages: frozenset[str]) -> set[str]:
    """Our modules (under ``packages``) that ``path`` (module ``name``) imports
    anywhere in its body, with every package on the way (their ``__init__``
    runs too)."""
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
    ours = {m for m in found if m.split(".")[0] in packages}
    return {".".join(m.split(".")[:i]) for m in ours for i in range(1, m.count(".") + 2)}


def _walk(roots: Sequence[str], root: Path) -> dict[str, Path | None]:
    """Every module name the import walk from ``roots`` looks up, with the
    file it resolves to (None: an imported name that is not a module, such as
    a function or a class)."""
    packages = _packages(root)
    seen: dict[str, Path | None] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = seen[name] = _module_file(root, name)
        if path is not None:
            todo.extend(_imports(path, name, packages) - seen.keys())
    return seen


def source_files(roots: Sequence[str], root: Path = SOURCE_ROOT) -> list[Path]:
    """Every source file of ours reachable by imports from ``roots``, sorted."""
    missing = [r for r in roots if _module_file(root, r) is None]
    if missing:
        raise ValueError(f"no module {', '.join(missing)} under {root}")
    return sorted({p for p in _walk(roots, root).values() if p is not None})


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


def _cache_name(roots: Sequence[str], root: Path) -> str:
    return hashlib.sha256("\0".join([str(root), *roots]).encode()).hexdigest()[:16]


def cache_file(roots: Sequence[str], root: Path) -> Path:
    return entry_file(_CACHE_KIND, _cache_name(roots, root))


def _cached(roots: tuple[str, ...], root: Path) -> str | None:
    def fits(entry: dict) -> bool:
        return (entry.get("root") == str(root) and entry.get("roots") == list(roots)
                and isinstance(entry.get("digest"), str)
                and _DIGEST.fullmatch(entry["digest"]) is not None
                and isinstance(entry.get("identity"), list))

    entry = read_entry(_CACHE_KIND, _cache_name(roots, root), _CACHE_FORMAT, fits)
    if entry is None:
        return None
    try:
        return entry["digest"] if _current(root, entry["identity"]) else None
    except (OSError, TypeError, ValueError):   # an entry of the wrong shape
        return None


def compute_digest(roots: Sequence[str], root: Path = SOURCE_ROOT) -> tuple[str, list[list]]:
    """The digest of the sources ``roots`` reach, parsed afresh, and the
    identity it depends on."""
    walked = _walk(roots, root)
    identity = _identity(root, walked)
    files = sorted({p for p in walked.values() if p is not None})
    return _hash_files(root, files), identity


@functools.cache
def code_digest(roots: tuple[str, ...], root: Path = SOURCE_ROOT) -> str:
    """12 hex digits of the hash of every source file ``roots`` reach, from
    the cache when it is current."""
    root = root.resolve()
    digest = _cached(roots, root)
    if digest is not None:
        return digest
    source_files(roots, root)          # a root that is no module is a bug: say so
    digest, identity = compute_digest(roots, root)
    write_entry(_CACHE_KIND, _cache_name(roots, root), _CACHE_FORMAT,
                {"root": str(root), "roots": list(roots), "digest": digest,
                 "identity": identity})
    return digest
