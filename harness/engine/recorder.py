"""An in-process engine's step table and run counters, kept out of its event loop.

An engine's executor (`harness.engine.executor.Executor`) and the
scheduler's stretches (`harness.scheduler.stretch`) tell a `StepRecorder`
two things: a step started (with the batch, its cost and the scheduler's
queues) and a step ended. The recorder samples the organization's memory at
each step start through its view (`step_memory`, `usage()`'s figures) and
turns it into one row of ``steps.parquet``; at the end it
assembles the run's counters. It reads; it never changes the scheduler or
the organization.

Each row holds the step's timing (``start_s``, ``time_s`` = end,
``duration_s``) and cost breakdown, the queue lengths when it was planned,
what the batch computes, the organization's cumulative invalidations by kind
(``invalidations_attention`` blocks, ``invalidations_checkpoint``
checkpoints, counted before the step), and memory at the step's start: pages
per pool and state, blocks per state kind, referenced and cached bytes per
state kind, and rounding waste per state kind (``waste_<kind>_bytes``:
allocated minus logical bytes of the pages holding that kind); all bytes are
whole model, i.e. times the pool layers. The scheduler's reasons close each
row: ``wait_reason`` (why requests still waiting were not admitted: memory,
cap or budget; "" when nobody waits) and the ids admitted, preempted and
skipped for lack of token budget in that step (``admitted_ids``,
``preempted_ids``, ``skipped_ids``, comma-separated). `harness.metrics` takes the
measured period's peaks, waste and invalidations from these rows.

The rows are kept as a `harness.step_table.StepTable` (packed by column
every few thousand rows; a long run makes ~20 rows per request), which a
recorder made with ``spill`` (the simulator's) writes to a temporary
Parquet file a packed chunk at a time instead of holding. The row in progress is a dict,
so that its end time can still be set; it is frozen when the next one starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness import step_table
from harness.orgs.protocol import OrganizationProtocol
from harness.step_table import StepTable


class _OpenRows(Sequence):
    """The frozen rows of a table, then the row in progress (a dict, itself)."""

    def __init__(self, table: StepTable, last: dict | None):
        self.table, self.last = table, last

    def __len__(self) -> int:
        return len(self.table) + (self.last is not None)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(i)
        return self.last if k == len(self.table) else self.table[k]


#: The columns every row starts with (`StepRecorder._start`), memory after them.
_HEAD = ("time_s", "start_s", "duration_s", "running", "waiting", "batch_tokens",
         "prefill_tokens", "decode_requests", "preempted", "weights_s", "kv_s", "state_io_s",
         "compute_s", "overhead_s", "bound", "wait_reason", "admitted_ids", "preempted_ids",
         "skipped_ids")
_N_HEAD = len(_HEAD)


def _ids(rids) -> str:
    """Request ids as one compact column value ("3,17"; "" for none)."""
    return ",".join(map(str, rids))


class StepRecorder:
    """Builds step rows and run counters for one run of an in-process engine."""

    def __init__(self, org: OrganizationProtocol, pool_layers: int, *, spill: bool = False):
        self.org = org
        self.layers = pool_layers
        self._table = StepTable()               # the finished rows
        if spill:       # packed chunks to a temporary Parquet file once there are many
            self._table.spill(step_table.SPILL_AFTER_CHUNKS)   # (`StepTable.spill`)
        self._last: dict | None = None          # the row in progress, if a started one
        # a repeated row in progress: its first `_HEAD` values (a list, so that
        # its end time can still be set) and the memory values after them
        self._head: list | None = None
        self._tail: tuple = ()
        # memory is read through the organization's view, which keeps the peaks
        self._mem = org.step_memory(pool_layers)
        self.peak = self._mem.peak              # per-kind peaks of referenced bytes (own moments)

    def step_started(self, now: float, batch, cost, running: int, waiting: int) -> None:
        """A step over ``batch`` starts at ``now`` and takes ``cost.total_s``."""
        self._start(now, cost, running, waiting, batch.batch_tokens,
                    sum(i.end - i.start for i in batch.items if i.prefill),
                    sum(1 for i in batch.items if not i.prefill), len(batch.preempted),
                    batch.wait_reason, _ids(batch.admitted), _ids(batch.preempted),
                    _ids(batch.skipped))

    def decode_step_started(self, now: float, cost, running: int, waiting: int,
                            wait_reason: str, preempted=()) -> None:
        """`step_started` for a batch of one decode per running request that
        admits and skips no one and preempted ``preempted`` (ids) to make
        room (a step a stretch plans): the same row without the batch."""
        self._start(now, cost, running, waiting, running, 0, running, len(preempted),
                    wait_reason, "", _ids(preempted), "")

    def admission_step_started(self, now: float, cost, decodes: int, batch, running: int,
                               waiting: int) -> None:
        """`step_started` for ``decodes`` decodes (one per request that ran
        before) followed by ``batch``'s items, the prefill chunks of the
        requests it admitted (a step a stretch plans)."""
        chunks = sum(i.end - i.start for i in batch.items)
        self._start(now, cost, running, waiting, decodes + chunks, chunks, decodes, 0,
                    batch.wait_reason, _ids(batch.admitted), "", "")

    def _start(self, now, cost, running, waiting, batch_tokens, prefill_tokens, decode_requests,
               preempted, wait_reason, admitted_ids, preempted_ids, skipped_ids) -> None:
        # the scheduler's reasons close the head (TTFT attribution, `harness.attribution`)
        row = dict(zip(_HEAD, (now, now, cost.total_s, running, waiting, batch_tokens,
                               prefill_tokens, decode_requests, preempted, cost.weights_s,
                               cost.kv_s, cost.state_io_s, cost.compute_s, cost.overhead_s,
                               cost.bound, wait_reason, admitted_ids, preempted_ids,
                               skipped_ids), strict=True))
        self._add_memory(row)
        self._push(row)

    def _push(self, row: dict | None) -> None:
        """``row`` is the row in progress; the one before it is frozen."""
        self._freeze()
        self._last = row

    def _freeze(self) -> None:
        """The row in progress, if any, becomes a table row."""
        if self._head is not None:
            self._table.append((*self._head, *self._tail))
            self._head = None
        elif self._last is not None:
            if not self._table.columns:
                self._table.set_columns(self._last)
            self._table.append(tuple(self._last.values()))
            self._last = None

    @property
    def rows(self) -> Sequence[dict]:
        """Every row so far as dicts, the row in progress last: a started one is
        the recorder's own, so an engine may still fill in its timing (a
        repeated one comes as a copy)."""
        last = self._last
        if self._head is not None:
            last = dict(zip(self._table.columns, (*self._head, *self._tail), strict=True))
        return _OpenRows(self._table, last)

    def table(self) -> StepTable:
        """Every row, the last one frozen too: the run's step table (sealed:
        `StepTable.seal`)."""
        self._push(None)
        self._table.seal()
        return self._table

    def decode_repeated(self, now: float, cost: tuple, waiting: int, fresh: bool,
                        wait_reason: str | None = None, running: int | None = None) -> None:
        """The same batch as the last step runs again from ``now`` (a quiet
        decode step of a stretch, `harness.scheduler.stretch`): the last row
        with the new timing, cost (a tuple in `StepCost`'s field order,
        `CostModel.decode_values`) and waiting queue; memory is read again
        only if ``fresh`` (pages changed since). ``running``: the batch lost
        its finished requests and decodes for these ``running`` requests (all
        that run)."""
        p = self._head
        if p is None:       # the last row is a started one: freeze it, keep its values
            last, self._last = self._last, None
            if not self._table.columns:
                self._table.set_columns(last)
            values = tuple(last.values())
            self._table.append(values)
            p, self._tail = values[:_N_HEAD], values[_N_HEAD:]
        else:
            self._table.append((*p, *self._tail))
        if running is None:
            running, batch_tokens, decodes = p[3], p[5], p[7]
        else:
            batch_tokens = decodes = running
        # nobody is admitted, preempted or skipped in a repeated decode step; why
        # the waiting requests wait is ``wait_reason`` when the stretch asked
        # the scheduler again (after an arrival or an eviction), else the last
        # step's: nothing that decides it changed
        self._head = [now, now, cost[5], running, waiting, batch_tokens, p[6], decodes, p[8],
                      cost[0], cost[1], cost[2], cost[3], cost[4], cost[6],
                      p[15] if wait_reason is None else wait_reason, "", "", ""]
        if fresh:
            self._tail = self._memory()

    @property
    def waste_peak(self) -> int:
        """The largest per-step total rounding waste (bytes, whole model)."""
        return self._mem.waste_peak

    def _add_memory(self, row: dict) -> None:
        """Memory and invalidation columns of ``row`` from the organization now."""
        row.update(zip(self._memory_columns(), self._memory(), strict=True))

    def _memory_columns(self) -> tuple[str, ...]:
        return self._mem.columns

    def _memory(self) -> tuple:
        """The values of `_memory_columns` now, and the peaks updated: the
        organization's `step_memory` view (`harness.orgs.audit.StepMemory`),
        `usage()`'s figures whole model (`tests/unit/adapters/sim/test_recorder_memory.py` holds
        the two together)."""
        return self._mem.sample()

    def step_finished(self, now: float) -> None:
        """The step started last ends at ``now``."""
        if self._head is not None:
            self._head[0] = now
        else:
            self._last["time_s"] = now

    def counters(self, preemptions: int, budget_rounding_bytes: int) -> dict:
        """The whole run's counters (bytes whole model); ``budget_rounding_bytes`` is
        the budget's rounding loss per pool layer. Invalidations are cumulative
        entries by kind; ``rounding_waste_bytes`` is the budget's loss plus the
        largest per-step total page waste; an organization of one region (u0,
        e0) adds its `region_counters` (whole run)."""
        by_kind = self.org.invalidations_by_kind
        return {
            "invalidations_attention": by_kind["attention"],
            "invalidations_checkpoint": by_kind["checkpoint"],
            "preemptions": preemptions,
            "checkpoints_published": self.org.published_count,
            "rounding_waste_bytes": {"budget": budget_rounding_bytes * self.layers,
                                     "pages": self.waste_peak},
            **self.org.region_counters(self.layers),   # u0, e0: refusals, moves
        }
