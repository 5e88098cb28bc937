"""The scheduler's values: a request as it sees one, and the batch of one step.

`SchedRequest` is the scheduler's view of one request (its record filled as
it runs), `StepBatch` what one step computes (`BatchItem`s, plus who was
preempted, failed, admitted or skipped, and why the rest wait). Engines read
them; only the scheduler (`harness.scheduler`) and its stretches
(`harness.scheduler.stretch`) change them. `generated_token` is the
deterministic stand-in for a generated token id, scalar or vectorized.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from harness.records import RequestRecord

WAITING, RUNNING, DONE = "waiting", "running", "done"

# Why the requests left waiting after a step was planned did not start in it
# (one reason per step: admission is FCFS, so every waiting request waits
# behind the one that stopped it). Recorded per step for TTFT attribution.
WAIT_MEMORY = "memory"      # no pages (or headroom) for the head's first chunk (or whole input), or a preemption
WAIT_CAP = "cap"            # the running cap is full
WAIT_BUDGET = "budget"      # the step's token budget is spent


@dataclass
class SchedRequest:
    """The scheduler's view of one request (its record is filled as it runs)."""

    rid: int
    arrival_s: float
    tokens: array               # prompt, then generated token ids (`token_array`)
    keys: list[int]             # chained 16-token prefix keys of `tokens`
    salt: str | None
    prompt_len: int
    output_len: int
    record: RequestRecord
    computed: int = 0           # tokens whose state is computed
    prefill_until: int = 0      # tokens to (re)compute before generating
    generated: int = 0
    state: str = WAITING
    admitted_seq: int = -1
    first_admission: bool = True
    # token times so far ('d': 8 bytes each); the record gets them as an array at close
    token_times: array = field(default_factory=lambda: array("d"))

    @classmethod
    def arriving(cls, rid: int, arrival_s: float, tokens: array, output_len: int,
                 salt: str | None, keys: list[int], prefix_group: int = -1,
                 warmup: bool = False) -> SchedRequest:
        """A request as it arrives (``tokens``: its prompt as `token_array`
        made it): the prompt to prefill, its record opened."""
        rec = RequestRecord(request_id=rid, arrival_s=arrival_s, prompt_tokens=len(tokens),
                            target_output_tokens=output_len, prefix_group=prefix_group,
                            warmup=warmup)
        return cls(rid, arrival_s, tokens, keys, salt, len(tokens), output_len, rec,
                   prefill_until=len(tokens))

    def close(self, status: str, error: str = "") -> None:
        """The request ends (finished, failed or cancelled): its record is complete."""
        self.state = DONE
        self.record.status = status
        self.record.error = error
        self.record.output_tokens = self.generated
        self.record.token_times = np.array(self.token_times, dtype=np.float64)

    @property
    def decoding(self) -> bool:
        return self.computed >= self.prefill_until


@dataclass
class BatchItem:
    req: SchedRequest
    start: int
    end: int
    prefill: bool
    grid: int                    # the organization's checkpoint interval
    adopted: bool = False        # loads a cached checkpoint into its live state


@dataclass
class StepBatch:
    """What one engine step computes: ``items``, plus the requests preempted and
    failed while the scheduler built it."""

    items: list[BatchItem] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    # why the requests still waiting were not admitted ("" when none waits),
    # who was admitted, and running requests that computed nothing for lack of
    # token budget; read by the step recorder, never by the scheduler itself
    wait_reason: str = ""
    admitted: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    @property
    def batch_tokens(self) -> int:
        return sum(i.end - i.start for i in self.items)


def token_array(token_ids) -> array:
    """Token ids as an ``array('i')`` (4 bytes each) when they fit in 32 bits, as
    every vocabulary's and `generated_token`'s do, else ``array('q')``. A token
    appended later that does not fit raises OverflowError, never wraps."""
    ids = np.asarray(token_ids)
    if ids.dtype.kind not in "iu":
        ids = ids.astype(np.int64)
    fits = ids.size == 0 or (int(ids.min()) >= -2**31 and int(ids.max()) < 2**31)
    tokens = array("i" if fits else "q")
    tokens.frombytes(np.ascontiguousarray(ids, dtype=np.dtype(tokens.typecode)).tobytes())
    return tokens


def generated_token(rid: int, index):
    """A deterministic stand-in for the token a request generates (unique per
    request). ``index`` may also be an int64 numpy array of indices: then the
    same values come as an int64 array (every intermediate fits in 64 bits)."""
    return 1_000_000 + (rid * 7919 + index * 104729) % 1_000_000_007
