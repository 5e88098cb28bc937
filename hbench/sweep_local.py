"""Running sweep cells on this machine: serially or on a process pool.

Like `hbench.sweep_ray`, it is given the cell function (`hbench.sweep.run_cell`)
and imports nothing from `hbench.sweep`.

Workers belong to the sweep that started them. They ignore Ctrl-C (the
terminal sends it to the whole process group; the sweep decides), die of
SIGTERM and SIGHUP as any process does, and, on
Linux, are killed by the kernel if the sweep process dies, even by SIGKILL.
When the sweep is interrupted (Ctrl-C, SIGTERM, an error) its workers are
killed, not waited for: a killed cell leaves only a ``.tmp-*`` directory of a
dead pid, which the next sweep removes, and its cell lock dies with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

PR_SET_PDEATHSIG = 1   # linux/prctl.h


def _worker_init(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):   # not the sweep's handlers, inherited by fork
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:   # the sweep died before prctl took effect
        os._exit(1)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    # ProcessPoolExecutor has no public terminate before Python 3.14.
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.kill()
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.join(timeout=5)


def execute_local(run_cell, todo, out, jobs, args, report) -> None:
    """Run ``run_cell(cell, out, *args)`` for every cell of ``todo``, calling
    ``report(outcome)`` as each finishes; ``jobs`` > 1 uses a process pool."""
    if jobs <= 1:
        for c in todo:
            report(run_cell(c, str(out), *args))
        return
    if not todo:
        return
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=_worker_init,
                               initargs=(os.getpid(),))
    try:
        pending = {pool.submit(run_cell, c, str(out), *args) for c in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                report(f.result())
    except BaseException:
        _kill_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
