"""Self-describing run directories: written atomically, read back with checks.

One run is one directory ``<out_root>/<run_id>/``::

    manifest.json     what ran: config, workload hash, budget, engine, code
                      revision, packages, host; "status": "complete" and
                      "files": the size and sha256 of each file below
    summary.json      `harness.metrics.summarize` (flat scalars)
    requests.parquet  `harness.per_request.per_request_table` (one row per request)
    steps.parquet     the engine's per-step rows (`harness.step_table.write_steps`:
                      a simulated run's a row group per packed chunk)

A run directory either exists complete or not at all: everything is written
into a hidden sibling ``.tmp-<run_id>-<pid>`` and renamed into place last, so
an interrupted write never leaves a directory that looks like a run.
The manifest, written last, is the completion marker: it records each other
file's size and sha256, so a file damaged afterwards (truncated, emptied,
edited) is found, its run id is the content address of its configuration
(`harness.run_address`), so a configuration edited afterwards is found too,
and it is sealed last (`harness.seal`: the sha256 of all its other
fields), so an edit to any other field is found as well.
`is_complete` checks sizes, hashes, the address and the seal (a sweep then
reruns the cell); `read_run` checks sizes, the address and the seal, and each
file's hash when it reads it, and refuses a damaged run (`DamagedRun`). A
manifest without the files' record or the seal (results written before they
existed) cannot be verified and is refused the same way. Every file is
opened only if it is a regular file and read no further than its recorded
size; a manifest no further than `MAX_MANIFEST_BYTES`.
This module is the one reader of run directories: `read_run` opens one and
returns a `Run` (manifest, summary, lazily loaded tables, the checked
metadata as attributes), `iter_runs` reads every run under a root,
`is_complete` is a sweep's "this cell is done" test, and `check_pairable`
refuses to compare runs whose checked metadata (schema version, engine,
engine version, workload hash) disagree. All of them skip hidden directories;
`read_run` refuses incomplete runs and ones written under another
`SCHEMA_VERSION`.

JSON files hold no NaN or infinity (written as null) and no numpy types.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import warnings
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from common.atomic import (
    TMP_PREFIX,
    atomic_write_text,
    disk_error,
    fsync_path,
    new_dirs_removed_on_error,
    pid_alive,
)
from common.cache import file_sha256
from common.errors import HbenchError
from common.input_files import read_input_bytes
from common.safe_json import load_json_object, loads_json
from common.tree_walk import walk
from harness import metrics, per_request, provenance
from harness.config import RunConfig
from harness.records import EngineRun
from harness.results_schema import check_manifest, check_summary, read_table
from harness.run_address import address_problem, input_files
from harness.seal import SEAL, seal_problem, sealed
from harness.step_table import write_steps

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
REQUESTS = "requests.parquet"
STEPS = "steps.parquet"
RUN_FILES = (MANIFEST, SUMMARY, REQUESTS, STEPS)
CHECKED_FILES = (SUMMARY, REQUESTS, STEPS)   # what the manifest's "files" record covers
FILES = "files"                   # manifest key: {name: {"bytes": int, "sha256": hex}}
DROPPED = "dropped_files"         # manifest key: files removed on purpose (`drop_files`)
#: Largest manifest read: hbench writes a few kilobytes; a manifest padded to
#: hundreds of megabytes would cost every reader seconds and gigabytes.
MAX_MANIFEST_BYTES = 4 * 2**20


# ---------------------------------------------------------------- identifiers

def free_run_id(out_root: Path, run_id: str) -> str:
    """``run_id``, or with ``-2``, ``-3``, ... the first id no entry under
    ``out_root`` has yet (a finished run, or a writer's ``.tmp-<id>-<pid>``)."""
    out_root = Path(out_root)
    taken = {p.name for p in out_root.iterdir()} if out_root.is_dir() else set()

    def used(candidate: str) -> bool:
        prefix = f"{TMP_PREFIX}{candidate}-"
        return candidate in taken or any(t.startswith(prefix) and t[len(prefix):].isdigit()
                                         for t in taken)

    n, candidate = 1, run_id
    while used(candidate):
        n += 1
        candidate = f"{run_id}-{n}"
    return candidate


# ----------------------------------------------------------------------- JSON

def to_jsonable(obj):
    """``obj`` with numpy scalars/arrays, tuples and paths turned into plain JSON
    values and every non-finite float into None. Unknown types raise TypeError."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to a results JSON file: {obj!r}")


def _write_json(path: Path, obj) -> None:
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


# ---------------------------------------------------------------------- write

def write_run(
    out_root: Path,
    *,
    run_id: str,
    config: RunConfig,
    run: EngineRun,
    workload_hash: str,
    workload_meta: dict,
    budget: dict,
    engine_name: str,
    engine_version: str,
    weights_bytes: int = 0,
    extra_manifest: dict | None = None,
) -> Path:
    """Write one complete run directory under ``out_root`` and return its path.

    Refuses (HbenchError) to overwrite an existing run. The manifest is the
    last file written inside the temporary directory, and the directory is
    renamed into place only after every file is on disk; on any failure or
    interrupt the temporary directory is removed and the error propagates.
    """
    if not run_id or run_id.startswith(".") or "/" in run_id or os.sep in run_id:
        raise HbenchError(f"invalid run id {run_id!r}: must be a plain name not starting with '.'")
    out_root = Path(out_root)
    final = out_root / run_id
    if final.exists():
        raise HbenchError(f"run directory {final} already exists; refusing to overwrite it")

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "config": config.to_dict(),
        "workload_hash": workload_hash,
        "workload_meta": workload_meta,
        "git_commit": provenance.git_commit(Path(__file__).resolve().parent),
        "packages": provenance.package_versions(),
        "host": provenance.host_info(),
        "engine": engine_name,
        "engine_version": engine_version,
        "engine_info": run.engine_info,
        "org": config.org,
        "budget": budget,
        "input_files": input_files(config),
        # the weights are part of peak_mem_total_bytes; the state is the rest
        "weights_bytes": int(weights_bytes),
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "status": "complete",
    }
    clash = set(extra_manifest or {}) & set(manifest)
    if clash:
        raise ValueError(f"extra_manifest may not replace core keys: {sorted(clash)}")
    manifest.update(extra_manifest or {})
    # Serialize before touching the disk so a bad value fails without debris.
    manifest = to_jsonable(manifest)
    columns = per_request.request_columns(run)
    summary = to_jsonable(metrics.summarize(run, weights_bytes=weights_bytes, config=config,
                                            tables=(columns, None)))
    requests = per_request.per_request_table(run, columns)

    try:
        with new_dirs_removed_on_error(out_root):
            _write_tmp_and_rename(out_root, run_id, final, manifest, summary, requests,
                                  run.steps)
    except OSError as exc:
        err = disk_error(final, exc)
        if err is None:
            raise
        raise err from None
    return final


def _file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _write_tmp_and_rename(out_root: Path, run_id: str, final: Path, manifest: dict, summary: dict,
                          requests, steps) -> None:
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = out_root / f"{TMP_PREFIX}{run_id}-{os.getpid()}"
    if tmp.exists():  # only this process (same pid, same id) names it so
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _write_json(tmp / SUMMARY, summary)
        pq.write_table(requests, tmp / REQUESTS)
        write_steps(steps, tmp / STEPS)   # a chunk at a time, not as one frame
        # The completion marker, last: what every other file must still be.
        _write_json(tmp / MANIFEST, sealed({**manifest, FILES: {n: _file_record(tmp / n)
                                                                for n in CHECKED_FILES}}))
        for name in RUN_FILES:
            fsync_path(tmp / name)
        if final.exists():
            raise HbenchError(f"run directory {final} already exists; refusing to overwrite it")
        try:
            os.rename(tmp, final)
        except OSError as exc:
            # Another writer renamed its directory into place between our
            # check and our rename: theirs stands, ours is removed below.
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise HbenchError(f"run directory {final} already exists; "
                                  "refusing to overwrite it") from None
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(out_root)


# ---------------------------------------------------- completeness, cleanup

def served_nothing(run_dir: Path) -> bool:
    """A complete run directory in which no measured request finished (every
    one failed or was cancelled): a result, but not a measurement."""
    try:
        summary = load_json_object(Path(run_dir) / SUMMARY, "summary")
    except HbenchError:
        return False
    return summary.get("requests", 0) > 0 and summary.get("finished", 0) == 0


def is_done(run_dir: Path) -> bool:
    """What a sweep skips on resume: a complete run (`is_complete`) that served something."""
    return is_complete(run_dir) and not served_nothing(run_dir)


def why_not_done(run_dir: Path) -> str | None:
    """Why a sweep must rerun the cell in ``run_dir`` (which exists), in a few
    words; None when it is done (`is_done`)."""
    run_dir = Path(run_dir)
    manifest = _load_manifest(run_dir)
    if manifest is None:
        return f"{MANIFEST} is missing, unreadable or not marked complete"
    absent = [n for n in RUN_FILES if not (run_dir / n).is_file()]
    if absent:
        return f"{absent[0]} is missing"
    try:
        problem = _damage(run_dir, manifest, hashes=True)
    except DamagedRun as exc:
        problem = f"{MANIFEST} has a malformed {FILES!r} record ({exc})"
    if problem:
        return problem
    return "no request finished" if served_nothing(run_dir) else None


def clean_stale(out: Path) -> list[Path]:
    """Remove ``.tmp-*`` directories and files directly under ``out`` left by
    processes that are dead (or zombies, or whose pid now names a process
    started after the entry was written); return what was removed. A run's
    temporary directory ends in its writer's pid (``.tmp-<run id>-<pid>``),
    an atomic file's temporary begins with it (`common.atomic`)."""
    out = Path(out)
    removed: list[Path] = []
    if not out.is_dir():
        return removed
    for p in sorted(out.glob(f"{TMP_PREFIX}*")):
        try:
            is_dir, mtime = p.is_dir(), p.stat().st_mtime
        except FileNotFoundError:
            continue
        m = re.search(r"-(\d+)$", p.name) if is_dir else re.match(r"\.tmp-(\d+)-", p.name)
        if m is not None and pid_alive(int(m.group(1)), mtime):
            continue
        if is_dir:
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def remove_run_temps(out: Path, run_id: str) -> list[Path]:
    """Remove every ``.tmp-<run_id>-<pid>`` directory under ``out``, whatever
    its pid; return what was removed. Only for a caller that holds the run's
    lock (`hbench.sweep.cell_lock`): only the lock's holder writes that run,
    and the kernel releases a killed holder's lock only as it exits, once it
    can write nothing more. So what is left is a dead writer's, even where
    `clean_stale` still saw its pid alive: a SIGKILLed sweep's worker that had
    not yet finished exiting when the next sweep began."""
    removed = []
    for p in Path(out).glob(f"{TMP_PREFIX}{run_id}-*"):
        if p.name[len(TMP_PREFIX) + len(run_id) + 1:].isdigit() and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


# ----------------------------------------------------------------------- read

# A run is readable with its manifest and summary; the tables are loaded on
# first use (a CI baseline keeps no per-step table). A sweep cell counts as
# done only with every file (`is_complete`).

class RunSkipped(UserWarning):
    """A directory that looks like a run but is not a complete one."""


class IncompleteRun(HbenchError):
    """A run directory whose manifest says it is not complete (a run still
    being written by an older writer, or a crashed one): the one kind of run a
    reader may pass over, with a warning."""


class DamagedRun(HbenchError):
    """A complete run directory whose files no longer match what its manifest
    records: a reader refuses it, a sweep reruns it."""


def _files_record(path: Path, manifest: dict) -> dict:
    """The manifest's record of each file's size and sha256; `DamagedRun` if
    it has none (nothing it holds could be verified) or a malformed one."""
    files = manifest.get(FILES)
    if files is None:
        raise DamagedRun(f"damaged run {path}: {MANIFEST} records no size and sha256 of its "
                         "files, so nothing in it can be verified (rerun it)")
    dropped = manifest.get(DROPPED, [])
    ok = (isinstance(files, dict) and isinstance(dropped, list)
          and all(isinstance(v, dict) and type(v.get("bytes")) is int and isinstance(v.get("sha256"), str)
                  for v in files.values())
          and all(n in files or n in dropped for n in CHECKED_FILES))
    if not ok:
        raise DamagedRun(f"damaged run {path}: {MANIFEST} has a malformed {FILES!r} record")
    return files


def _damage(path: Path, manifest: dict, *, hashes: bool) -> str | None:
    """The first file of ``path`` that does not match the manifest's record,
    as "<file> <what is wrong>"; sizes only unless ``hashes``."""
    files = _files_record(path, manifest)
    for name, rec in files.items():
        if name not in CHECKED_FILES:
            continue
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != rec["bytes"]:
            return f"{name} has {size} bytes, its manifest records {rec['bytes']}"
        if hashes and file_sha256(file) != rec["sha256"]:
            return f"{name} does not match its sha256 in {MANIFEST}"
    problem = address_problem(manifest) or seal_problem(manifest)
    return f"{MANIFEST}: {problem}" if problem else None


def _damaged(path: Path, problem: str) -> DamagedRun:
    return DamagedRun(f"damaged run {path}: {problem} (rerun the cell, e.g. with hbench sweep, "
                      "or remove the directory)")


def _verified_bytes(path: Path, name: str, files: dict) -> bytes:
    """The bytes of ``path/name`` (a regular file, read no further than the
    size the manifest records), checked against the manifest's record."""
    rec = files.get(name)
    if rec is None:
        raise _damaged(path, f"{MANIFEST} records no sha256 of {name}")
    data = read_input_bytes(path / name, "results file", rec["bytes"] + 1)
    if len(data) != rec["bytes"]:
        raise _damaged(path, f"{name} has {len(data)} bytes, its manifest records {rec['bytes']}")
    if hashlib.sha256(data).hexdigest() != rec["sha256"]:
        raise _damaged(path, f"{name} does not match its sha256 in {MANIFEST}")
    return data


def drop_files(run_dir: Path, names) -> None:
    """Remove ``names`` (of the checked files) from a complete run on purpose,
    as a baseline kept in a repository drops its per-step table: the manifest
    then lists them as dropped rather than recording their checksums, so
    readers do not take their absence for damage."""
    run_dir = Path(run_dir)
    manifest = _json_object(run_dir, MANIFEST, "an object")
    if problem := seal_problem(manifest):   # re-sealing must not make an edit good
        raise _damaged(run_dir, f"{MANIFEST}: {problem}")
    files = dict(manifest.get(FILES) or {})
    dropped = list(manifest.get(DROPPED, []))
    for name in names:
        if name not in CHECKED_FILES:
            raise HbenchError(f"cannot drop {name} from a run; droppable: {', '.join(CHECKED_FILES)}")
        files.pop(name, None)
        if name not in dropped:
            dropped.append(name)
    if FILES in manifest:
        manifest[FILES] = files
    manifest[DROPPED] = dropped
    text = json.dumps(sealed(to_jsonable(manifest)), indent=2, allow_nan=False) + "\n"
    atomic_write_text(run_dir / MANIFEST, text)
    for name in names:
        (run_dir / name).unlink(missing_ok=True)


def _load_manifest(path: Path) -> dict | None:
    """The manifest of a complete run directory, or None."""
    try:
        manifest = load_json_object(path / MANIFEST, "manifest", max_bytes=MAX_MANIFEST_BYTES)
    except HbenchError:
        return None
    if manifest.get("status") != "complete":
        return None
    return manifest


def is_complete(path: Path) -> bool:
    """A run directory whose manifest says complete, whose files all exist and
    match the manifest's record of their sizes and sha256 (sizes first, so a
    truncated file costs a stat)."""
    path = Path(path)
    manifest = _load_manifest(path)
    if manifest is None or not all((path / name).is_file() for name in RUN_FILES):
        return False
    try:
        return _damage(path, manifest, hashes=True) is None
    except DamagedRun:
        return False


class Run(Mapping):
    """One read run directory: ``path``, ``manifest`` and ``summary`` are loaded
    eagerly, the tables (``requests``, ``steps``) on first access, then cached.

    The checked metadata (`schema_version`, `engine`, `engine_version`,
    `workload_hash`) are attributes, so pairing code compares them by name
    (`check_pairable`). Item access (``run["requests"]``) is kept for callers
    that treat a run as a mapping.
    """

    _TABLES = {"requests": REQUESTS, "steps": STEPS}

    def __init__(self, path: Path, manifest: dict, summary: dict):
        self._data = {"path": path, "manifest": manifest, "summary": summary}

    def __getitem__(self, key):
        if key not in self._data and key in self._TABLES:
            self._data[key] = self.table(key)
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("path", "manifest", "summary", *self._TABLES))

    def __len__(self) -> int:
        return 3 + len(self._TABLES)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def table(self, name: str) -> pd.DataFrame:
        """The ``requests`` or ``steps`` table, checked against the manifest's
        checksum as it is read; HbenchError when the file is absent, `DamagedRun`
        when it does not match."""
        file = self.path / self._TABLES[name]
        if not file.is_file():
            raise HbenchError(f"{self.path} has no {self._TABLES[name]}")
        data = _verified_bytes(self.path, self._TABLES[name], _files_record(self.path, self.manifest))
        return read_table(file, name, data)

    def has_table(self, name: str) -> bool:
        return (self.path / self._TABLES[name]).is_file()

    path = property(lambda self: self._data["path"])
    manifest = property(lambda self: self._data["manifest"])
    summary = property(lambda self: self._data["summary"])
    config = property(lambda self: self.manifest.get("config") or {})
    run_id = property(lambda self: self.manifest.get("run_id", self.path.name))
    schema_version = property(lambda self: self.manifest.get("schema_version"))
    engine = property(lambda self: self.manifest.get("engine") or self.config.get("engine"))
    engine_version = property(lambda self: self.manifest.get("engine_version"))
    workload_hash = property(lambda self: self.manifest.get("workload_hash"))
    git_commit = property(lambda self: self.manifest.get("git_commit"))


RunData = Run  # the name earlier callers import


def _json_object(run_dir: Path, name: str, what: str, files: dict | None = None) -> dict:
    """The JSON object in ``run_dir/name`` (checked against ``files``, the
    manifest's record); HbenchError if missing, unreadable or not one."""
    file = run_dir / name
    if not os.path.lexists(file):
        raise HbenchError(f"{run_dir} is not a complete run directory (missing {name})")
    data = (read_input_bytes(file, "results file", MAX_MANIFEST_BYTES) if files is None
            else _verified_bytes(run_dir, name, files))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HbenchError(f"results file {file} is not UTF-8 text") from None
    obj = loads_json(text, f"results file {file}")
    if not isinstance(obj, dict):
        raise HbenchError(f"{run_dir / name} holds a JSON {type(obj).__name__}, not {what}")
    return obj


def read_run(path: Path) -> Run:
    """Open a complete run directory written under this `SCHEMA_VERSION`.

    Raises HbenchError for a missing directory, a missing, unreadable or
    incomplete manifest, a missing or malformed summary (it must be a JSON
    object), or another schema version; `DamagedRun` for a file whose size
    (or, for the summary, sha256) differs from the manifest's record. The
    tables are checked on access.
    """
    path = Path(path)
    if not path.is_dir():
        raise HbenchError(f"no run directory at {path}")
    manifest = _json_object(path, MANIFEST, "an object")
    if manifest.get("status") != "complete":
        if SEAL in manifest and (problem := seal_problem(manifest)):
            # hbench seals only complete runs: this one's status was edited
            raise _damaged(path, f"{MANIFEST}: {problem}")
        raise IncompleteRun(f"{path}: manifest status {manifest.get('status')!r} is not complete")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise HbenchError(
            f"{path} has results schema version {manifest.get('schema_version')!r}; "
            f"this hbench reads version {SCHEMA_VERSION}"
        )
    check_manifest(path / MANIFEST, manifest)
    files = _files_record(path, manifest)
    problem = _damage(path, manifest, hashes=False)
    if problem:
        raise _damaged(path, problem)
    summary = _json_object(path, SUMMARY, "an object of metrics", files)
    check_summary(path / SUMMARY, summary)
    return Run(path, manifest, summary)


def _run_dirs(root: Path, *, refuse_strays: bool = False) -> Iterator[Path]:
    """Directories at or below ``root`` holding a manifest, hidden ones skipped;
    a run directory's own contents are not searched further.

    With ``refuse_strays`` (a reader's walk), what would otherwise be passed
    over in silence is an error: a directory that holds a run's files but no
    manifest (`DamagedRun`: its manifest was deleted), a symbolic link to a
    directory (never followed: it could loop, or lead out of the tree) and a
    directory that cannot be listed. Any depth of nesting is walked
    (`common.tree_walk`)."""
    def unlisted(exc: OSError):
        raise HbenchError(f"cannot read results directory {exc.filename}: "
                          f"{exc.strerror or type(exc).__name__}")

    for dirpath, dirnames, filenames in walk(root, unlisted if refuse_strays else None):
        if MANIFEST in filenames or MANIFEST in dirnames:
            dirnames.clear()
            yield Path(dirpath)
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if not refuse_strays:
            continue
        if lost := [n for n in CHECKED_FILES if n in filenames]:
            raise _damaged(Path(dirpath), f"it holds {lost[0]} but no {MANIFEST}, so nothing in "
                                          "it can be verified")
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                raise HbenchError(f"{os.path.join(dirpath, d)} is a symbolic link to a directory; "
                                  "hbench reads the run directories a results tree holds, not "
                                  "links (copy the run in, or give the link's target)")


def iter_runs(root: Path, *, strict: bool = False) -> Iterator[Run]:
    """Every run directory at or below ``root``, read by `read_run`, in path order.

    A run whose manifest says it is not complete (`IncompleteRun`) is an
    error when ``strict`` (a regression gate must not ignore a broken run),
    otherwise skipped with a `RunSkipped` warning. Every other run that cannot
    be read is an error: a manifest that cannot be read, a foreign schema
    version (its numbers mean something else), a damaged run (`DamagedRun`:
    a file, or its configuration, changed since it was written), and what a
    walk would otherwise miss: a directory holding a run's files but no
    manifest, a symbolic link to a directory (`_run_dirs`). Nothing is passed
    over in silence. A missing root is an error; an empty one yields
    nothing.
    """
    root = Path(root)
    if not root.is_dir():
        raise HbenchError(f"no results directory at {root}")
    for path in sorted(_run_dirs(root, refuse_strays=True)):
        try:
            yield read_run(path)
        except IncompleteRun as exc:
            if strict:
                raise
            warnings.warn(f"skipping {path}: {exc}", RunSkipped, stacklevel=2)


def list_runs(root: Path) -> list[Path]:
    """Complete run directories (every file present) at or below ``root``, sorted.

    Hidden directories (including interrupted ``.tmp-*`` writes) are skipped,
    and a run directory's own contents are not searched further.
    """
    root = Path(root)
    if not root.is_dir():
        raise HbenchError(f"no results directory at {root}")
    return sorted(p for p in _run_dirs(root) if is_complete(p))


def org_expression(manifest: dict) -> str | None:
    """What the organization was inside a real engine, as the engine said
    (``engine_info.requested.org_expression``, e.g. vLLM's S1/S2: the study's
    allocator policy at vLLM's page size); None for the simulator and the
    torch engine, whose organizations are the study's."""
    info = manifest.get("engine_info")
    requested = info.get("requested") if isinstance(info, dict) else None
    value = requested.get("org_expression") if isinstance(requested, dict) else None
    return value if isinstance(value, str) else None


# ------------------------------------------------------------ checked metadata

# What two runs must agree on before their numbers are compared, with the
# words an error uses. The engine version may be waived (a baseline against a
# candidate build); the workload hash never (same seed, same request stream).
CHECKED_METADATA = {"schema_version": "results schema version", "engine": "engine",
                    "engine_version": "engine version", "workload_hash": "workload hash"}


def metadata_conflict(a: Mapping, b: Mapping, keys=tuple(CHECKED_METADATA)) -> str | None:
    """The first checked field among ``keys`` on which ``a`` and ``b`` (runs'
    metadata as mappings) disagree, as ``"<field> differs (x vs y)"``; None
    when they agree. A field neither side records is not checked."""
    for key in keys:
        va, vb = a.get(key), b.get(key)
        if (va is not None or vb is not None) and va != vb:
            return f"{CHECKED_METADATA[key]} differs ({va} vs {vb})"
    return None


def check_pairable(a: Run, b: Run, *, same_engine_version: bool = True, what: str = "pair") -> None:
    """Refuse (HbenchError) to compare ``a`` with ``b`` when their checked
    metadata disagree: schema version, engine, engine version (unless
    ``same_engine_version`` is False, as for a baseline against a candidate
    build), and workload hash (the same seed must mean the same request stream).
    """
    keys = [k for k in CHECKED_METADATA if same_engine_version or k != "engine_version"]
    conflict = metadata_conflict({k: getattr(a, k) for k in keys}, {k: getattr(b, k) for k in keys}, keys)
    if conflict:
        raise HbenchError(f"refusing to {what} {a.run_id} with {b.run_id}: {conflict}")
