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
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: The step table's columns the attribution reads.
STEP_COLUMNS = ("start_s", "time_s", "wait_reason", "admitted_ids", "preempted_ids", "skipped_ids")
CAUSES = ("wait_memory", "wait_cap", "wait_budget", "prefill", "recompute")
REASON_CAUSE = {"memory": "wait_memory", "cap": "wait_cap", "budget": "wait_budget"}
#: TTFT bands whose mean parts explain a percentile (p50: 45th-55th, p99: the top 2 %).
BANDS = {"p50": (45.0, 55.0), "p99": (98.0, 100.0)}


def has_reasons(steps: pd.DataFrame) -> bool:
    return "wait_reason" in steps.columns and "admitted_ids" in steps.columns


def _events(column: pd.Series) -> dict[int, list[int]]:
    """request id -> step indices at which it appears in an id-list column."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(column.tolist()):
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


def attribute(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per measured request with a first token: ``request_id``,
    ``ttft_s``, one ``<cause>_s`` column per cause, ``unattributed_s``, and
    ``step_s`` (the duration of the step in flight at arrival, the bound on
    ``unattributed_s``). Empty when the step table records no reasons."""
    cols = ["request_id", "ttft_s", *(f"{c}_s" for c in CAUSES), "unattributed_s", "step_s"]
    if steps.empty or not has_reasons(steps):
        return pd.DataFrame(columns=cols)
    start = steps["start_s"].to_numpy(float)
    dur = steps["time_s"].to_numpy(float) - start
    # each reason's steps as a mask: no Python string per step (a long run has millions)
    reason = steps["wait_reason"]
    timeline = _Timeline(
        dur=dur, cum_all=np.concatenate([[0.0], np.cumsum(dur)]),
        cum={cause: np.concatenate([[0.0], np.cumsum(np.where(
            reason.eq(r).to_numpy(dtype=bool, na_value=False), dur, 0.0))])
             for r, cause in REASON_CAUSE.items()})
    admitted, preempted = _events(steps["admitted_ids"]), _events(steps["preempted_ids"])
    skipped = _events(steps["skipped_ids"])

    measured = requests[~requests["warmup"].astype(bool) & requests["first_token_s"].notna()]
    rows = []
    for r in measured.itertuples(index=False):
        rid, a, t1 = int(r.request_id), float(r.arrival_s), float(r.first_token_s)
        i0 = int(np.searchsorted(start, a, side="left"))
        iend = int(np.searchsorted(start, t1, side="left"))
        parts = timeline.split(i0, iend, preempted.get(rid, []), admitted.get(rid, []),
                               skipped.get(rid, []))
        ttft = t1 - a
        # the step in flight at arrival, or one planned at the arrival instant
        # just before the arrival was handled (a finishing step goes first)
        step_s = float(max(dur[max(i0 - 1, 0):i0 + 1], default=0.0))
        rows.append([rid, ttft, *(parts[c] for c in CAUSES), ttft - sum(parts.values()), step_s])
    return pd.DataFrame(rows, columns=cols)


def breakdown(parts: pd.DataFrame) -> dict:
    """Per-run TTFT breakdown: for each band of `BANDS`, the mean of each part
    over the requests whose TTFT lies in that band (keys
    ``ttft_<band>_<cause>_s``); NaN without attributed requests."""
    out = {}
    for band, (lo, hi) in BANDS.items():
        if parts.empty:
            sel = parts
        else:
            t = parts["ttft_s"].to_numpy(float)
            low, high = np.percentile(t, lo), np.percentile(t, hi)
            sel = parts[(t >= low) & (t <= high)]
        for c in CAUSES:
            out[f"ttft_{band}_{c}_s"] = float(sel[f"{c}_s"].mean()) if len(sel) else math.nan
    return out


SUMMARY_KEYS = tuple(f"ttft_{band}_{c}_s" for band in BANDS for c in CAUSES)
