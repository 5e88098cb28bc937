"""What an engine returns from a run: typed per-request records and per-step rows.

Every engine (the simulator, vLLM, SGLang, torch) fills the same
`RequestRecord` for a request and appends it, once it ended, to its run's
one `harness.request_table.RequestTable`, so metrics, results files and
analysis never ask which engine produced a run.
Failures are data, not exceptions: a failed request carries ``status`` and
``error``. A per-request counter the engine cannot see is None, not 0
(`NULLABLE_FIELDS`): a served engine's client sees the tokens a server says
it reused, never a request's preemptions, recomputed tokens, deepest
checkpoint or attention depth, and a server that reports no cached tokens
says nothing of reuse either; a 0 there would read as "none happened".
Times are seconds on the engine's clock (virtual for the simulator, wall
for real engines), with the run's benchmark window recorded alongside in
`EngineRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from harness.request_table import RequestTable

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

    def __post_init__(self):
        self.token_times = np.asarray(self.token_times, dtype=np.float64)
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")


#: Per-request counters an engine may not see: None in a record where it
#: cannot (a served engine's client), a null in ``requests.parquet``, and
#: "not observed" (null) in the summary, never 0.
NULLABLE_FIELDS = ("reused_tokens", "initial_input_tokens", "recomputed_tokens", "preemptions",
                   "j_adopt", "r_max", "attn_depth")


@dataclass
class EngineRun:
    """Everything an engine hands back for one run.

    ``window_start_s``/``window_end_s`` bound the ledger timebase: the whole
    benchmark window including completion polling, excluding engine start and
    stop. ``requests`` is the run's `harness.request_table.RequestTable`
    (a row per request, in request-id order). ``steps`` are per-step rows (dicts of scalars, or the simulator's
    `harness.step_table.StepTable` that reads as them) whose columns depend
    on the engine; ``engine_info`` is what the engine resolved (block counts,
    block size, versions) and goes into the manifest.
    """

    requests: RequestTable
    steps: list[dict]
    window_start_s: float
    window_end_s: float
    engine_info: dict = field(default_factory=dict)
    peak_memory: dict = field(default_factory=dict)   # bytes by state kind, whole model
    counters: dict = field(default_factory=dict)      # preemptions, invalidations, ...


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
