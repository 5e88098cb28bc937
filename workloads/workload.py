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
from functools import cached_property

import numpy as np

from common.errors import HbenchError
from workloads.request_seq import MadeOnRead

WORKLOAD_SCHEMA_VERSION = 1


def token_ids(ids: np.ndarray) -> np.ndarray:
    """Token ids stored compactly: int32 when every id fits (any real vocabulary),
    else int64. Half the memory of a derived workload is its prompt ids; every
    reader converts to int64 where it needs to (`Workload.content_hash` hashes
    int64, so the hash does not depend on this)."""
    if ids.size and (int(ids.max()) > np.iinfo(np.int32).max or int(ids.min()) < 0):
        return ids.astype(np.int64)
    return ids.astype(np.int32)


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
    prompt_token_ids: np.ndarray  # int32 or int64 (`token_ids`), length == prompt_len
    output_len: int
    prefix_group: int = -1
    prefix_tokens: int = 0
    salt: str | None = None

    @property
    def prompt_len(self) -> int:
        return int(len(self.prompt_token_ids))


@dataclass(frozen=True)
class Workload:
    """``requests`` are served open-loop at their arrival times: a tuple, or
    for a large derived workload a `workloads.request_seq.MadeOnRead` that
    makes each request when it is read. A multi-turn
    workload also holds ``sessions`` (`workloads.multiturn.session.Session`):
    its requests are the sessions' first turns, and each later turn is made by
    `workloads.multiturn.session.SessionLoop` when the turn before it ends."""

    requests: tuple[WorkloadRequest, ...]
    meta: dict = field(default_factory=dict)
    sessions: tuple = ()

    def __post_init__(self):
        if isinstance(self.requests, MadeOnRead):
            self._check_columns(self.requests)
        else:
            self._check_requests()
        if self.sessions:
            self._check_sessions()

    def _check_columns(self, seq: MadeOnRead) -> None:
        """`_check_requests` over the columns of requests made on read (their
        ids are their indices by construction)."""
        arrivals = seq.arrival_s
        bad = np.flatnonzero(~(np.isfinite(arrivals) & (arrivals >= 0)))
        if bad.size:
            raise HbenchError(f"workload request {int(bad[0])}: arrival time "
                              f"{float(arrivals[bad[0]])} is not a finite number >= 0")
        bad = np.flatnonzero(seq.prompt_len < 1)
        if bad.size:
            raise HbenchError(f"workload request {int(bad[0])}: empty prompt")
        bad = np.flatnonzero(seq.output_len < 1)
        if bad.size:
            raise HbenchError(f"workload request {int(bad[0])}: output length "
                              f"{int(seq.output_len[bad[0]])} must be >= 1")
        if arrivals.size and bool((np.diff(arrivals) < 0).any()):
            raise HbenchError("workload arrivals must be non-decreasing")

    def _check_requests(self) -> None:
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

    def _check_sessions(self) -> None:
        """Sessions start at distinct open-loop requests, and their later turns
        are numbered on from the open-loop requests, session by session."""
        firsts = [s.first_request for s in self.sessions]
        if len(set(firsts)) != len(firsts) or not all(0 <= f < len(self.requests) for f in firsts):
            raise HbenchError("workload sessions must start at distinct requests of the workload")
        ids = [t.request_id for s in self.sessions for t in s.turns]
        if ids != list(range(len(self.requests), len(self.requests) + len(ids))):
            raise HbenchError("later turns must be numbered N.. after the N open-loop requests")
        for s in self.sessions:
            for t in s.turns:
                if not (math.isfinite(t.think_s) and t.think_s >= 0) or t.output_len < 1:
                    raise HbenchError(f"workload turn {t.request_id}: think time {t.think_s} "
                                      f"and output length {t.output_len} must be >= 0 and >= 1")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def total_requests(self) -> int:
        """Requests an engine serves in all: the open-loop ones plus later turns."""
        return len(self.requests) + sum(len(s.turns) for s in self.sessions)

    def warmup_ids(self, warmup: int) -> frozenset[int]:
        """Request ids that are warm-up when the first ``warmup`` open-loop
        requests are: for a multi-turn workload, every turn of those sessions."""
        ids = set(range(min(warmup, len(self.requests))))
        for s in self.sessions:
            if s.first_request in ids:
                ids.update(s.request_ids)
        return frozenset(ids)

    def longest_request(self) -> tuple[int, int]:
        """(prompt, output) tokens of the request with the most tokens in all,
        later turns of sessions included at their planned prompt length."""
        if isinstance(self.requests, MadeOnRead):
            seq = self.requests
            first = int(np.argmax(seq.prompt_len + seq.output_len)) if len(seq) else 0
            sizes = [(int(seq.prompt_len[first]), int(seq.output_len[first]))][:len(seq)]
        else:
            sizes = [(r.prompt_len, r.output_len) for r in self.requests]
        sizes += [(t.prompt_len, t.output_len) for s in self.sessions for t in s.turns]
        return max(sizes, key=sum)

    @cached_property
    def content_hash(self) -> str:
        """sha256 over everything an engine can observe, in request order
        (`stream_hash`): the ``workload_hash`` a run's manifest records.
        Computed once per workload (8 ms at 240 requests): a workload is
        immutable, and a sweep worker serves one to many cells."""
        return stream_hash(self.requests, self.sessions)

    # Parquet save/load lives in workloads/io.py (keeps pyarrow out of this module).


def stream_hash(requests, sessions=()) -> str:
    """sha256 over everything an engine can observe of ``requests`` and the
    ``sessions``' later turns, in request order. A plain function of the
    values (no checks), so a saved file's stored hash can be verified before
    its rows are (`workloads.io.load_workload`)."""
    h = hashlib.sha256()
    for r in requests:
        h.update(
            json.dumps(
                [r.request_id, repr(float(r.arrival_s)), r.output_len, r.prefix_group,
                 r.prefix_tokens, r.salt], separators=(",", ":")
            ).encode()
        )
        h.update(r.prompt_text.encode())
        h.update(np.ascontiguousarray(r.prompt_token_ids, dtype=np.int64).tobytes())
    for s in sessions:
        h.update(json.dumps(["session", s.session_id, s.first_request]).encode())
        for t in s.turns:
            h.update(json.dumps([t.request_id, t.output_len, repr(float(t.think_s)),
                                 t.prompt_len, t.user_text, t.answer_text]).encode())
            h.update(np.ascontiguousarray(t.user_token_ids, dtype=np.int64).tobytes())
            h.update(np.ascontiguousarray(t.answer_token_ids, dtype=np.int64).tobytes())
    return h.hexdigest()
