"""Run-level metrics from an `EngineRun`: pure functions, identical for every engine.

`summarize` turns one run into a flat dict of scalars (the ``summary.json`` of
a results directory); `per_request_table` turns it into one row per request
(``requests.parquet``). Analysis code reads these keys by name, so
`SUMMARY_KEYS` is the contract: adding or renaming a key is a schema change.
A multi-turn run (records with a ``turn`` index) adds `TURN_SUMMARY_KEYS` to
its summary and `TURN_COLUMNS` to its per-request table (`turn_history`). A
run a real server served adds `SERVED_SUMMARY_KEYS` (`served_summary`): TTFT
from the actual send beside TTFT from the scheduled arrival, the server's own
latency histograms beside the client's numbers, and the plugin's page peaks.
A run of u0 or e0 adds `REGION_SUMMARY_KEYS`; a run of SGLang's memory code
`SGLANG_SUMMARY_KEYS`; a run of vLLM's scheduler in process
`VLLM_INPROCESS_SUMMARY_KEYS`.

Which requests count where:

- warm-up requests (``RequestRecord.warmup``) are excluded from every summary
  metric, including counts;
- throughput, ``output_tokens`` and the latency distributions (TTFT, ITL,
  TPOT, end-to-end) use finished requests only: a failed or cancelled request
  has no meaningful completion time and its partial tokens were not served;
- work and cache counters (reused / initial / recomputed tokens, preemptions,
  J_adopt, R_max, attention depth) and dispatch lag use every non-warm-up
  request, because the engine did that work whether or not the request
  finished. A counter the engine did not observe for a request (None in its
  record, `harness.records.NULLABLE_FIELDS`: a served engine's client never
  sees preemptions or recomputed tokens) is left out; a summary counter no
  request observed is null (not observed), never 0.

The measured period starts at the first measured (non-warm-up) arrival:

- the ledger window runs from there (or from the engine's window start, if
  later) to the engine's window end;
- everything taken from the step table covers step rows that start in the
  measured period (a row's ``start_s``, or its ``time_s`` for engines whose
  rows are samples): queue medians, memory peaks, rounding waste,
  invalidations, slab occupancy.

Step-based definitions (README, "What each number means"):

- ``waiting_median`` / ``running_median`` are over time: each row weighs its
  ``duration_s`` and idle gaps between rows count as zeros (rows without a
  duration, such as a scraped gauge, weigh the same), so they equal the
  median a gauge sampled at a fixed interval would give;
- ``peak_mem_total_bytes`` is the largest per-row total of the per-kind
  ``mem_<kind>_bytes`` plus the weights; ``peak_mem_<kind>_bytes`` are per-kind
  peaks, each at its own moment, and are never summed;
- ``rounding_waste_bytes`` is the budget's rounding loss plus the largest
  per-row total of ``waste_<kind>_bytes``;
- invalidations are counted by kind (``invalidations_attention`` blocks,
  ``invalidations_checkpoint`` checkpoints) and in tokens
  (``invalidated_tokens`` = attention blocks x the engine's block tokens),
  because a D0 attention block is 16 tokens and an S1 block 512.

Validity (``validity``, the one nested object, and ``delivered_rate_req_s``)
and the TTFT attribution (``ttft_p50_<cause>_s``, ``ttft_p99_<cause>_s``) are
computed by `harness.validity` and `harness.attribution`.

Percentiles are numpy's linear interpolation; an empty sample gives NaN
(written to JSON as null by `harness.results`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from harness.attribution import SUMMARY_KEYS as ATTRIBUTION_KEYS
from harness.records import (
    CANCELLED,
    FAILED,
    FINISHED,
    STATUSES,
    EngineRun,
    RequestColumns,
    RequestRecord,
)
from harness.step_table import StepTable, has_step_key, step_values
from harness.token_times import (
    counted_percentiles,
    inter_token_gaps_of,
    percentiles,
    token_time_stats,
)

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

SUMMARY_KEYS = (
    "throughput_ledger_tok_s", "throughput_span_tok_s", "output_tokens",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
    "itl_p50_s", "itl_p90_s", "itl_p99_s",
    "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
    "e2e_p50_s", "e2e_p90_s", "e2e_p99_s",
    "peak_mem_total_bytes", "peak_mem_attention_bytes", "peak_mem_ssm_bytes",
    "peak_mem_conv_bytes",
    "waiting_median", "running_median",
    "preemptions", "invalidations_attention", "invalidations_checkpoint", "invalidated_tokens",
    "slab_occupancy_mean", "rounding_waste_bytes",
    "initial_input_tokens", "reused_tokens", "recomputed_tokens",
    "j_adopt_mean", "r_max_mean", "attn_depth_mean",
    "finished", "failed", "cancelled", "requests",
    "dispatch_lag_p99_s",
    "delivered_rate_req_s", "validity",
    *ATTRIBUTION_KEYS,
)

# Columns of `per_request_table`, in order, with the NumPy dtype each is built
# as ("object": text, a list of str, written as an Arrow string column;
# `NULLABLE_INT`: a whole count that may be missing, built as float64 with
# NaN for None and written as an Arrow int64 column with nulls).
NULLABLE_INT = "Int64"
REQUEST_COLUMNS = {
    "request_id": "int64",
    "arrival_s": "float64",
    "dispatch_s": "float64",
    "first_token_s": "float64",
    "finish_s": "float64",
    "prompt_tokens": "int64",
    "target_output_tokens": "int64",
    "output_tokens": "int64",
    "reused_tokens": NULLABLE_INT,
    "initial_input_tokens": NULLABLE_INT,
    "recomputed_tokens": NULLABLE_INT,
    "preemptions": NULLABLE_INT,
    "j_adopt": NULLABLE_INT,
    "r_max": NULLABLE_INT,
    "attn_depth": NULLABLE_INT,
    "prefix_group": "int64",
    "status": "object",
    "error": "object",
    "warmup": "bool",
    "ttft_s": "float64",
    "e2e_s": "float64",
    "itl_mean_s": "float64",
    "itl_p50_s": "float64",
    "itl_p99_s": "float64",
    "itl_max_s": "float64",
    "tpot_s": "float64",
    "n_token_times": "int64",
}

# Multi-turn runs (records with a turn index) add these columns and summary keys.
TURN_COLUMNS = {
    "session": "int64",
    "turn": "int64",
    "history_tokens": "int64",
    "history_recomputed_tokens": NULLABLE_INT,
    "history_survived": "float64",
}
TURN_SUMMARY_KEYS = (
    "sessions", "later_turns", "turn0_ttft_p50_s", "later_turn_ttft_p50_s",
    "history_tokens", "history_reused_tokens", "history_reuse_fraction",
    "history_recomputed_tokens", "history_survived_fraction", "delivered_session_rate",
)

# Served runs (`is_served`) add these: ``ttft_send_*`` is TTFT from the moment
# the client sent the request (``ttft_*`` is from the scheduled arrival, so the
# two differ by the dispatch lag); ``server_*`` are the server's own
# histograms over the run (`adapters.metrics_scrape.server_latency`; they
# count warm-up requests too); the page peaks are hbench's vLLM plugin's
# (S1/S2 member pages, S2 slab pages). Null where the server does not say.
SERVER_LATENCY_KEYS = tuple(f"server_{name}_p{q}_s" for name in ("ttft", "itl", "tpot", "e2e")
                            for q in (50, 99))
SERVED_SUMMARY_KEYS = ("ttft_send_p50_s", "ttft_send_p99_s", *SERVER_LATENCY_KEYS,
                       "member_pages_peak", "slab_pages_peak")

#: An organization whose two pools share one region (u0, e0;
#: `harness.orgs.region`) adds those of these its engine counted, whole run
#: (warm-up included): allocations refused, those refused with the region's
#: free bytes at least the bytes asked, the largest free bytes such a refusal
#: could not use, and e0's capacity moves, bytes moved and the seconds the
#: simulator charged for remapping them (``capacity_move_s``, docs/cost-model.md);
#: u0's compactions, the pages and bytes they copied and the seconds charged
#: for the copies (``compaction_copy_s``), the cached attention pages evicted
#: to fund states and the cached checkpoints that went with their blocks.
REGION_SUMMARY_KEYS = (
    "alloc_refusals", "alloc_refusals_with_room", "fragmented_bytes_peak",
    "capacity_moves", "capacity_moved_bytes", "capacity_moved_to_attention_bytes",
    "capacity_moved_to_checkpoint_bytes", "capacity_move_s",
    "compactions", "compaction_moved_pages", "compaction_moved_bytes", "compaction_copy_s",
    "donated_attention_pages", "cascaded_checkpoints",
)

#: A run that tunes the utility eviction's alpha (``--utility-alpha auto``,
#: `harness.orgs.alpha_tuning`) adds the alpha it chose (null if the run ended
#: before its bootstrap window did) and the requests admitted when it chose.
POLICY_SUMMARY_KEYS = ("utility_alpha_tuned", "utility_alpha_tuned_at")

#: A run of SGLang's own memory code (`--engine sglang` in process,
#: adapters/sglang_cpu) adds SGLang's served-state counters, whole run (warm-up
#: included): tree evictions and what they freed in each pool, the nodes they
#: tombstoned (Mamba state freed, KV kept), the peak of Mamba slots in use and
#: the Mamba pool's size (slots, one pool layer).
SGLANG_SUMMARY_KEYS = (
    "sglang_evictions", "sglang_evicted_kv_tokens", "sglang_evicted_mamba_slots",
    "sglang_tombstoned_nodes", "sglang_mamba_slots_in_use_peak", "sglang_mamba_slots",
)

#: A run decided by vLLM's own scheduler in process (`--engine vllm` without a
#: server, adapters/vllm_inprocess) adds vLLM's prefix-cache counters
#: (``PrefixCacheStats`` summed over steps, whole run: requests looked up at
#: first admission, their prompt tokens and the tokens hit; the same for
#: requests resumed after a preemption) and the block count vLLM was built with.
VLLM_INPROCESS_SUMMARY_KEYS = (
    "vllm_prefix_requests", "vllm_prefix_queries", "vllm_prefix_hits",
    "vllm_preempted_prefix_requests", "vllm_preempted_prefix_queries",
    "vllm_preempted_prefix_hits", "vllm_num_blocks",
)

NAN = float("nan")


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100, linear interpolation) of ``values``; NaN if empty."""
    return percentiles(values, (q,))[0]


def _mean(values) -> float:
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()) if arr.size else NAN


def _observed(values) -> np.ndarray:
    """``values`` (None or NaN where not observed) as float64, the observed ones only."""
    arr = np.array([NAN if v is None else v for v in values], dtype=float) \
        if isinstance(values, list) else np.asarray(values, dtype=float)
    return arr[~np.isnan(arr)]


def _observed_sum(values):
    """The sum of the observed ``values`` as an int; NaN (not observed) when
    none was, so a counter the engine cannot see never reads as 0."""
    arr = _observed(values)
    return int(arr.sum()) if arr.size else NAN


def _observed_mean(values) -> float:
    """The mean of the observed ``values``; NaN when none was."""
    return _mean(_observed(values))


def _median(values) -> float:
    arr = np.asarray(values, dtype=float)
    return float(np.median(arr)) if arr.size else NAN


def _diff(later: float | None, earlier: float | None) -> float:
    if later is None or earlier is None:
        return NAN
    return float(later) - float(earlier)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 and math.isfinite(den) else NAN


def ttft(r: RequestRecord) -> float:
    """Time to first token: first token minus arrival (NaN without a first token)."""
    return _diff(r.first_token_s, r.arrival_s)


def e2e(r: RequestRecord) -> float:
    """End-to-end latency: finish minus arrival (NaN without a finish time)."""
    return _diff(r.finish_s, r.arrival_s)


def tpot(r: RequestRecord) -> float:
    """Time per output token after the first: (finish - first) / (tokens - 1).

    NaN for requests with fewer than two output tokens or missing times.
    """
    if r.output_tokens < 2:
        return NAN
    return _diff(r.finish_s, r.first_token_s) / (r.output_tokens - 1)


def inter_token_gaps(r: RequestRecord) -> np.ndarray:
    """Gaps between consecutive token times (empty with fewer than two, or
    once they were dropped: `harness.token_times.drop_token_times`)."""
    return inter_token_gaps_of(r.token_times)


def weighted_median(values, weights) -> float:
    """The median of ``values`` where value i holds for ``weights[i]`` (a duration).

    The smallest value whose cumulative weight passes half the total; where the
    cumulative weight lands exactly on half, the midpoint of that value and the
    next, as `numpy.median` does for an even count. With equal weights it is
    `numpy.median`. Zero-weight values are ignored; NaN if nothing is left.
    """
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return NAN
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    half = cum[-1] / 2
    k = int(np.searchsorted(cum, half, side="left"))
    if math.isclose(cum[k], half, rel_tol=1e-9) and k + 1 < v.size:
        return float((v[k] + v[k + 1]) / 2)
    return float(v[k])


def _floats(rows, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Column ``name`` of step rows as float64, one value per row (NaN where a
    row has None), and which rows have a value (None when all do). A
    `StepTable`'s numeric column is read as its array, with no Python number
    per row: a long run has millions of rows."""
    if isinstance(rows, StepTable):
        arr = rows.array(name)
        if isinstance(arr, np.ndarray):
            return arr.astype(np.float64, copy=False), None
    values = step_values(rows, name)
    have = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    out = np.array([NAN if v is None else float(v) for v in values], dtype=np.float64)
    return out, (None if have.all() else have)


def _row_times(rows) -> np.ndarray:
    """Each row's time: its ``start_s``, else its ``time_s`` (a sample), else 0."""
    starts, have = _floats(rows, "start_s")
    if have is None:
        return starts
    starts, times = step_values(rows, "start_s"), step_values(rows, "time_s")
    return np.array([float(s if s is not None else (0.0 if t is None else t))
                     for s, t in zip(starts, times, strict=True)], dtype=np.float64)


def measured_start(run: EngineRun) -> float:
    """First measured (non-warm-up) arrival; NaN if no request is measured."""
    if isinstance(run.requests, RequestColumns):
        cols = run.requests
        arrivals = cols.array("arrival_s")[~cols.array("warmup")]
        return float(arrivals.min()) if arrivals.size else NAN
    arrivals = [r.arrival_s for r in run.requests if not r.warmup]
    return min(arrivals) if arrivals else NAN


#: The step columns the summary reads (`summarize`, `_validity`): all a
#: `StepTable`'s measured rows are selected by, when some rows are left out.
SUMMARY_STEP_COLUMNS = (
    "start_s", "time_s", "duration_s", "waiting", "running", "slab_occupancy",
    "invalidations_attention", "invalidations_checkpoint",
    *(f"{what}_{k}_bytes" for what in ("mem", "waste") for k in ("attention", "ssm", "conv")),
)


def measured_steps(run: EngineRun, start: float):
    """Step rows that start at or after ``start`` (all rows if ``start`` is NaN),
    as a list of row dicts or, for a `StepTable`, a `StepTable` (the table
    itself if every row is measured, else a new one of `SUMMARY_STEP_COLUMNS`)."""
    if isinstance(run.steps, StepTable):
        if math.isnan(start):
            return run.steps
        keep = _row_times(run.steps) >= start
        return run.steps if keep.all() else run.steps.select(keep, SUMMARY_STEP_COLUMNS)
    if math.isnan(start):
        return list(run.steps)
    return [row for row, t in zip(run.steps, _row_times(run.steps), strict=True) if t >= start]


def _column(rows, name: str) -> np.ndarray:
    """The values of column ``name`` that are not None, as float64."""
    values, have = _floats(rows, name)
    return values if have is None else values[have]


def _has_column(rows, name: str) -> bool:
    return len(rows) > 0 and _floats(rows, name)[1] is None


def _row_sums(rows, names: list[str]) -> np.ndarray:
    """Per row, the sum of columns ``names`` as floats, added in that order."""
    total = _column(rows, names[0]).copy()
    for n in names[1:]:
        total += _column(rows, n)
    return total


def _time_median(rows, name: str) -> float:
    """Time-weighted median of a queue column over the measured rows.

    Each row weighs its ``duration_s``; an idle gap between one row's end and
    the next row's start (the engine had nothing to do, so nothing waited or
    ran) counts as a zero for its length, as a gauge sampled then would read.
    Rows without durations (a scraped gauge) weigh the same.
    """
    values, have = _floats(rows, name)
    if have is not None:
        values = values[have]
    if not values.size:
        return NAN

    def kept(column: str) -> np.ndarray | None:
        """``column`` at the rows that have a ``name`` value; None if one lacks it."""
        col, col_have = _floats(rows, column)
        if have is not None:
            col = col[have]
            col_have = None if col_have is None else col_have[have]
        return col if col_have is None or col_have.all() else None

    durations = kept("duration_s")
    if durations is None:
        return _median(values)
    starts = kept("start_s")
    if starts is not None and starts.size > 1:
        gaps = starts[1:] - starts[:-1] - durations[:-1]
        idle = gaps > 1e-12
        values = np.concatenate([values, np.zeros(int(idle.sum()))])
        durations = np.concatenate([durations, gaps[idle]])
    return weighted_median(values, durations)


def _memory_peaks(rows: list[dict], run: EngineRun, weights_bytes: int) -> dict:
    """Peak memory of the measured rows: the largest per-row total, and per-kind
    peaks. Engines without per-kind byte columns report per-kind peaks over the
    whole run (`EngineRun.peak_memory`); their total is known only when one kind
    is reported (per-kind peaks of different moments are never added)."""
    kinds = [k for k in ("attention", "ssm", "conv") if _has_column(rows, f"mem_{k}_bytes")]
    if kinds:
        per_kind = {k: float(np.max(_column(rows, f"mem_{k}_bytes"))) for k in kinds}
        total = float(np.max(_row_sums(rows, [f"mem_{k}_bytes" for k in kinds])))
    else:
        per_kind = dict(run.peak_memory)
        total = sum(per_kind.values()) if len(per_kind) == 1 else NAN
        # a kind the engine does not report is unknown (null), not zero bytes
        per_kind = {k: per_kind.get(k, NAN) for k in ("attention", "ssm", "conv")}
    # a kind without a column of its own is not observed (vLLM in process counts
    # a Mamba block, conv state included, as "ssm"): null, not zero bytes
    out = {f"peak_mem_{k}_bytes": _int_or_nan(float(per_kind.get(k, NAN)))
           for k in ("attention", "ssm", "conv")}
    out = {"peak_mem_total_bytes": _int_or_nan(total + weights_bytes), **out}
    return out


def _int_or_nan(x: float):
    return NAN if math.isnan(x) else int(x)


def is_served(run: EngineRun) -> bool:
    """A run a real server served (its `engine_info` says whether hbench
    ``launched`` it): the client sees requests and the server's gauges, not
    the server's per-request state."""
    return "launched" in run.engine_info


def _preemptions(per_request, run: EngineRun):
    """Preemptions of the measured requests. A served engine's client cannot see
    a preemption (its records say None: ``per_request`` is NaN), so for a
    served run (``engine_info`` has ``launched``) the server's own counter over
    the run is taken instead (``counters["preemptions"]``, e.g. vLLM's
    ``vllm:num_preemptions``, last minus first scrape, warm-up included);
    without one, not observed (NaN)."""
    counted = run.counters.get("preemptions")
    unseen = isinstance(per_request, float) and math.isnan(per_request)
    if is_served(run) and counted is not None and (unseen or not per_request):
        return int(counted)
    return per_request


def _rounding_waste(rows: list[dict], counters: dict):
    """Budget rounding loss plus the largest per-row total page waste (measured
    rows); without waste columns, the engine's counter (summed if per part)."""
    counter = counters.get("rounding_waste_bytes")
    kinds = [k for k in ("attention", "ssm", "conv") if _has_column(rows, f"waste_{k}_bytes")]
    if kinds:
        budget = counter.get("budget", 0) if isinstance(counter, dict) else 0
        return int(budget + float(np.max(_row_sums(rows, [f"waste_{k}_bytes" for k in kinds]))))
    if counter is None:
        return NAN
    return int(sum(counter.values()) if isinstance(counter, dict) else counter)


def _invalidations(rows: list[dict], run: EngineRun) -> dict:
    """Invalidations in the measured period: the run's final count minus the
    cumulative count before the first measured row, per kind; tokens from the
    attention blocks x the engine's ``attn_block_tokens``. NaN where the engine
    does not count them."""
    out = {}
    first = rows[0] if len(rows) else {}   # read once: a spilled table reads its chunk from disk
    for kind in ("attention", "checkpoint"):
        name = f"invalidations_{kind}"
        final = run.counters.get(name)
        if final is None:
            out[name] = NAN
            continue
        before = first.get(name, 0)
        if not len(rows) and len(run.steps):      # no step in the measured period: nothing counted there
            before = final
        out[name] = int(final - before)
    block = run.engine_info.get("attn_block_tokens")
    attn = out["invalidations_attention"]
    out["invalidated_tokens"] = (NAN if block is None or math.isnan(attn)
                                 else int(attn * block))
    return out


def summarize(run: EngineRun, *, weights_bytes: int = 0, config=None,
              tables: tuple[dict, dict] | None = None) -> dict:
    """The flat summary of one run, with exactly the keys in `SUMMARY_KEYS`.

    ``weights_bytes`` is added to the peak state memory to give
    ``peak_mem_total_bytes`` (engines report state memory only). ``config``
    (the run's `RunConfig`) gives the nominal load the ``validity`` verdict
    (`harness.validity`, the one nested object) checks the delivered load
    against; without it the rate checks are "n/a". ``tables``: the run's
    (`request_columns`, `attribution_steps`) when the caller has made them
    already, either None where not (`harness.results.write_run` gives the
    first, whose table it writes; the second is made last, when the summary's
    other step columns are no longer held, and let go); read, never changed.
    """
    m = (_ColumnsMeasured(run) if isinstance(run.requests, RequestColumns)
         else _RecordsMeasured(run))
    start = measured_start(run)
    rows = measured_steps(run, start)

    output_tokens = m.output_tokens
    ledger_start = run.window_start_s if math.isnan(start) else max(run.window_start_s, start)
    ledger = run.window_end_s - ledger_start
    span = (m.last_completion - start) if m.last_completion is not None else NAN

    ttfts, e2es, tpots = m.ttfts, m.e2es, m.tpots
    itl_percentiles = m.itl_percentiles
    lags = m.lags

    counters = run.counters
    served = is_served(run)
    occupancy = _column(rows, "slab_occupancy")
    occupancy = occupancy[~np.isnan(occupancy)]
    if occupancy.size or has_step_key(run.steps, "slab_occupancy"):
        slab = _mean(occupancy)
    else:
        slab = float(counters.get("slab_occupancy_mean", NAN))

    summary = {
        "throughput_ledger_tok_s": _ratio(output_tokens, ledger),
        "throughput_span_tok_s": _ratio(output_tokens, span),
        "output_tokens": output_tokens,
    }
    for name, sample in (("ttft", ttfts), ("itl", None), ("tpot", tpots), ("e2e", e2es)):
        values = itl_percentiles if sample is None else [percentile(sample, q) for q in (50, 90, 99)]
        for q, value in zip((50, 90, 99), values, strict=True):
            summary[f"{name}_p{q}_s"] = value
    summary.update(_memory_peaks(rows, run, weights_bytes))
    summary.update({
        "waiting_median": _time_median(rows, "waiting"),
        "running_median": _time_median(rows, "running"),
        "preemptions": _preemptions(m.preemptions, run),
    })
    summary.update(_invalidations(rows, run))
    summary.update({
        "slab_occupancy_mean": slab,
        "rounding_waste_bytes": _rounding_waste(rows, counters),
        "initial_input_tokens": m.initial_input_tokens,
        "reused_tokens": m.reused_tokens,
        "recomputed_tokens": m.recomputed_tokens,
        # a served engine's client sees the reuse it got (J_adopt), not the
        # deepest checkpoint or attention depth the server held: its records
        # say None, and these are null (not observed)
        "j_adopt_mean": _observed_mean(m.field("j_adopt")),
        "r_max_mean": _observed_mean(m.field("r_max")),
        "attn_depth_mean": _observed_mean(m.field("attn_depth")),
        "finished": m.finished_count,
        "failed": m.failed,
        "cancelled": m.cancelled,
        "requests": m.count,
        "dispatch_lag_p99_s": percentile(lags, 99),
    })
    summary.update(_validity(run, m, rows, lags, summary, config))
    summary.update(_attribution(run, tables))
    assert tuple(summary) == SUMMARY_KEYS, "summary keys drifted from SUMMARY_KEYS"
    if served:
        summary.update(served_summary(run, m.finished))
    if m.any_turn:
        summary.update(turn_summary(run))
    summary.update({k: counters[k] for k in REGION_SUMMARY_KEYS if k in counters})
    summary.update({k: counters[k] for k in POLICY_SUMMARY_KEYS if k in counters})
    summary.update({k: counters[k] for k in SGLANG_SUMMARY_KEYS if k in counters})
    summary.update({k: counters[k] for k in VLLM_INPROCESS_SUMMARY_KEYS if k in counters})
    return summary


class _RecordsMeasured:
    """What `summarize` reads of a run's records: the measured (non-warm-up)
    requests and the finished ones among them."""

    def __init__(self, run: EngineRun):
        measured = [r for r in run.requests if not r.warmup]
        finished = [r for r in measured if r.status == FINISHED]
        self.measured, self.finished = measured, finished
        self.output_tokens = int(sum(r.output_tokens for r in finished))
        completions = [r.finish_s for r in finished if r.finish_s is not None]
        self.last_completion = max(completions) if completions else None
        self.ttfts = [ttft(r) for r in finished if r.first_token_s is not None]
        self.e2es = [e2e(r) for r in finished if r.finish_s is not None]
        self.tpots = [t for t in (tpot(r) for r in finished) if not math.isnan(t)]
        self.itl_percentiles = _itl_percentiles(run, finished)
        self.lags = [_diff(r.dispatch_s, r.arrival_s) for r in measured if r.dispatch_s is not None]
        # NaN where no measured request observed the counter (a served engine)
        for f in ("preemptions", "initial_input_tokens", "reused_tokens", "recomputed_tokens"):
            setattr(self, f, _observed_sum([getattr(r, f) for r in measured]))
        self.finished_count = len(finished)
        self.failed = sum(r.status == FAILED for r in measured)
        self.cancelled = sum(r.status == CANCELLED for r in measured)
        self.count = len(measured)
        self.arrivals = [r.arrival_s for r in measured]
        # a multi-turn run's open-loop process is its session starts (first
        # turns); later turns are closed-loop (harness.validity)
        self.starts = [r.arrival_s for r in measured if r.turn <= 0]
        self.later_turns = len([r for r in measured if r.turn >= 1])
        self.any_turn = any(r.turn >= 0 for r in run.requests)

    def field(self, name: str) -> list:
        return [getattr(r, name) for r in self.measured]


class _ColumnsMeasured:
    """`_RecordsMeasured` from a `RequestColumns`' arrays: the same values
    (the same float operations, element by element), no record made."""

    def __init__(self, run: EngineRun):
        cols = run.requests
        self._cols = cols
        self.mask = measured = ~cols.array("warmup")
        status = cols.array("status")
        fin = measured & (status == STATUSES.index(FINISHED))
        arrival, first, finish = (cols.array(f) for f in ("arrival_s", "first_token_s",
                                                          "finish_s"))
        out = cols.array("output_tokens")
        self.output_tokens = int(out[fin].sum())
        completions = finish[fin & ~np.isnan(finish)]
        self.last_completion = float(completions.max()) if completions.size else None
        has_first = fin & ~np.isnan(first)
        self.ttfts = first[has_first] - arrival[has_first]
        has_finish = fin & ~np.isnan(finish)
        self.e2es = finish[has_finish] - arrival[has_finish]
        two = fin & (out >= 2)
        tpots = (finish[two] - first[two]) / (out[two] - 1)
        self.tpots = tpots[~np.isnan(tpots)]
        self.itl_percentiles = _itl_percentiles_of(run.itl_pool, [])
        dispatch = cols.array("dispatch_s")
        sent = measured & ~np.isnan(dispatch)
        self.lags = (dispatch[sent] - arrival[sent]).tolist()
        # float64 columns, NaN where a request did not observe the counter
        for f in ("preemptions", "initial_input_tokens", "reused_tokens", "recomputed_tokens"):
            setattr(self, f, _observed_sum(cols.array(f)[measured]))
        self.finished_count = int(fin.sum())
        self.failed = int((measured & (status == STATUSES.index(FAILED))).sum())
        self.cancelled = int((measured & (status == STATUSES.index(CANCELLED))).sum())
        self.count = int(measured.sum())
        turn = cols.array("turn")
        self.arrivals = arrival[measured].tolist()
        self.starts = arrival[measured & (turn <= 0)].tolist()
        self.later_turns = int((measured & (turn >= 1)).sum())
        self.any_turn = bool((turn >= 0).any())
        self.finished = None      # a served run's records are never columns

    def field(self, name: str) -> np.ndarray:
        return self._cols.array(name)[self.mask]


def _itl_percentiles(run: EngineRun, finished: list[RequestRecord]) -> tuple[float, ...]:
    """ITL p50 / p90 / p99 over every gap of the finished measured requests:
    those still holding their token times and, where the engine dropped them
    as requests finished, the run's ``itl_pool``."""
    gaps = [inter_token_gaps(r) for r in finished if r.itl is None]
    if run.itl_pool is None:
        assert all(r.itl is None for r in finished), "dropped token times need the run's itl_pool"
        return tuple(percentile(np.concatenate(gaps) if gaps else np.empty(0), q)
                     for q in (50, 90, 99))
    return _itl_percentiles_of(run.itl_pool, gaps)


def _itl_percentiles_of(pool, gaps: list[np.ndarray]) -> tuple[float, ...]:
    """ITL p50 / p90 / p99 over the gaps in ``pool`` and ``gaps``."""
    values, counts = pool.counted()
    if gaps:
        held = np.concatenate(gaps)
        values = np.concatenate([values, held])
        counts = np.concatenate([counts, np.ones(held.size, dtype=np.int64)])
    return counted_percentiles(values, counts, (50, 90, 99))


def served_summary(run: EngineRun, finished: list[RequestRecord]) -> dict:
    """`SERVED_SUMMARY_KEYS` of a served run: TTFT from the send over finished
    measured requests, and what the engine reported in ``run.counters``."""
    sends = [_diff(r.first_token_s, r.dispatch_s) for r in finished
             if r.first_token_s is not None and r.dispatch_s is not None]
    p50, p99 = percentiles(sends, (50, 99))
    out = {"ttft_send_p50_s": p50, "ttft_send_p99_s": p99}
    for key in SERVED_SUMMARY_KEYS[2:]:
        value = run.counters.get(key)
        out[key] = NAN if value is None else value
    return out


def _grid(run: EngineRun) -> int:
    return int(run.engine_info.get("grid_tokens") or 1)


def turn_history(run: EngineRun) -> dict[int, tuple[int, int | None, float]]:
    """Per multi-turn request id: (history tokens, history tokens recomputed,
    survived) where history is what the previous turn left reusable (its
    prompt plus its output), recomputed = history minus the reused tokens (at
    least 0), and survived is 1.0 if the request reused at least the previous
    turn's deepest grid point inside its prompt (the state that turn's prefill
    left in the cache outlived the think time), 0.0 if not, NaN for first
    turns and turns whose previous prompt is shorter than one grid interval.
    A request whose reuse was not observed (None) has recomputed None and
    survived NaN."""
    grid = _grid(run)
    by_turn = {(r.session, r.turn): r for r in run.requests if r.turn >= 0}
    out = {}
    for (s, k), r in by_turn.items():
        prev = by_turn.get((s, k - 1))
        if prev is None:
            out[r.request_id] = (0, 0, NAN)
            continue
        history = prev.prompt_tokens + prev.output_tokens
        if r.reused_tokens is None:
            out[r.request_id] = (history, None, NAN)
            continue
        best = prev.prompt_tokens // grid * grid
        survived = NAN if best == 0 else float(r.reused_tokens >= best)
        out[r.request_id] = (history, max(0, history - r.reused_tokens), survived)
    return out


def turn_summary(run: EngineRun) -> dict:
    """`TURN_SUMMARY_KEYS` of a multi-turn run, over measured requests (later
    turns only for the history keys; TTFTs over finished requests). The
    reuse keys count the later turns whose reuse was observed, and are null
    (not observed) when none was."""
    from harness.validity import delivered_rate

    hist = turn_history(run)
    measured = [r for r in run.requests if not r.warmup and r.turn >= 0]
    later = [r for r in measured if r.turn >= 1]
    history = sum(hist[r.request_id][0] for r in later)
    seen = [r for r in later if r.reused_tokens is not None]
    reused = sum(min(r.reused_tokens, hist[r.request_id][0]) for r in seen) if seen else NAN
    seen_history = sum(hist[r.request_id][0] for r in seen)
    survived = [hist[r.request_id][2] for r in later if not math.isnan(hist[r.request_id][2])]
    ttfts = {k: [ttft(r) for r in measured if r.status == FINISHED
                 and r.first_token_s is not None and (r.turn == 0) == (k == 0)] for k in (0, 1)}
    return {
        "sessions": len({r.session for r in measured}),
        "later_turns": len(later),
        "turn0_ttft_p50_s": percentile(ttfts[0], 50),
        "later_turn_ttft_p50_s": percentile(ttfts[1], 50),
        "history_tokens": int(history),
        "history_reused_tokens": reused if math.isnan(reused) else int(reused),
        "history_reuse_fraction": _ratio(reused, seen_history),
        "history_recomputed_tokens": _observed_sum([hist[r.request_id][1] for r in later]),
        "history_survived_fraction": _mean(survived),
        # sessions/s: the open-loop load a multi-turn run was offered (arm parity)
        "delivered_session_rate": delivered_rate([r.arrival_s for r in measured if r.turn == 0]),
    }


def turn_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per turn index (measured, finished requests of a multi-turn run's
    per-request table as read back): requests, TTFT p50 / mean, mean reused
    and history tokens, reuse fraction (reused / history) and survived
    fraction. An analysis of a table, so pandas is imported here: a run does
    not call it."""
    import pandas as pd

    df = requests[(~requests["warmup"]) & (requests["turn"] >= 0)
                  & (requests["status"] == FINISHED)]
    rows = []
    for k, g in df.groupby("turn", sort=True):
        hist = g["history_tokens"].sum()
        rows.append({
            "turn": int(k), "requests": len(g),
            "ttft_p50_s": percentile(g["ttft_s"].dropna().to_numpy(), 50),
            "ttft_mean_s": float(g["ttft_s"].mean()),
            "reused_tokens_mean": float(g["reused_tokens"].mean()),
            "history_tokens_mean": float(g["history_tokens"].mean()),
            "reuse_fraction": _ratio(float(np.minimum(g["reused_tokens"], g["history_tokens"])
                                           .sum()), float(hist)) if hist else NAN,
            "survived_fraction": float(g["history_survived"].mean()),
        })
    return pd.DataFrame(rows)


def attribution_steps(run: EngineRun) -> dict:
    """The step columns the TTFT attribution reads (`harness.attribution.STEP_COLUMNS`)
    that the rows have, as name: values (an array, or a list of strings)."""
    from harness.attribution import STEP_COLUMNS

    steps = run.steps
    return {name: steps.array(name) if isinstance(steps, StepTable) else step_values(steps, name)
            for name in STEP_COLUMNS if has_step_key(steps, name)}


def _attribution(run: EngineRun, tables=None) -> dict:
    """TTFT p50 / p99 broken down by cause (`harness.attribution`); NaN for
    engines whose step table records no scheduler reasons."""
    from harness.attribution import attribute, breakdown

    requests, steps = tables or (None, None)
    requests = request_columns(run) if requests is None else requests
    steps = attribution_steps(run) if steps is None else steps
    return breakdown(attribute(requests, steps))


def _validity(run: EngineRun, m, rows, lags, summary: dict, config) -> dict:
    from harness.validity import delivered_rate, run_validity

    info = run.engine_info or {}
    return {
        "delivered_rate_req_s": delivered_rate(m.arrivals),
        "validity": run_validity(
            arrivals=m.starts, nominal_rate=getattr(config, "rate", None),
            process=getattr(config, "arrival", None), failed=summary["failed"],
            cancelled=summary["cancelled"], dispatch_lags=lags,
            cache_state=info.get("cache_state"), warmup=info.get("warmup_requests"),
            step_times=_row_times(rows), step_waiting=_column(rows, "waiting"),
            stream=((summary["itl_p50_s"], summary["tpot_p50_s"]) if is_served(run) else None),
            later_turns=m.later_turns if m.any_turn else None),
    }


def _itl_stats(r: RequestRecord) -> tuple[float, float, float, float]:
    """A request's inter-token gaps: mean, p50, p99 and max (NaN without gaps)."""
    return (r.itl or token_time_stats(r.token_times))[1:]


def _opt(value: float | None) -> float:
    return NAN if value is None else value


#: How each column of `per_request_table` comes from a record (the ITL columns
#: from `_itl_stats`), in `REQUEST_COLUMNS` order.
_REQUEST_VALUES = {
    "request_id": lambda r: r.request_id,
    "arrival_s": lambda r: r.arrival_s,
    "dispatch_s": lambda r: _opt(r.dispatch_s),
    "first_token_s": lambda r: _opt(r.first_token_s),
    "finish_s": lambda r: _opt(r.finish_s),
    "prompt_tokens": lambda r: r.prompt_tokens,
    "target_output_tokens": lambda r: r.target_output_tokens,
    "output_tokens": lambda r: r.output_tokens,
    "reused_tokens": lambda r: r.reused_tokens,
    "initial_input_tokens": lambda r: r.initial_input_tokens,
    "recomputed_tokens": lambda r: r.recomputed_tokens,
    "preemptions": lambda r: r.preemptions,
    "j_adopt": lambda r: r.j_adopt,
    "r_max": lambda r: r.r_max,
    "attn_depth": lambda r: r.attn_depth,
    "prefix_group": lambda r: r.prefix_group,
    "status": lambda r: r.status,
    "error": lambda r: r.error,
    "warmup": lambda r: r.warmup,
    "ttft_s": ttft,
    "e2e_s": e2e,
    "tpot_s": tpot,
    "n_token_times": lambda r: len(r.token_times) if r.itl is None else r.itl[0],
}
_ITL_COLUMNS = ("itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
assert set(_REQUEST_VALUES) | set(_ITL_COLUMNS) == set(REQUEST_COLUMNS)


def _request_column(requests, name: str, dtype: str):
    """Column ``name`` of the per-request table: an array of ``dtype`` built
    from the records (a list for object columns, float64 with NaN for None
    for `NULLABLE_INT` ones), no row dict per request."""
    get = _REQUEST_VALUES[name]
    if dtype == "object":
        return [get(r) for r in requests]
    if dtype == NULLABLE_INT:
        return np.fromiter((_opt(get(r)) for r in requests), dtype=np.float64,
                           count=len(requests))
    return np.fromiter((get(r) for r in requests), dtype=dtype, count=len(requests))


def request_columns(run: EngineRun) -> dict[str, np.ndarray | list]:
    """The columns of `per_request_table`, in order: NumPy arrays of their
    `REQUEST_COLUMNS` dtypes (and a multi-turn run's `TURN_COLUMNS`), a text
    column as a list of str. Missing times are NaN, and so are counters the
    engine did not observe (`NULLABLE_INT` columns are float64). Built column by column
    from the records (no row dict per request), or from a `RequestColumns`'
    arrays."""
    requests = run.requests
    if isinstance(requests, RequestColumns) and not (requests.array("turn") >= 0).any():
        return _columns_of(requests)
    columns = dict(REQUEST_COLUMNS)
    itl = np.array([_itl_stats(r) for r in requests], dtype=np.float64).reshape(-1, 4)
    data = {}
    for name, dtype in REQUEST_COLUMNS.items():
        if name in _ITL_COLUMNS:
            data[name] = itl[:, _ITL_COLUMNS.index(name)].copy()
        else:
            data[name] = _request_column(requests, name, dtype)
    if any(r.turn >= 0 for r in requests):
        columns.update(TURN_COLUMNS)
        hist = turn_history(run)
        h = [hist.get(r.request_id, (0, 0, NAN)) for r in requests]
        data.update(session=[r.session for r in requests], turn=[r.turn for r in requests],
                    history_tokens=[x[0] for x in h], history_recomputed_tokens=[x[1] for x in h],
                    history_survived=[x[2] for x in h])
    return _typed(data, columns)


def _typed(data: dict, dtypes: dict[str, str]) -> dict[str, np.ndarray | list]:
    """``data``'s columns in ``dtypes``' order, each an array of its dtype (a
    text column as it is; a `NULLABLE_INT` one float64, None as NaN)."""
    def typed(values, dtype: str):
        if dtype == "object":
            return values
        if dtype == NULLABLE_INT:
            if isinstance(values, list):
                values = [_opt(v) for v in values]
            return np.asarray(values, dtype=np.float64)
        return np.asarray(values, dtype=dtype)

    return {name: typed(data[name], dtype) for name, dtype in dtypes.items()}


def _columns_of(cols: RequestColumns) -> dict[str, np.ndarray | list]:
    """`request_columns` of a `RequestColumns` (no turns) from its arrays:
    the values the records give, element by element, and the same dtypes."""
    arrival, first, finish = (cols.array(f) for f in ("arrival_s", "first_token_s", "finish_s"))
    out = cols.array("output_tokens")
    with np.errstate(divide="ignore", invalid="ignore"):
        tpots = np.where(out >= 2, (finish - first) / (out - 1), NAN)
    derived = {"ttft_s": first - arrival, "e2e_s": finish - arrival, "tpot_s": tpots,
               "status": cols.statuses(), "error": cols.errors()}
    return _typed({name: derived[name] if name in derived else cols.array(name)
                   for name in REQUEST_COLUMNS}, REQUEST_COLUMNS)


def per_request_table(run: EngineRun, columns: dict | None = None) -> pa.Table:
    """One row per request (warm-up included, flagged by ``warmup``), as
    ``requests.parquet`` holds it: `request_columns` (``columns``, where the
    caller has made them) as an Arrow table, a missing time a null and a
    text column ``string`` (``null`` when no row has text), as pandas wrote
    the same columns. A counter the engine did not observe is a null of an
    int64 column (`NULLABLE_INT`; pandas reads the column back as float64
    with NaN). Built through `common.arrow_arrays`, so writing it loads no
    pandas.

    Token times are summarized (ITL mean/p50/p99/max, count), not stored:
    they would dominate the file.
    """
    from common.arrow_arrays import table

    columns = request_columns(run) if columns is None else columns
    nullable = [name for name, dtype in {**REQUEST_COLUMNS, **TURN_COLUMNS}.items()
                if dtype == NULLABLE_INT and name in columns]
    return table(columns, nan_is_null=True, nullable_ints=nullable)
