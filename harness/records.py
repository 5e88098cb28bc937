"""What an engine returns from a run: typed per-request records and per-step rows.

Every engine (the simulator, vLLM, SGLang) fills the same `RequestRecord`, so
metrics, results files and analysis never ask which engine produced a run.
Failures are data, not exceptions: a failed request carries ``status`` and
``error``. A per-request counter the engine cannot see is None, not 0
(`NULLABLE_FIELDS`): a served engine's client sees the tokens a server says
it reused, never a request's preemptions, recomputed tokens, deepest
checkpoint or attention depth, and a server that reports no cached tokens
says nothing of reuse either; a 0 there would read as "none happened". Times are seconds on the engine's clock (virtual for the
simulator, wall for real engines), with the run's benchmark window recorded
alongside in `EngineRun`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

FINISHED = "finished"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = (FINISHED, FAILED, CANCELLED)


@dataclass
class RequestRecord:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    target_output_tokens: int
    status: str = FINISHED
    error: str = ""
    dispatch_s: float | None = None        # real engines: when the request was sent
    first_token_s: float | None = None
    finish_s: float | None = None
    # one per output token, float64 seconds: an array, not a list of Python floats
    # (8 bytes a token instead of 32); any sequence given is converted
    token_times: np.ndarray = field(default_factory=lambda: np.empty(0))
    output_tokens: int = 0
    # the counters of NULLABLE_FIELDS: None where the engine cannot see them
    reused_tokens: int | None = 0          # prompt tokens served from cache (first admission)
    initial_input_tokens: int | None = 0   # prompt tokens computed at first admission
    recomputed_tokens: int | None = 0      # tokens computed again after preemption
    preemptions: int | None = 0
    j_adopt: int | None = 0                # deepest joint (attention + checkpoint) hit
    r_max: int | None = 0                  # deepest valid checkpoint regardless of attention
    attn_depth: int | None = 0             # available attention depth at first lookup
    prefix_group: int = -1
    warmup: bool = False
    session: int = -1                      # multi-turn workloads: session id, else -1
    turn: int = -1                         # multi-turn workloads: turn index in the session
    # (token count, ITL mean, p50, p99, max) once the token times were summed
    # up and dropped as the request finished (`harness.token_times.drop_token_times`,
    # the simulator); None while ``token_times`` holds them
    itl: tuple | None = None

    def __post_init__(self):
        self.token_times = np.asarray(self.token_times, dtype=np.float64)
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")


#: Per-request counters an engine may not see: None in a record where it
#: cannot (a served engine's client), a null in ``requests.parquet``, and
#: "not observed" (null) in the summary, never 0.
NULLABLE_FIELDS = ("reused_tokens", "initial_input_tokens", "recomputed_tokens", "preemptions",
                   "j_adopt", "r_max", "attn_depth")
#: `RequestColumns`' columns: integers (int64), whole counts that may be
#: missing (`NULLABLE_FIELDS`, float64 with NaN for None: exact below 2^53),
#: then times and ITL figures (float64, NaN for a time that is None), from a
#: record's fields (``itl``'s five parts under these names).
INT_FIELDS = ("request_id", "prompt_tokens", "target_output_tokens", "output_tokens",
              "prefix_group", "session", "turn", "n_token_times")
FLOAT_FIELDS = (*NULLABLE_FIELDS, "arrival_s", "dispatch_s", "first_token_s", "finish_s",
                "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
ITL_FIELDS = ("n_token_times", "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
_OPTIONAL = ("dispatch_s", "first_token_s", "finish_s")


class RequestColumns(Sequence):
    """Ended requests' records as fixed-width columns, a row per record, in
    request-id order once `seal`ed: what a long run keeps of a request once
    it ends, ~200 bytes and no Python object (`harness.engine.loop.EngineLoop`
    ``compact``). A record comes in with its token times summed up
    (``itl``, `harness.token_times.drop_token_times`); a time that is None
    is kept as NaN and reads back as None. It still reads as a sequence of
    `RequestRecord` (made on read, with ``itl`` and no token times);
    `harness.metrics` reads its columns (`array`, `statuses`)."""

    def __init__(self):
        self._ints = {f: array("q") for f in INT_FIELDS}
        self._floats = {f: array("d") for f in FLOAT_FIELDS}
        self._status = array("b")                # index in STATUSES
        self._warmup = array("b")
        self._errors: dict[int, str] = {}        # request id -> its error, where there is one
        self._sealed: dict[str, np.ndarray] | None = None

    def add(self, r: RequestRecord) -> None:
        """One ended request's record (its ``itl`` set); nothing holds it after."""
        assert self._sealed is None, "no record after seal"
        assert r.itl is not None, "token times summed up first (drop_token_times)"
        values = {**vars(r), **dict(zip(ITL_FIELDS, r.itl, strict=True))}
        for f, col in self._ints.items():
            col.append(values[f])
        for f, col in self._floats.items():
            v = values[f]
            col.append(np.nan if v is None else v)
        self._status.append(STATUSES.index(r.status))
        self._warmup.append(r.warmup)
        if r.error:
            self._errors[r.request_id] = r.error

    def seal(self) -> RequestColumns:
        """Every record is in: the columns become arrays in request-id order."""
        if self._sealed is None:
            cols = {f: np.frombuffer(c, dtype=np.int64) for f, c in self._ints.items()}
            cols.update({f: np.frombuffer(c, dtype=np.float64) for f, c in self._floats.items()})
            cols["status"] = np.frombuffer(self._status, dtype=np.int8)
            cols["warmup"] = np.frombuffer(self._warmup, dtype=np.int8).astype(bool)
            order = np.argsort(cols["request_id"], kind="stable")
            self._sealed = {f: c[order] for f, c in cols.items()}
            self._ints = self._floats = {}
            self._status = self._warmup = array("b")
        return self

    def array(self, name: str) -> np.ndarray:
        """Column ``name`` (a field of `INT_FIELDS` or `FLOAT_FIELDS`, ``status``
        as its index in `STATUSES`, or ``warmup``), in request-id order; a
        field of `NULLABLE_FIELDS` as float64, NaN where it is None."""
        return self.seal()._sealed[name]

    def statuses(self) -> list[str]:
        return [STATUSES[k] for k in self.array("status").tolist()]

    def errors(self) -> list[str]:
        return [self._errors.get(rid, "") for rid in self.array("request_id").tolist()]

    def __len__(self) -> int:
        if self._sealed is not None:
            return len(self._sealed["request_id"])
        return len(self._status)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        cols = self.seal()._sealed
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(i)
        v = {f: cols[f][k].item() for f in (*INT_FIELDS, *FLOAT_FIELDS)}
        for f in _OPTIONAL:
            if v[f] != v[f]:          # NaN: None
                v[f] = None
        for f in NULLABLE_FIELDS:
            v[f] = None if v[f] != v[f] else int(v[f])
        itl = tuple(v.pop(f) for f in ITL_FIELDS)
        return RequestRecord(**v, status=STATUSES[int(cols["status"][k])],
                             error=self._errors.get(v["request_id"], ""),
                             warmup=bool(cols["warmup"][k]), itl=itl)


def last_finish(requests) -> float:
    """The latest finish time of ``requests`` (records or `RequestColumns`); 0.0 if none."""
    if isinstance(requests, RequestColumns):
        finishes = requests.array("finish_s")
        finishes = finishes[~np.isnan(finishes)]
        return float(finishes.max()) if finishes.size else 0.0
    return max((r.finish_s for r in requests if r.finish_s is not None), default=0.0)


@dataclass
class EngineRun:
    """Everything an engine hands back for one run.

    ``window_start_s``/``window_end_s`` bound the ledger timebase: the whole
    benchmark window including completion polling, excluding engine start and
    stop. ``requests`` are the records in request-id order (a
    `RequestColumns` for the simulator). ``steps`` are per-step rows (dicts of scalars, or the simulator's
    `harness.step_table.StepTable` that reads as them) whose columns depend
    on the engine; ``engine_info`` is what the engine resolved (block counts,
    block size, versions) and goes into the manifest.
    """

    requests: list[RequestRecord] | RequestColumns
    steps: list[dict]
    window_start_s: float
    window_end_s: float
    engine_info: dict = field(default_factory=dict)
    peak_memory: dict = field(default_factory=dict)   # bytes by state kind, whole model
    counters: dict = field(default_factory=dict)      # preemptions, invalidations, ...
    # the inter-token gaps of the finished measured requests whose token times
    # were dropped (`harness.token_times.GapPool`); None when every record keeps its own
    itl_pool: object = None


def first_divergence(tokens, reference) -> int | None:
    """Index of the first token where two greedy streams differ (the shorter
    one's length if one is a strict prefix of the other), or None if equal.
    How `hbench verify` compares a cached continuation with a recompute, on
    every engine."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    if len(tokens) != len(reference):
        return min(len(tokens), len(reference))
    return None
