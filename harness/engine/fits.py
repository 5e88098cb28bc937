"""Refusing a budget that cannot serve a workload, before any step runs.

Every in-process engine calls `check_fits` after building its organization:
a run whose longest request cannot be served even alone would otherwise fail
that request (or stall) after minutes of work.
"""

from __future__ import annotations

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
