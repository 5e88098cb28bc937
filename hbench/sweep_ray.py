"""Running sweep cells as Ray tasks (``hbench sweep --executor ray``).

Imported only when Ray is asked for, so the core never needs it. Each cell is
one task calling the cell function it is given (`hbench.sweep.run_cell`,
exactly what the local executors call), so results are identical whichever
runs them. It imports nothing from `hbench.sweep`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from common.errors import HbenchError

# A local Ray instance only ships CellOutcomes (cells write their own files),
# so a small object store is plenty and keeps Ray off a laptop's memory.
RAY_OBJECT_STORE_BYTES = 256 * 2**20
# run_cell is idempotent (atomic run directories), so a task whose worker died
# may safely run again once before the sweep gives up.
RAY_TASK_RETRIES = 1


def _ray_connect(ray, jobs: int, address: str | None) -> bool:
    """Attach to Ray: an already initialized driver, the cluster at ``address``,
    or a new quiet local instance with ``jobs`` CPUs. True if we started one
    (and so must shut it down)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if address:
            # Cluster nodes get this driver's code, so they run exactly the
            # engine version the cell ids were computed from.
            import adapters
            import common
            import harness
            import hbench
            import workloads
            ray.init(address=address, runtime_env={"py_modules": [adapters, common, harness, hbench,
                                                              workloads]}, **quiet)
        else:
            code_root = str(Path(__file__).resolve().parents[1])
            path = os.pathsep.join(p for p in (code_root, os.environ.get("PYTHONPATH")) if p)
            # a local instance listens on loopback only
            ray.init(address="local", num_cpus=jobs, object_store_memory=RAY_OBJECT_STORE_BYTES,
                     _node_ip_address="127.0.0.1",
                     runtime_env={"env_vars": {"PYTHONPATH": path}}, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HbenchError(f"cannot start or reach {where}: {first}") from None
    return True


def require_ray() -> None:
    """Refuse, before a sweep writes anything, to run cells on Ray where it is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise HbenchError("--executor ray needs Ray: pip install ray (or pip install 'hbench[ray]')") from None


def execute_ray(run_cell, todo, out, jobs, args, report, address=None) -> None:
    """One Ray task per cell, each calling ``run_cell(cell, out, *args)``;
    outcomes are reported as tasks finish.

    On Ctrl-C, or when a task dies, the tasks still pending are cancelled
    (running ones killed): a killed cell leaves only its ``.tmp-*`` directory,
    which the next sweep removes, so resume semantics are the local ones.
    """
    require_ray()
    import ray

    if not todo:
        return  # a finished sweep resumes without paying for Ray's start-up
    started = _ray_connect(ray, jobs, address)
    cells: dict = {}
    try:
        remote = ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES)(run_cell)
        # Workers do not share the driver's working directory: give them an absolute path.
        cells = {remote.remote(c, str(Path(out).resolve()), *args): c for c in todo}
        pending = list(cells)
        while pending:
            # A bounded wait keeps the driver responsive to Ctrl-C.
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayTaskError:
                    raise  # a bug inside run_cell: keep its traceback, as the local pool does
                except ray.exceptions.RayError as exc:
                    first = str(exc).strip().splitlines()[0]
                    raise HbenchError(f"cell {cells[ref].cell_id}: Ray could not run it ({first}); "
                                      "rerun the sweep to resume") from None
                del cells[ref]
                report(outcome)
    finally:
        for ref in cells:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
