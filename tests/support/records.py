"""Synthetic request records, as the engine loop hands them to the metrics."""

from __future__ import annotations

import numpy as np

from harness.records import RequestRecord


def finished_records(rng: np.random.Generator) -> list[RequestRecord]:
    """30 requests timed on one shared step clock: 0 - 59 output tokens each
    (none for some), every eleventh from the sixth failed, the first three warm-up."""
    out = []
    steps = np.cumsum(rng.uniform(0.01, 0.05, size=400))
    for rid in range(30):
        first = int(rng.integers(0, 300))
        n = int(rng.integers(0, 60))
        times = steps[first:first + n]
        status = "failed" if rid % 11 == 5 else "finished"
        out.append(RequestRecord(
            request_id=rid, arrival_s=float(steps[first] - 0.1), prompt_tokens=100,
            target_output_tokens=n, status=status,
            first_token_s=float(times[0]) if n else None,
            finish_s=float(times[-1]) if n else None, token_times=times, output_tokens=n,
            warmup=rid < 3))
    return out
