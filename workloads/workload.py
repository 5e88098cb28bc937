"""The workload value every engine consumes.

A `Workload` is an ordered, immutable list of `WorkloadRequest`s plus the
metadata that built it. Engines see only this: simulated engines read token
ids, real engines send the prompt text. Its `content_hash` covers everything an
engine could observe, so analysis can refuse to pair runs whose request streams
differ.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np

from harness.errors import HbenchError

WORKLOAD_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class WorkloadRequest:
    """One request as offered to an engine.

    ``prefix_group`` is the shared-context id (>= 0) or -1 for a private
    context; ``prefix_tokens`` is the context's length in tokens (the part a
    SHARE run can reuse). ``salt`` is the cache salt (None under SHARE; a stable
    unique string per request under ISOLATE). ``output_len`` is exact: engines
    ignore end-of-sequence.
    """

    request_id: int
    arrival_s: float
    prompt_text: str
    prompt_token_ids: np.ndarray  # int64, length == prompt_len
    output_len: int
    prefix_group: int = -1
    prefix_tokens: int = 0
    salt: str | None = None

    @property
    def prompt_len(self) -> int:
        return int(len(self.prompt_token_ids))


@dataclass(frozen=True)
class Workload:
    requests: tuple[WorkloadRequest, ...]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        ids = [r.request_id for r in self.requests]
        if ids != list(range(len(ids))):
            raise HbenchError("workload request ids must be 0..N-1 in order")
        for r in self.requests:
            if not (math.isfinite(r.arrival_s) and r.arrival_s >= 0):
                raise HbenchError(f"workload request {r.request_id}: arrival time {r.arrival_s} "
                                  "is not a finite number >= 0")
            if r.prompt_len < 1:
                raise HbenchError(f"workload request {r.request_id}: empty prompt")
            if r.output_len < 1:
                raise HbenchError(f"workload request {r.request_id}: output length "
                                  f"{r.output_len} must be >= 1")
        arrivals = [r.arrival_s for r in self.requests]
        if any(b < a for a, b in zip(arrivals, arrivals[1:], strict=False)):
            raise HbenchError("workload arrivals must be non-decreasing")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def content_hash(self) -> str:
        """sha256 over everything an engine can observe, in request order."""
        h = hashlib.sha256()
        for r in self.requests:
            h.update(
                json.dumps(
                    [r.request_id, repr(float(r.arrival_s)), r.output_len, r.prefix_group,
                     r.prefix_tokens, r.salt], separators=(",", ":")
                ).encode()
            )
            h.update(r.prompt_text.encode())
            h.update(np.ascontiguousarray(r.prompt_token_ids, dtype=np.int64).tobytes())
        return h.hexdigest()

    # Parquet save/load lives in workloads/io.py (keeps pyarrow out of this module).
