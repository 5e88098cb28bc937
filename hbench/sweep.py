"""Sweeps: content-addressed cells, resumable, safe to share and to interrupt.

A sweep runs a list of `RunConfig`s (usually `harness.grid.expand` of a
grid). Every config is one **cell**, whose id is
`harness.run_address.cell_id(config, workload_hash, engine_version)`: the same
knobs, request stream, input files and engine code always give the same id,
and the run directory of a cell is ``<out>/<cell id>/``.

Because `hbench.runner.execute` writes run directories atomically, a cell
directory either exists complete or not at all; resuming a sweep skips cells
that are done (`harness.results.is_done`: complete, every file matching the
size and sha256 its manifest records, and some request finished); a cell
directory that is not done (damaged, or it served nothing) is removed and
rerun, and the sweep says which and why. A killed sweep leaves at most
hidden ``.tmp-*`` directories of dead processes, which the next sweep
removes (a cell's own, when it takes the cell's lock, even if the killed
writer had not finished exiting as the sweep began). Only the holder of a
cell's lock (`cell_lock`) runs it, so sweeps sharing ``out`` compute each
cell once; a lock file lives only while held.

Cells run serially or on a local process pool (`hbench.sweep_local`: ``jobs``
workers forked after planning, each running many cells and keeping the
workloads it last used, up to 4,096 requests), or on Ray
(`hbench.sweep_ray`). Both executors are handed `run_cell`, so the results are identical whichever executes them, and
neither imports this module.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from common.atomic import atomic_write_text
from common.errors import HbenchError
from harness.config import RunConfig
from harness.grid import Axes, normalize_axes
from harness.results import (
    clean_stale,
    is_done,
    read_run,
    remove_run_temps,
    to_jsonable,
    why_not_done,
)
from harness.run_address import cell_id
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload, recorded_config
from hbench.executors import EXECUTORS
from hbench.interrupts import raise_if_received, signals_interrupt
from hbench.runner import execute, recorded_version, validate_run

SWEEP_FILE = "sweep.json"
LOCK_DIR = ".locks"        # out/.locks/<cell id>: held while a process runs that cell
SWEEP_SCHEMA_VERSION = 1

__all__ = ["Cell", "CellOutcome", "SweepResult", "load_workload_files", "plan", "preview", "run_cell",
           "run_sweep"]


# -------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """One run of a sweep: its config, the hash of its request stream, the
    content address that names its run directory, and the config as
    validation resolved it (`hbench.runner.validate_run`), which the cell's
    run uses instead of resolving it again (None: resolved when it runs)."""

    config: RunConfig
    workload_hash: str
    engine_version: str
    cell_id: str
    setup: RunSetup | None = None


def workload_key(config: RunConfig):
    """The workload cache key of ``config``: its `workloads.spec.WorkloadSpec`,
    or its saved workload file (path and content)."""
    from workloads.spec import workload_source

    return workload_source(config)


# Per-process workloads, most recently used last: a worker runs many cells of
# the same few request streams, and building one costs more than looking it
# up. The cache holds up to `_WORKLOAD_CACHE_REQUESTS` requests (always the
# newest workload): `plan` fills it, and the workers a local pool forks after
# planning start with every workload of a study-sized grid (Q6's 12 streams
# of 240 requests) instead of each building each stream again.
_WORKLOADS: OrderedDict[object, object] = OrderedDict()
_WORKLOAD_CACHE_REQUESTS = 4096


def cached_workload(config: RunConfig):
    key = workload_key(config)
    if key in _WORKLOADS:
        _WORKLOADS.move_to_end(key)
    else:
        _WORKLOADS[key] = build_run_workload(config)
        held = sum(w.total_requests for w in _WORKLOADS.values())
        while len(_WORKLOADS) > 1 and held > _WORKLOAD_CACHE_REQUESTS:
            held -= _WORKLOADS.popitem(last=False)[1].total_requests
    return _WORKLOADS[key]


def load_workload_files(configs: Sequence[RunConfig]) -> None:
    """Load every saved workload file ``configs`` name, each once, into the
    per-process cache `plan` reads: a tampered or unreadable file is refused
    (HbenchError) before a command shows progress or writes anything. Their
    size was checked with the run's memory estimate by `validate_run`."""
    seen: set[str] = set()
    for cfg in configs:
        if cfg.workload_path and cfg.workload_path not in seen:
            seen.add(cfg.workload_path)
            cached_workload(cfg)


def plan(configs: Sequence[RunConfig]) -> list[Cell]:
    """Content-address every config: build each distinct workload once (for
    its hash) and ask each engine for its version once."""
    from adapters.registry import make_engine

    versions: dict[str, str] = {}
    hashes: dict[object, str] = {}
    cells = []
    for cfg in configs:
        if cfg.engine not in versions:
            versions[cfg.engine] = recorded_version(make_engine(cfg.engine))
        key = workload_key(cfg)
        if key not in hashes:
            hashes[key] = cached_workload(cfg).content_hash
        # addressed by what its manifest will record (a saved workload's own recipe)
        recorded = recorded_config(cfg, cached_workload(cfg)) if cfg.workload_path else cfg
        cells.append(Cell(cfg, hashes[key], versions[cfg.engine],
                          cell_id(recorded, hashes[key], versions[cfg.engine])))
    return cells


def done_index(out: Path) -> dict[tuple[str, str], str]:
    """(config digest, engine version) -> cell id of every done cell directly
    under ``out`` whose directory name is the content address of what its
    manifest records (`harness.run_address.cell_id` of its config, workload hash
    and engine version). Runs of a saved workload are left out: their
    manifest records the workload's recipe, not the planned config."""
    index: dict[tuple[str, str], str] = {}
    if not out.is_dir():
        return index
    for run_dir in sorted(out.iterdir()):
        if run_dir.name.startswith(".") or not is_done(run_dir):
            continue
        try:
            manifest = read_run(run_dir).manifest
            recorded, wl, version = (manifest.get("config"), manifest.get("workload_hash"),
                                     manifest.get("engine_version"))
            if not (isinstance(recorded, dict) and isinstance(wl, str) and isinstance(version, str)):
                continue
            cfg = RunConfig.from_dict(recorded)
            if cfg.workload_path or cell_id(cfg, wl, version) != run_dir.name:
                continue
        except (HbenchError, TypeError):   # a cell of an older configuration schema
            continue
        index[(cfg.digest(), version)] = run_dir.name
    return index


def preview(configs: Sequence[RunConfig], out: Path) -> Iterator[tuple[RunConfig, str | None]]:
    """``--dry-run``: (config, cell id or None) per config, lazily, without
    deriving any workload (deriving one costs ~0.1 s, so `plan` of a large
    grid takes minutes). A cell is found done by its configuration and the
    engine's current version among the done cells under ``out``
    (`done_index`); its id is then known, a cell to run has None. A saved
    workload (``workload_path``) is read, as `plan` reads it, so its cell is
    exact. The sweep itself plans exactly (`plan`): a ``--dataset`` file
    edited since a cell ran is noticed there, not here."""
    from adapters.registry import make_engine

    index = done_index(out)
    versions: dict[str, str] = {}
    for cfg in configs:
        if cfg.workload_path:
            (cell,) = plan([cfg])
            yield cfg, cell.cell_id if is_done(out / cell.cell_id) else None
            continue
        if cfg.engine not in versions:
            versions[cfg.engine] = recorded_version(make_engine(cfg.engine))
        yield cfg, index.get((cfg.digest(), versions[cfg.engine]))


@dataclass(frozen=True)
class CellOutcome:
    cell_id: str
    status: str          # "ran", "skipped", "failed", or "busy" (another process holds it)
    seconds: float = 0.0
    error: str = ""


def _open_locked(locks: Path, cell: str, wait: bool) -> int | None:
    """An fd holding the flock of ``locks/<cell>``, or None (``wait`` False and
    another process holds it). A holder unlinks its lock file before
    releasing it, so a lock won on a file no longer at that path is on a
    stale inode: then the current file is tried again."""
    path = locks / cell
    while True:
        try:
            locks.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            # mkdir found it made, but by the time it looked, another sweep had
            # removed it again, empty (`_remove_lock_dir`): make it again
            if locks.exists() and not locks.is_dir():
                raise HbenchError(f"{locks} is not a directory: hbench keeps its cell "
                                  "locks there; remove it and run the sweep again") from None
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:   # .locks was removed between the two calls
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _remove_lock_dir(out: Path) -> None:
    try:
        (out / LOCK_DIR).rmdir()
    except OSError:   # absent, or another process holds a lock in it
        pass


def _clear_stale_locks(out: Path) -> None:
    """Remove the lock files that no process holds (a holder killed by SIGKILL
    after its cell finished never unlinked its own), by taking each one's
    lock and releasing it the way a holder does."""
    locks = out / LOCK_DIR
    for cell in sorted(os.listdir(locks)) if locks.is_dir() else ():
        fd = _open_locked(locks, cell, wait=False)
        if fd is not None:
            try:
                os.unlink(locks / cell)
            finally:
                os.close(fd)
    _remove_lock_dir(out)


@contextmanager
def cell_lock(out: Path, cell: str, wait: bool) -> Iterator[bool]:
    """Hold the exclusive lock of cell ``cell`` under ``out`` (an ``flock`` on
    ``out/.locks/<cell>``, released by the kernel if the holder dies). Yields
    True once held; with ``wait`` False, yields False at once if another
    process holds it. The holder removes the lock file (and ``.locks`` when
    empty) as it releases, so no lock outlives its sweep."""
    locks = out / LOCK_DIR
    fd = _open_locked(locks, cell, wait)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        try:
            os.unlink(locks / cell)
        finally:
            os.close(fd)
        _remove_lock_dir(out)


def _served_nothing_error(run_dir: Path) -> str:
    req = read_run(run_dir)["requests"]
    failed = req.loc[req["status"] != "finished"]
    first = failed["error"].iloc[0] if len(failed) and "error" in failed else ""
    return (f"no request finished ({len(failed)} of {len(req)} failed or cancelled; results kept "
            f"in {run_dir}, rerun on resume)" + (f"; first error: {str(first)[:200]}" if first else ""))


def run_cell(cell: Cell, out: str, force: bool = False, allow_oversubscribe: bool = False,
             wait: bool = True) -> CellOutcome:
    """Run one cell into ``out/<cell id>/`` unless it is done already.

    Module-level so that process pools and Ray can ship it. Only the holder
    of the cell's lock runs it, so sweeps sharing ``out`` compute each cell
    once: with ``wait`` False a cell another process is running comes back
    "busy" at once; with ``wait`` True this waits and then finds it done.
    A user error (HbenchError) and a run in which no request finished become
    "failed" outcomes (the latter rerun on resume); anything else propagates.
    """
    out_dir = Path(out)
    run_dir = out_dir / cell.cell_id
    if is_done(run_dir) and not force:
        return CellOutcome(cell.cell_id, "skipped")
    with cell_lock(out_dir, cell.cell_id, wait) as held:
        if not held:
            return CellOutcome(cell.cell_id, "busy")
        if is_done(run_dir) and not force:   # another sweep ran it while we waited
            return CellOutcome(cell.cell_id, "skipped")
        remove_run_temps(out_dir, cell.cell_id)   # a killed holder's, however recently
        t0 = time.perf_counter()
        try:
            if run_dir.exists():
                # --force, a run that served nothing, or a directory some other
                # tool left under our name: the cell is rerun from scratch.
                shutil.rmtree(run_dir)
            workload = cached_workload(cell.config)
            if workload.content_hash != cell.workload_hash:
                raise HbenchError(f"cell {cell.cell_id}: workload rebuilt with a different hash; "
                                  "the workload builder is not deterministic")
            execute(cell.config, out, workload=workload, run_id=cell.cell_id,
                    allow_oversubscribe=allow_oversubscribe, setup=cell.setup)
            if not is_done(run_dir):
                raise HbenchError(_served_nothing_error(run_dir))
        except HbenchError as exc:
            return CellOutcome(cell.cell_id, "failed", time.perf_counter() - t0, str(exc))
    return CellOutcome(cell.cell_id, "ran", time.perf_counter() - t0)


# ---------------------------------------------------------------- execution

@dataclass(frozen=True)
class SweepResult:
    out: Path
    cells: tuple[Cell, ...]
    outcomes: tuple[CellOutcome, ...]

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def failed(self) -> tuple[CellOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status == "failed")


def _cell_entry(c: Cell, o: CellOutcome | None) -> dict:
    entry = {"cell_id": c.cell_id, "status": o.status if o else "pending"}
    if o and o.status != "skipped":
        entry["seconds"] = round(o.seconds, 3)
    if o and o.error:
        entry["error"] = o.error
    return {**entry, "workload_hash": c.workload_hash, "config": c.config.to_dict()}


def _sweep_doc(grids, base, cells, outcomes: dict[str, CellOutcome]) -> dict:
    """What ``sweep.json`` holds (`SweepFile` writes it as ``json.dumps(doc, indent=1)``)."""
    return {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "updated_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "base": {k: list(v) for k, v in normalize_axes(base or {}).items()},
        "grid": [{k: list(v) for k, v in normalize_axes(g).items()} for g in grids],
        "engine_versions": sorted({c.engine_version for c in cells}),
        "cells": [_cell_entry(c, outcomes.get(c.cell_id)) for c in cells],
    }


class SweepFile:
    """``out/sweep.json``, rewritten atomically after every cell.

    A sweep writes it once per cell, and every write holds every cell, so
    each cell's entry is rendered once per outcome and kept: a write joins
    the kept texts (the JSON `_sweep_doc` would give, byte for byte), instead
    of serializing the whole grid again (for the 360 cells of ``reproduce q6``
    0.5 ms a write instead of 39 ms, 14 s of a sweep's CPU time)."""

    def __init__(self, out: Path, grids, base, cells: Sequence[Cell]):
        self.path = out / SWEEP_FILE
        self.grids, self.base, self.cells = grids, base, cells
        self._entries: dict[str, tuple[CellOutcome | None, str]] = {}

    def _entry(self, c: Cell, o: CellOutcome | None) -> str:
        kept = self._entries.get(c.cell_id)
        if kept is None or kept[0] != o:
            text = json.dumps(to_jsonable(_cell_entry(c, o)), indent=1).replace("\n", "\n  ")
            kept = self._entries[c.cell_id] = (o, text)
        return kept[1]

    def text(self, outcomes: dict[str, CellOutcome]) -> str:
        head = _sweep_doc(self.grids, self.base, (), {})
        head["engine_versions"] = sorted({c.engine_version for c in self.cells})
        text = json.dumps(to_jsonable(head), indent=1)
        assert text.endswith('"cells": []\n}'), text[-40:]
        if not self.cells:
            return text + "\n"
        entries = ",\n  ".join(self._entry(c, outcomes.get(c.cell_id)) for c in self.cells)
        return text[:-len("[]\n}")] + "[\n  " + entries + "\n ]\n}\n"

    def write(self, outcomes: dict[str, CellOutcome]) -> None:
        atomic_write_text(self.path, self.text(outcomes))


def _pending_order(cells: Sequence[Cell]) -> list[Cell]:
    # Group cells that share a request stream so a worker's workload cache hits.
    first: dict[object, int] = {}
    for i, c in enumerate(cells):
        first.setdefault(workload_key(c.config), i)
    return sorted(cells, key=lambda c: first[workload_key(c.config)])


def _warm_imports(cells: Sequence[Cell]) -> None:
    """Import here what the cells would import on their own when they write
    their results, so the workers a local pool forks share the import instead
    of each paying it: scipy.stats (0.75 s), for the KS test of Poisson
    arrivals, unless every such test was run before and its p-value is
    remembered (`harness.validity.ks_remembered`). A simulated cell's
    measured arrivals are its workload's after the warm-up requests; any
    other cell, or a workload this process no longer holds, imports it."""
    from harness.validity import ks_remembered

    for c in cells:
        cfg = c.config
        if cfg.arrival != "poisson":
            continue
        w = _WORKLOADS.get(workload_key(cfg)) if cfg.engine == "sim" else None
        if w is None or w.sessions or not ks_remembered(_arrivals(w)[cfg.warmup_requests:],
                                                        cfg.rate):
            import scipy.stats  # noqa: F401
            return


def _arrivals(w) -> list[float]:
    """The arrival times of ``w``'s requests (read from the column of requests
    made on read, without making them)."""
    column = getattr(w.requests, "arrival_s", None)
    return list(column) if column is not None else [r.arrival_s for r in w.requests]


def run_sweep(configs: Sequence[RunConfig], out, *, jobs: int = 1, executor: str = "local",
              force: bool = False, allow_oversubscribe: bool = False,
              setups: Sequence[RunSetup] | None = None,
              grids: Sequence[Axes] = (), base: Mapping | None = None,
              on_plan: Callable[[int, int], None] | None = None,
              on_cell: Callable[[CellOutcome], None] | None = None,
              ray_address: str | None = None,
              on_rerun: Callable[[str, str], None] | None = None) -> SweepResult:
    """Run every config as a content-addressed cell under ``out``.

    Every config is validated before any work, unless ``setups`` holds what
    `validate_run` returned for each (the command validated them already);
    each cell's run uses its config's setup, so a cell is resolved once.
    Done cells (complete, and
    some request finished) are skipped unless ``force``; stale ``.tmp-*``
    directories are removed first; ``sweep.json`` (grid, cells, engine
    versions, status) is rewritten atomically at the start and after every
    cell, so it is accurate whenever the sweep dies. ``on_plan(total,
    already_done)`` and ``on_cell(outcome)`` drive a progress display;
    ``on_rerun(cell_id, why)`` is told of each cell whose directory exists but
    is not done (damaged, or no request finished), which is rerun.
    Nothing is written before planning succeeds, and a sweep that fails with
    an error before any cell ran removes the ``sweep.json`` and directories
    it made (an interrupt keeps the record).
    Ctrl-C or SIGTERM stops the sweep and its workers, leaving only complete
    cells.

    Several sweeps may share ``out``: each cell is run under its lock. A first
    pass skips cells another process is running; a second pass waits for
    them, and then finds them done.

    ``executor="ray"`` runs cells as Ray tasks: on the cluster at
    ``ray_address`` (or ``$RAY_ADDRESS``; ``out`` must then be a directory
    every node sees), else on a local instance with ``jobs`` CPUs that is
    shut down afterwards. An already initialized Ray driver is used as is.
    """
    if executor not in EXECUTORS:
        raise HbenchError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise HbenchError(f"--jobs must be >= 1, got {jobs}")
    if not configs:
        raise HbenchError("the grid expands to no cells")
    if setups is None:   # every cell, before any work
        setups = [validate_run(cfg, allow_oversubscribe=allow_oversubscribe) for cfg in configs]
    elif [s.config for s in setups] != list(configs):
        raise ValueError("run_sweep: setups must be the configs' own, in order")
    # before anything is written: a workload that fails to build writes nothing
    cells = [replace(c, setup=s) for c, s in zip(plan(configs), setups, strict=True)]
    out = Path(out)
    clean_stale(out)
    by_id = {c.cell_id: c for c in cells}
    outcomes: dict[str, CellOutcome] = {}
    todo = []
    for c in cells:
        if not force and is_done(out / c.cell_id):
            outcomes[c.cell_id] = CellOutcome(c.cell_id, "skipped")
        else:
            todo.append(c)
            if not force and on_rerun and (out / c.cell_id).exists():
                on_rerun(c.cell_id, why_not_done(out / c.cell_id) or "not done")
    if todo and executor == "ray":
        from hbench.sweep_ray import require_ray

        require_ray()
    made_out, had_sweep_file = not out.exists(), (out / SWEEP_FILE).exists()
    out.mkdir(parents=True, exist_ok=True)
    record = SweepFile(out, grids, base, cells)
    try:
        record.write(outcomes)
    except BaseException:
        _remove_if_empty(out, made_out)
        raise
    if on_plan:
        on_plan(len(cells), len(cells) - len(todo))
    busy: list[Cell] = []

    def report(o: CellOutcome) -> None:
        raise_if_received()   # a signal whose exception a worker's fork swallowed
        if o.status == "busy":
            busy.append(by_id[o.cell_id])
            return
        outcomes[o.cell_id] = o
        record.write(outcomes)
        if on_cell:
            on_cell(o)

    def execute(cells_now: list[Cell], wait: bool) -> None:
        args = (force, allow_oversubscribe, wait)   # run_cell's arguments after (cell, out)
        if executor == "ray":
            from hbench.sweep_ray import execute_ray

            address = ray_address or os.environ.get("RAY_ADDRESS") or None
            execute_ray(run_cell, cells_now, out, jobs, args, report, address)
        else:
            from hbench.sweep_local import execute_local

            if jobs > 1:
                _warm_imports(cells_now)
            execute_local(run_cell, cells_now, out, jobs, args, report)

    try:
        with signals_interrupt():
            execute(_pending_order(todo), wait=False)
            if busy:
                execute(list(busy), wait=True)
    except Exception:
        if had_sweep_file or any(o.status in ("ran", "failed") for o in outcomes.values()):
            record.write(outcomes)
        else:   # an error before any cell ran (the executor would not start): leave no trace
            (out / SWEEP_FILE).unlink(missing_ok=True)
            _remove_lock_dir(out)
            _remove_if_empty(out, made_out)
        raise
    except BaseException:   # an interrupt: the record says what was done and what was not
        record.write(outcomes)
        clean_stale(out)          # the killed workers' temporaries
        _clear_stale_locks(out)   # and the locks they held
        raise
    record.write(outcomes)
    _clear_stale_locks(out)
    return SweepResult(out, tuple(cells), tuple(outcomes[c.cell_id] for c in cells))


def _remove_if_empty(out: Path, made: bool) -> None:
    if made:
        try:
            out.rmdir()
        except OSError:
            pass
