"""Sweeps: content-addressed cells, resumable execution.

A sweep runs a list of `RunConfig`s (usually `harness.grid.expand` of a
grid). Every config is one **cell**, whose id is
`harness.results.cell_id(config, workload_hash, engine_version)`: the same
knobs, request stream and engine code always give the same id, and the run
directory of a cell is ``<out>/<cell id>/``.

Because `harness.runner.execute` writes run directories atomically, a cell
directory either exists complete or not at all; resuming a sweep simply skips
cells whose complete directory exists. A killed sweep leaves at most hidden
``.tmp-*`` directories of dead processes, which the next sweep removes.

Cells run serially, on a local process pool (``jobs`` workers, each running
many cells and keeping the few workloads it last built), or on Ray. All three
call `run_cell`, so the results are identical whichever executes them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.config import RunConfig, validate
from harness.errors import HbenchError
from harness.grid import Axes, expand, normalize_axes
from harness.results import cell_id, clean_stale, is_complete, to_jsonable

SWEEP_FILE = "sweep.json"
SWEEP_SCHEMA_VERSION = 1
EXECUTORS = ("local", "ray")

__all__ = ["Cell", "CellOutcome", "SweepResult", "expand", "plan", "run_cell", "run_sweep"]


# -------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """One run of a sweep: its config, the hash of its request stream, and
    the content address that names its run directory."""

    config: RunConfig
    workload_hash: str
    engine_version: str
    cell_id: str


def workload_key(config: RunConfig):
    """The workload cache key of ``config``: its `workloads.spec.WorkloadSpec`,
    or its saved workload file (path and content)."""
    from workloads.spec import workload_source

    return workload_source(config)


# Per-process workloads, most recently used last: a worker runs many cells of
# the same few request streams, and building one costs more than looking it up.
_WORKLOADS: OrderedDict[object, object] = OrderedDict()
_WORKLOAD_CACHE_SIZE = 4


def cached_workload(config: RunConfig):
    from harness.runner import build_run_workload

    key = workload_key(config)
    if key in _WORKLOADS:
        _WORKLOADS.move_to_end(key)
    else:
        _WORKLOADS[key] = build_run_workload(config)
        while len(_WORKLOADS) > _WORKLOAD_CACHE_SIZE:
            _WORKLOADS.popitem(last=False)
    return _WORKLOADS[key]


def plan(configs: Sequence[RunConfig]) -> list[Cell]:
    """Content-address every config: build each distinct workload once (for
    its hash) and ask each engine for its version once."""
    from adapters.registry import make_engine

    versions: dict[str, str] = {}
    hashes: dict[object, str] = {}
    cells = []
    for cfg in configs:
        if cfg.engine not in versions:
            versions[cfg.engine] = make_engine(cfg.engine).version()
        key = workload_key(cfg)
        if key not in hashes:
            hashes[key] = cached_workload(cfg).content_hash
        cells.append(Cell(cfg, hashes[key], versions[cfg.engine],
                          cell_id(cfg, hashes[key], versions[cfg.engine])))
    return cells


@dataclass(frozen=True)
class CellOutcome:
    cell_id: str
    status: str          # "ran", "skipped" or "failed"
    seconds: float = 0.0
    error: str = ""


def run_cell(cell: Cell, out: str, force: bool = False,
             allow_oversubscribe: bool = False) -> CellOutcome:
    """Run one cell into ``out/<cell id>/`` unless it is complete already.

    Module-level so that process pools and Ray can ship it. A user error
    (HbenchError) becomes a "failed" outcome; anything else propagates.
    """
    from harness.runner import execute

    run_dir = Path(out) / cell.cell_id
    if is_complete(run_dir) and not force:
        return CellOutcome(cell.cell_id, "skipped")
    t0 = time.perf_counter()
    try:
        if run_dir.exists():
            # --force, or a directory some other tool left under our name:
            # the cell is rerun from scratch (resume redoes it if we die now).
            shutil.rmtree(run_dir)
        workload = cached_workload(cell.config)
        if workload.content_hash != cell.workload_hash:
            raise HbenchError(f"cell {cell.cell_id}: workload rebuilt with a different hash; "
                              "the workload builder is not deterministic")
        execute(cell.config, out, workload=workload, run_id=cell.cell_id,
                allow_oversubscribe=allow_oversubscribe)
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


def _write_sweep_file(out: Path, grids, base, cells, outcomes: dict[str, CellOutcome]) -> None:
    doc = {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "updated_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "base": {k: list(v) for k, v in normalize_axes(base or {}).items()},
        "grid": [{k: list(v) for k, v in normalize_axes(g).items()} for g in grids],
        "engine_versions": sorted({c.engine_version for c in cells}),
        "cells": [_cell_entry(c, outcomes.get(c.cell_id)) for c in cells],
    }
    tmp = out / f".{SWEEP_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(to_jsonable(doc), indent=1) + "\n")
    os.replace(tmp, out / SWEEP_FILE)


def _pending_order(cells: Sequence[Cell]) -> list[Cell]:
    # Group cells that share a request stream so a worker's workload cache hits.
    first: dict[object, int] = {}
    for i, c in enumerate(cells):
        first.setdefault(workload_key(c.config), i)
    return sorted(cells, key=lambda c: first[workload_key(c.config)])


def _execute_local(todo, out, jobs, args, report) -> None:
    if jobs <= 1:
        for c in todo:
            report(run_cell(c, str(out), *args))
        return
    pool = ProcessPoolExecutor(max_workers=jobs)
    try:
        pending = {pool.submit(run_cell, c, str(out), *args) for c in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                report(f.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_sweep(configs: Sequence[RunConfig], out, *, jobs: int = 1, executor: str = "local",
              force: bool = False, allow_oversubscribe: bool = False,
              grids: Sequence[Axes] = (), base: Mapping | None = None,
              on_plan: Callable[[int, int], None] | None = None,
              on_cell: Callable[[CellOutcome], None] | None = None,
              ray_address: str | None = None) -> SweepResult:
    """Run every config as a content-addressed cell under ``out``.

    Finished cells are skipped unless ``force``; stale ``.tmp-*`` directories
    are removed first; ``sweep.json`` (grid, cells, engine versions, status)
    is written before and after. ``on_plan(total, already_done)`` and
    ``on_cell(outcome)`` drive a progress display. Ctrl-C stops the sweep,
    leaving only complete cells.

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
    for cfg in configs:   # every cell, before any work
        validate(cfg, allow_oversubscribe=allow_oversubscribe)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clean_stale(out)
    cells = plan(configs)
    outcomes: dict[str, CellOutcome] = {}
    todo = []
    for c in cells:
        if not force and is_complete(out / c.cell_id):
            outcomes[c.cell_id] = CellOutcome(c.cell_id, "skipped")
        else:
            todo.append(c)
    _write_sweep_file(out, grids, base, cells, outcomes)
    if on_plan:
        on_plan(len(cells), len(cells) - len(todo))

    def report(o: CellOutcome) -> None:
        outcomes[o.cell_id] = o
        if on_cell:
            on_cell(o)

    args = (force, allow_oversubscribe)   # run_cell's arguments after (cell, out)
    try:
        if executor == "ray":
            address = ray_address or os.environ.get("RAY_ADDRESS") or None
            from harness.sweep_ray import execute_ray

            execute_ray(run_cell, _pending_order(todo), out, jobs, args, report, address)
        else:
            _execute_local(_pending_order(todo), out, jobs, args, report)
    finally:
        _write_sweep_file(out, grids, base, cells, outcomes)
    return SweepResult(out, tuple(cells), tuple(outcomes[c.cell_id] for c in cells))
