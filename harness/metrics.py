"""Run-level metrics from an `EngineRun`: pure functions, identical for every engine.

`summarize` turns one run into a flat dict of scalars (the ``summary.json`` of
a results directory), reading the run's one request table
(`harness.request_table.RequestTable`) and step table as arrays, whichever
engine filled them, so each metric has one implementation. Analysis code
reads these keys by name, so `SUMMARY_KEYS` (and the multi-turn, served,
region, SGLang and vLLM-in-process key sets) are the contract: adding or
renaming a key is a schema change. Which requests and steps each metric
counts is in docs/statistics.md, "What each summary metric counts".
"""

from __future__ import annotations

import math

import numpy as np

from harness.attribution import SUMMARY_KEYS as ATTRIBUTION_KEYS
from harness.per_request import request_columns, turn_history
from harness.records import CANCELLED, FAILED, FINISHED, STATUSES, EngineRun
from harness.request_table import RequestTable
from harness.step_table import StepTable, has_step_key, step_values
from harness.token_times import counted_percentiles, percentiles

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
    """``values`` (NaN where not observed) as float64, the observed ones only."""
    arr = np.asarray(values, dtype=float)
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


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 and math.isfinite(den) else NAN


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
    table = run.requests
    arrivals = table.array("arrival_s")[~table.array("warmup")]
    return float(arrivals.min()) if arrivals.size else NAN


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
    m = _Measured(run.requests)
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
        summary.update(served_summary(run, m))
    if m.any_turn:
        summary.update(turn_summary(run))
    summary.update({k: counters[k] for k in REGION_SUMMARY_KEYS if k in counters})
    summary.update({k: counters[k] for k in POLICY_SUMMARY_KEYS if k in counters})
    summary.update({k: counters[k] for k in SGLANG_SUMMARY_KEYS if k in counters})
    summary.update({k: counters[k] for k in VLLM_INPROCESS_SUMMARY_KEYS if k in counters})
    return summary


class _Measured:
    """What `summarize` reads of a run's request table: the measured
    (non-warm-up) requests (``mask``) and the finished ones among them
    (``finished``), as arrays."""

    def __init__(self, table: RequestTable):
        self._table = table
        self.mask = measured = ~table.array("warmup")
        status = table.array("status")
        self.finished = fin = measured & (status == STATUSES.index(FINISHED))
        arrival, first, finish = (table.array(f) for f in ("arrival_s", "first_token_s",
                                                           "finish_s"))
        out = table.array("output_tokens")
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
        # over every gap of the finished measured requests (the table's sample)
        self.itl_percentiles = counted_percentiles(*table.itl_gaps(), (50, 90, 99))
        dispatch = table.array("dispatch_s")
        sent = measured & ~np.isnan(dispatch)
        self.lags = (dispatch[sent] - arrival[sent]).tolist()
        # float64 columns, NaN where a request did not observe the counter;
        # the sum NaN where no measured request observed it (a served engine)
        for f in ("preemptions", "initial_input_tokens", "reused_tokens", "recomputed_tokens"):
            setattr(self, f, _observed_sum(table.array(f)[measured]))
        self.finished_count = int(fin.sum())
        self.failed = int((measured & (status == STATUSES.index(FAILED))).sum())
        self.cancelled = int((measured & (status == STATUSES.index(CANCELLED))).sum())
        self.count = int(measured.sum())
        turn = table.array("turn")
        self.arrivals = arrival[measured].tolist()
        # a multi-turn run's open-loop process is its session starts (first
        # turns); later turns are closed-loop (harness.validity)
        self.starts = arrival[measured & (turn <= 0)].tolist()
        self.later_turns = int((measured & (turn >= 1)).sum())
        self.any_turn = table.has_turns()

    def field(self, name: str) -> np.ndarray:
        return self._table.array(name)[self.mask]


def served_summary(run: EngineRun, m: _Measured) -> dict:
    """`SERVED_SUMMARY_KEYS` of a served run: TTFT from the send over finished
    measured requests, and what the engine reported in ``run.counters``."""
    table = run.requests
    first, dispatch = table.array("first_token_s"), table.array("dispatch_s")
    both = m.finished & ~np.isnan(first) & ~np.isnan(dispatch)
    p50, p99 = percentiles(first[both] - dispatch[both], (50, 99))
    out = {"ttft_send_p50_s": p50, "ttft_send_p99_s": p99}
    for key in SERVED_SUMMARY_KEYS[2:]:
        value = run.counters.get(key)
        out[key] = NAN if value is None else value
    return out


def turn_summary(run: EngineRun) -> dict:
    """`TURN_SUMMARY_KEYS` of a multi-turn run, over measured requests (later
    turns only for the history keys; TTFTs over finished requests). The
    reuse keys count the later turns whose reuse was observed, and are null
    (not observed) when none was."""
    from harness.validity import delivered_rate

    table = run.requests
    history, recomputed, survived = turn_history(run)
    turn, reused = table.array("turn"), table.array("reused_tokens")
    measured = ~table.array("warmup") & (turn >= 0)
    later = measured & (turn >= 1)
    seen = later & ~np.isnan(reused)
    reused_sum = int(np.minimum(reused[seen], history[seen]).sum()) if seen.any() else NAN
    survived = survived[later]
    arrival, first = table.array("arrival_s"), table.array("first_token_s")
    done = measured & (table.array("status") == STATUSES.index(FINISHED)) & ~np.isnan(first)

    def ttft_p50(rows: np.ndarray) -> float:
        return percentile(first[rows] - arrival[rows], 50)

    return {
        "sessions": len(set(table.array("session")[measured].tolist())),
        "later_turns": int(later.sum()),
        "turn0_ttft_p50_s": ttft_p50(done & (turn == 0)),
        "later_turn_ttft_p50_s": ttft_p50(done & (turn >= 1)),
        "history_tokens": int(history[later].sum()),
        "history_reused_tokens": reused_sum,
        "history_reuse_fraction": _ratio(reused_sum, int(history[seen].sum())),
        "history_recomputed_tokens": _observed_sum(recomputed[later]),
        "history_survived_fraction": _mean(survived[~np.isnan(survived)]),
        # sessions/s: the open-loop load a multi-turn run was offered (arm parity)
        "delivered_session_rate": delivered_rate(arrival[measured & (turn == 0)].tolist()),
    }


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
