"""Refusing a budget that cannot serve a workload, before any step runs.

Every in-process engine calls `check_fits` after building its organization:
a run whose longest request cannot be served would otherwise fail requests
(or stall a real server) after minutes of work. Page counts alone do not
settle it: under large pages (vLLM's paging) a request whose next prefill
chunk must also publish a checkpoint can be preempted by its own growth with
nothing else running, and then find no way back in. So after the page counts,
`check_fits` rehearses the longest request alone on an empty twin of the
organization with the scheduler's own rules.
"""

from __future__ import annotations

import numpy as np

from common.errors import HbenchError
from harness.orgs.protocol import OrganizationProtocol


def check_fits(org: OrganizationProtocol, workload, config, label: str) -> None:
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
    if not _served_alone(org, config, prompt, output):
        raise HbenchError(
            f"budget {label} cannot serve {org.name}'s longest request ({total} tokens) even "
            "alone under the scheduler's rules: its prefill chunks and the checkpoints they "
            "publish do not fit, it is preempted and then cannot be admitted again: raise "
            "the budget")


def _served_alone(org: OrganizationProtocol, config, prompt: int, output: int) -> bool:
    """Whether a request of ``prompt`` tokens and ``output`` output tokens is
    served to the end with nothing else running, on an empty twin of ``org``
    with the scheduler's own rules: chunked as the token budget says,
    preempted by its own growth if a chunk and its publications do not fit,
    and readmitted over what it cached (or failed). Once its prefill is done
    and what its decode still needs can be allocated, it is served."""
    from harness.records import FINISHED
    from harness.scheduler import Scheduler, SchedulerPolicy
    from harness.scheduler.batch import RUNNING

    twin = org.twin()
    sched = Scheduler(twin, SchedulerPolicy.from_config(config))
    r = sched.add(0, 0.0, np.arange(1, prompt + 1, dtype=np.int64), output, None)
    step = 0
    while sched.has_work:
        if (r.state == RUNNING and r.computed >= r.prefill_until and twin.can_allocate(
                twin.pages_needed(r.rid, prompt + output, r.prefill_until))):
            return True
        batch = sched.schedule()
        if not (batch.items or batch.failed or batch.preempted):
            return True       # waits for something the rehearsal does not model
        step += 1
        if step > 4 * (prompt + output) + 64:
            return False      # preempted and readmitted without end
        sched.complete(batch, float(step))
    return r.record.status == FINISHED
