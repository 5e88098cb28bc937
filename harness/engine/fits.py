"""Refusing a budget that cannot serve a workload, before any step runs.

Every in-process engine calls `check_fits` after building its organization:
a run whose longest request cannot be served even alone would otherwise fail
that request (or stall) after minutes of work. Alone is not enough: a request
that finds the longest request's prefix cached (a later request of the same
context, or the request itself resumed after a preemption) adopts a checkpoint
and holds its pages while it computes the rest, and in a small budget that can
need more pages than starting cold. `check_fits` rehearses that on an empty
twin of the organization with the scheduler's own rules.
"""

from __future__ import annotations

import numpy as np

from common.errors import HbenchError


def check_fits(org, workload, config, label: str) -> None:
    """Refuse a budget that cannot serve the longest request even alone
    (HbenchError before any time passes): its first chunk, sized by the token
    budget as the scheduler sizes it, must fit with the admission headroom,
    and its attention for prompt + output, its live state and a spare for one
    checkpoint publication must fit (later chunks can shrink to one grid
    boundary)."""
    if not workload.requests:
        raise HbenchError("the workload has no requests")
    prompt, output = workload.longest_request()
    total = prompt + output
    first = (prompt if prompt <= config.token_budget
             else config.token_budget // org.grid * org.grid)
    if not org.can_allocate(org.pages_needed(-1, first, prompt), config.headroom):
        raise HbenchError(
            f"budget {label} cannot admit the longest request's first {first}-token chunk "
            f"for {org.name} with headroom {config.headroom} even alone: raise the budget, "
            "lower the headroom or lower --token-budget")
    one_boundary = min(prompt, org.grid)
    demand = org.pages_needed(-1, total, one_boundary)
    # what each pool could give one kind alone (its pages, or for u0 and e0
    # the whole region's in that kind's pages), then both kinds together
    for pool, reach, n in zip(org.capacity().pools, org.available_pages(), demand.pages,
                              strict=True):
        if n > reach:
            raise HbenchError(
                f"budget {label} gives {org.name} {reach} {pool.name} pages, but the "
                f"longest request ({total} tokens) alone needs {n}: raise the budget")
    if not org.can_allocate(demand):
        raise HbenchError(
            f"budget {label} cannot hold the longest request ({total} tokens) alone for "
            f"{org.name}: its {demand.pages} pages do not fit together: raise the budget")
    if not _adopting_admitted(org, config, total):
        raise HbenchError(
            f"budget {label} serves {org.name}'s longest request ({total} tokens) alone, "
            "but not once its prefix is cached: a request that adopts it (a later request "
            "of the same context, or the request itself resumed after a preemption) needs "
            "more pages than the budget has, so it could never be admitted: raise the budget")


def _adopting_admitted(org, config, total: int) -> bool:
    """On an empty twin of ``org``, with the scheduler's own rules: a request of
    ``total - 1`` prompt tokens runs to the end and leaves its prefix cached,
    then the same request comes again; whether the second one is admitted (it
    adopts the deepest checkpoint the first published) with nothing else
    running. True also when the first cannot run (the checks above decide)."""
    from harness.scheduler import Scheduler, SchedulerPolicy

    sched = Scheduler(org.twin(), SchedulerPolicy.from_config(config))
    ids = np.arange(1, max(total - 1, 1) + 1, dtype=np.int64)
    step = 0
    for rid in (0, 1):
        sched.add(rid, 0.0, ids, 1, None)
        admitted = False
        while not admitted:       # nothing else runs: admitted or failed at once
            batch = sched.schedule()
            if rid in batch.failed:
                return rid == 0
            admitted = rid in batch.admitted
            if not admitted and not batch.items:
                return True       # waits for something the rehearsal does not model
            step += 1
            sched.complete(batch, float(step))
        while rid == 0 and sched.has_work:
            step += 1
            sched.complete(sched.schedule(), float(step))
    return True
