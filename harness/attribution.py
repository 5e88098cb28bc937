"""Where each request's time to first token went: pure functions over a run's tables.

The simulator's step table records, per step, why the requests still waiting
were not admitted (``wait_reason``: memory, cap or budget; admission is FCFS,
so one reason holds for everyone behind the head of the queue) and which
requests were admitted, preempted, or skipped for lack of token budget in
that step (``admitted_ids``, ``preempted_ids``, ``skipped_ids``). Walking a
request's steps from its arrival to its first token splits its TTFT into

- ``wait_memory``: waiting while memory was short (no pages for the first
  chunk with headroom, or a preemption that step);
- ``wait_cap``: waiting while the running cap was full;
- ``wait_budget``: waiting, or admitted but skipped, while the step's token
  budget was spent;
- ``prefill``: admitted and computing, before any preemption;
- ``recompute``: admitted and computing again after a preemption.

Each step counts whole for the state the request had when it was planned.
The parts cover the steps that start between the arrival and the first token;
what is left (``unattributed``) is the wait for the step in flight when the
request arrived, so it is never negative and shorter than one step.

Real engines' step tables carry no reasons: their attribution is empty.

The tables are mappings of column name to values: a run's own columns
(`harness.per_request.request_columns`, `harness.metrics.attribution_steps`:
arrays and lists, so a run computes its attribution without pandas) or
frames read back from a results directory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from harness.token_times import percentiles

#: The step table's columns the attribution reads.
STEP_COLUMNS = ("start_s", "time_s", "wait_reason", "admitted_ids", "preempted_ids", "skipped_ids")
CAUSES = ("wait_memory", "wait_cap", "wait_budget", "prefill", "recompute")
REASON_CAUSE = {"memory": "wait_memory", "cap": "wait_cap", "budget": "wait_budget"}
#: TTFT bands whose mean parts explain a percentile (p50: 45th-55th, p99: the top 2 %).
BANDS = {"p50": (45.0, 55.0), "p99": (98.0, 100.0)}


def has_reasons(steps: Mapping) -> bool:
    return "wait_reason" in steps and "admitted_ids" in steps


def _events(column) -> dict[int, list[int]]:
    """request id -> step indices at which it appears in an id-list column
    (a list, an array or a frame's column)."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(column if isinstance(column, list) else column.tolist()):
        if ids:
            for rid in str(ids).split(","):
                out[int(rid)].append(i)
    return out


@dataclass(frozen=True)
class _Timeline:
    """Step durations and their running sums (all steps, by waiting reason)."""

    dur: np.ndarray
    cum_all: np.ndarray
    cum: dict

    def split(self, i0: int, iend: int, preempted, admitted, skipped) -> dict[str, float]:
        """One request's parts over steps [i0, iend), given the step indices at
        which it was preempted, admitted and skipped. A preemption and a
        re-admission in one step leave it admitted (the preemption came first)."""
        changes = sorted([(i, 0) for i in preempted if i0 <= i < iend]
                         + [(i, 1) for i in admitted if i0 <= i < iend])
        skip = [i for i in skipped if i0 <= i < iend]
        parts = dict.fromkeys(CAUSES, 0.0)
        running, since, recomputing, preempted_once = False, i0, False, False
        for i, admit in [*changes, (iend, -1)]:
            if i > since:
                if not running:
                    for cause, c in self.cum.items():
                        parts[cause] += c[i] - c[since]
                else:
                    budget = sum(self.dur[k] for k in skip if since <= k < i)
                    parts["wait_budget"] += budget
                    total = self.cum_all[i] - self.cum_all[since]
                    parts["recompute" if recomputing else "prefill"] += total - budget
            if admit == 0:
                running, preempted_once = False, True
            elif admit == 1:
                running, recomputing = True, preempted_once
            since = i
        return parts


#: The columns of `attribute`'s result.
PART_COLUMNS = ("request_id", "ttft_s", *(f"{c}_s" for c in CAUSES), "unattributed_s", "step_s")


def attribute(requests: Mapping, steps: Mapping) -> dict[str, np.ndarray]:
    """One row per measured request with a first token, as name: array:
    ``request_id``, ``ttft_s``, one ``<cause>_s`` column per cause,
    ``unattributed_s``, and ``step_s`` (the duration of the step in flight at
    arrival, the bound on ``unattributed_s``). No rows when the step table
    records no reasons."""
    if not has_reasons(steps) or not len(steps["wait_reason"]):
        return _parts([])
    start = np.asarray(steps["start_s"], dtype=float)
    dur = np.asarray(steps["time_s"], dtype=float) - start
    # each reason's steps as a mask (a missing reason matches none)
    reason = np.asarray(steps["wait_reason"], dtype=object)
    timeline = _Timeline(
        dur=dur, cum_all=np.concatenate([[0.0], np.cumsum(dur)]),
        cum={cause: np.concatenate([[0.0], np.cumsum(np.where(reason == r, dur, 0.0))])
             for r, cause in REASON_CAUSE.items()})
    admitted, preempted = _events(steps["admitted_ids"]), _events(steps["preempted_ids"])
    skipped = _events(steps["skipped_ids"])

    first = np.asarray(requests["first_token_s"], dtype=float)
    measured = ~np.asarray(requests["warmup"], dtype=bool) & ~np.isnan(first)
    rows = []
    for rid, a, t1 in zip(np.asarray(requests["request_id"], dtype=np.int64)[measured].tolist(),
                          np.asarray(requests["arrival_s"], dtype=float)[measured].tolist(),
                          first[measured].tolist(), strict=True):
        i0 = int(np.searchsorted(start, a, side="left"))
        iend = int(np.searchsorted(start, t1, side="left"))
        parts = timeline.split(i0, iend, preempted.get(rid, []), admitted.get(rid, []),
                               skipped.get(rid, []))
        ttft = t1 - a
        # the step in flight at arrival, or one planned at the arrival instant
        # just before the arrival was handled (a finishing step goes first)
        step_s = float(max(dur[max(i0 - 1, 0):i0 + 1], default=0.0))
        rows.append([rid, ttft, *(parts[c] for c in CAUSES), ttft - sum(parts.values()), step_s])
    return _parts(rows)


def _parts(rows: list[list]) -> dict[str, np.ndarray]:
    """`attribute`'s rows as its columns: request ids int64, the rest float64."""
    by_column = list(zip(*rows, strict=True)) or [()] * len(PART_COLUMNS)
    return {name: np.array(values, dtype=np.int64 if name == "request_id" else np.float64)
            for name, values in zip(PART_COLUMNS, by_column, strict=True)}


def breakdown(parts: Mapping) -> dict:
    """Per-run TTFT breakdown: for each band of `BANDS`, the mean of each part
    over the requests whose TTFT lies in that band (keys
    ``ttft_<band>_<cause>_s``); NaN without attributed requests."""
    t = np.asarray(parts["ttft_s"], dtype=float)
    out = {}
    for band, (lo, hi) in BANDS.items():
        keep = np.zeros(0, dtype=bool)
        if t.size:
            # np.percentile's values; its first call would import numpy.ma (~10 ms)
            low, high = percentiles(t, (lo, hi))
            keep = (t >= low) & (t <= high)
        for c in CAUSES:
            sel = np.asarray(parts[f"{c}_s"], dtype=float)[keep]
            out[f"ttft_{band}_{c}_s"] = float(sel.mean()) if sel.size else math.nan
    return out


SUMMARY_KEYS = tuple(f"ttft_{band}_{c}_s" for band in BANDS for c in CAUSES)
