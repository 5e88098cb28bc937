"""Is a run (a cell, a contrast) valid? Pure checks with one verdict each.

A run's numbers describe the configuration it claims only if the load it was
asked for was the load it got (``arrival_rate``, ``arrival_process``,
``dispatch_lag``), nothing failed, the server streamed token by token
(``stream``) and it measured a steady state (``overload``). One verdict
cannot serve every metric, since a growing queue spoils latencies but is the
point of a throughput comparison, so each metric has a kind (`metric_kind`)
and each check spoils only the kinds it invalidates (`SPOILS`);
`metric_verdicts` writes each kind's verdict to summary.json. A verdict is
``pass``, ``warn``, ``fail`` or ``n/a``; a run is valid when no check fails.
`arm_parity` adds a contrast's arms' parity (same workload hash and engine
version, delivered rates within 1 %). Each check's tolerance and why: docs/statistics.md, "Which runs a contrast
may test".
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from common.cache import entry_file, read_entry, write_entry

PASS, WARN, FAIL, NA = "pass", "warn", "fail", "n/a"
#: Largest acceptable client dispatch lag p99 (assumed: one decode step of a
#: 7B model is ~20 ms; a client lagging 10 ms no longer offers the nominal load).
DISPATCH_LAG_BOUND_S = 0.010
RATE_TOLERANCE = 0.05
#: Fewest measured requests a valid run has: the rate check's tolerance
#: 3 / sqrt(n - 1) is under 100 % only from n = 11 on.
MIN_MEASURED_REQUESTS = 11
#: Coarsest time resolution (float64 spacing at the largest arrival time) at
#: which latencies are still measured: 1 us, reached at about 4.5e9 s.
TIME_RESOLUTION_S = 1e-6
KS_ALPHA = 0.001
#: Smallest ITL median, as a share of the TPOT median, of a stream whose
#: tokens arrive one by one (a steady stream has ITL p50 close to TPOT p50).
BURST_RATIO = 0.2
PARITY_RATE_TOLERANCE = 0.01


def _check(status: str, detail: str) -> dict:
    return {"status": status, "detail": detail}


def delivered_rate(arrivals: Sequence[float]) -> float:
    """(n - 1) / (last - first) of the arrival times; NaN for fewer than two."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    if a.size < 2 or a[-1] <= a[0]:
        return math.nan
    return (a.size - 1) / float(a[-1] - a[0])


def degenerate_arrivals(arrivals: Sequence[float]) -> str | None:
    """Why ``arrivals`` cannot measure a load (see the module docstring), or None."""
    a = np.asarray(arrivals, dtype=float)
    if a.size < MIN_MEASURED_REQUESTS:
        return (f"{a.size} measured requests, fewer than the {MIN_MEASURED_REQUESTS} a run needs "
                "for its load to be measured")
    return _unmeasurable_window(a)


def _unmeasurable_window(a: np.ndarray) -> str | None:
    """Why the window of two or more arrivals ``a`` is not measurable, or None."""
    span = float(a.max() - a.min())
    if not span > 0:
        return (f"every measured arrival at t = {float(a.min()):g} s: no arrival span, the "
                "delivered rate cannot be computed")
    resolution = float(np.spacing(float(np.abs(a).max())))
    if resolution > TIME_RESOLUTION_S:
        return (f"arrival times reach {float(np.abs(a).max()):.3g} s, where float64 resolves "
                f"only {resolution:.3g} s (limit {TIME_RESOLUTION_S:g} s): latencies and the "
                "delivered rate cannot be measured")
    return None


def check_rate(arrivals: Sequence[float], nominal: float | None, unit: str = "req/s") -> dict:
    degenerate = degenerate_arrivals(arrivals)
    if degenerate:
        return _check(FAIL, degenerate)
    rate = delivered_rate(arrivals)
    if nominal is None or math.isnan(rate):
        return _check(NA, "fewer than two measured arrivals or no nominal rate")
    n = len(arrivals)
    tol = max(RATE_TOLERANCE, 3 / math.sqrt(n - 1))
    dev = rate / nominal - 1
    status = PASS if abs(dev) <= tol else FAIL
    return _check(status, f"delivered {rate:.3f} {unit} vs nominal {nominal:g} ({dev:+.1%}, "
                          f"tolerance {tol:.1%})")


def check_process(arrivals: Sequence[float], process: str | None, nominal: float | None) -> dict:
    a = np.sort(np.asarray(arrivals, dtype=float))
    if a.size < 3 or nominal is None:
        return _check(NA, "fewer than three measured arrivals")
    gaps = np.diff(a)
    if process == "poisson":
        p = ks_exponential_pvalue(gaps, nominal)
        status = PASS if p >= KS_ALPHA else FAIL
        return _check(status, f"KS test of {gaps.size} inter-arrival times vs exponential at "
                              f"{nominal:g}/s: p = {p:.3g}")
    if process == "constant":
        worst = float(np.max(np.abs(gaps - 1 / nominal)))
        status = PASS if worst <= 1e-6 * max(1.0, 1 / nominal) else FAIL
        return _check(status, f"largest deviation of a gap from 1/rate: {worst:.3g} s")
    return _check(NA, f"no test for {process or 'unknown'} arrivals")


#: Bumped when the layout of a remembered KS p-value (`ks_exponential_pvalue`) changes.
_KS_CACHE_FORMAT = 2
_KS_CACHE_KIND = "ks-expon"
_KS_MEMO: dict[str, float] = {}
_KS_MEMO_LIMIT = 256


def _scipy_build() -> bytes | None:
    """The bytes of the installed scipy's ``version.py`` (its version and git
    revision), found without importing scipy; None where it cannot be read."""
    try:
        spec = importlib.util.find_spec("scipy")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        return (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_bytes()
    except OSError:
        return None


def _ks_key(gaps: np.ndarray, nominal: float) -> str | None:
    """What the KS p-value of ``gaps`` at ``nominal`` depends on, hashed: the
    gaps' float64 bytes, the rate, and the scipy and numpy builds that compute it."""
    build = _scipy_build()
    if build is None:
        return None
    h = hashlib.sha256(f"ks-expon|{_KS_CACHE_FORMAT}|numpy {np.__version__}|".encode())
    h.update(build)
    h.update(f"|{float(nominal)!r}|".encode())
    h.update(np.ascontiguousarray(gaps, dtype="<f8").tobytes())
    return h.hexdigest()


def _ks_file(key: str) -> Path:
    return entry_file(_KS_CACHE_KIND, key)


def _ks_cached(key: str) -> float | None:
    def is_pvalue(entry: dict) -> bool:
        p = entry.get("pvalue")
        return entry.get("key") == key and isinstance(p, float) and 0.0 <= p <= 1.0

    entry = read_entry(_KS_CACHE_KIND, key, _KS_CACHE_FORMAT, is_pvalue)
    return None if entry is None else entry["pvalue"]


def ks_exponential_pvalue(gaps: np.ndarray, nominal: float) -> float:
    """The p-value of scipy's one-sample KS test of ``gaps`` against the
    exponential law at rate ``nominal`` (``scipy.stats.kstest(gaps, "expon",
    args=(0, 1 / nominal))``).

    Importing scipy.stats costs about half a second, far more than a
    study-sized simulated run, and the runs of one workload (every
    organization, budget and headroom of a sweep) test the same arrivals. So
    the value scipy returned is remembered, in this process and under
    `common.cache.cache_dir`, keyed by a hash of everything it depends on:
    the gaps' bytes, the rate and the installed scipy and numpy builds. The
    same inputs give scipy's same value, bit for bit; a missing, torn or
    unwritable cache entry only costs the import and the test."""
    gaps = np.asarray(gaps, dtype=float)
    key = _ks_key(gaps, nominal)
    if key is not None:
        p = _KS_MEMO.get(key)
        if p is None:
            p = _ks_cached(key)
        if p is not None:
            _remember(key, p)
            return p
    from scipy import stats as sps  # here, not at the top: scipy.stats takes ~0.5 s to import

    p = float(sps.kstest(gaps, "expon", args=(0, 1 / nominal)).pvalue)
    if key is not None:
        _remember(key, p)
        write_entry(_KS_CACHE_KIND, key, _KS_CACHE_FORMAT, {"key": key, "pvalue": p})
    return p


def ks_remembered(arrivals: Sequence[float], nominal: float) -> bool:
    """Whether `check_process` of Poisson ``arrivals`` at ``nominal`` finds its
    p-value remembered (or needs none), so that it imports no scipy."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    if a.size < 3:
        return True
    key = _ks_key(np.diff(a), nominal)
    return key is not None and (key in _KS_MEMO or _ks_cached(key) is not None)


def _remember(key: str, p: float) -> None:
    if len(_KS_MEMO) >= _KS_MEMO_LIMIT:
        _KS_MEMO.clear()
    _KS_MEMO[key] = p


def check_dispatch(lags: Sequence[float]) -> dict:
    lags = [x for x in lags if x is not None and not math.isnan(x)]
    if not lags:
        return _check(NA, "requests are not dispatched by a client")
    p99 = float(np.percentile(lags, 99))
    status = PASS if p99 <= DISPATCH_LAG_BOUND_S else FAIL
    return _check(status, f"dispatch lag p99 {p99 * 1e3:.2f} ms (bound "
                          f"{DISPATCH_LAG_BOUND_S * 1e3:g} ms)")


def check_failures(failed: int, cancelled: int) -> dict:
    status = PASS if failed == 0 and cancelled == 0 else FAIL
    return _check(status, f"{failed} failed, {cancelled} cancelled")


def check_cache(cache_state: str | None, warmup: int | None) -> dict:
    if cache_state in ("cold", "warm"):
        return _check(PASS, f"{cache_state} cache at start, {warmup or 0} warm-up requests excluded")
    return _check(WARN, f"cache state at start unknown ({warmup or 0} warm-up requests)")


def queue_growth(times: Sequence[float], waiting: Sequence[float], start: float, end: float) -> float:
    """Fitted increase of the waiting queue over [mid, end], mid the middle of
    [start, end], from a least-squares line through the samples in that half;
    NaN when fewer than three samples fall there."""
    t = np.asarray(times, dtype=float)
    w = np.asarray(waiting, dtype=float)
    mid = (start + end) / 2
    sel = (t >= mid) & (t <= end)
    if sel.sum() < 3 or np.ptp(t[sel]) == 0:
        return math.nan
    slope = np.polyfit(t[sel], w[sel], 1)[0]
    return float(slope * (end - mid))


def check_overload(times, waiting, arrivals: Sequence[float]) -> dict:
    a = np.asarray(arrivals, dtype=float)
    if a.size < 2:
        return _check(NA, "fewer than two measured arrivals")
    if _unmeasurable_window(a):
        return _check(NA, "no measurable arrival window (see arrival_rate)")
    growth = queue_growth(times, waiting, float(a.min()), float(a.max()))
    if math.isnan(growth):
        return _check(NA, "too few queue samples in the second half of the arrivals")
    limit = max(2.0, 0.05 * a.size)
    status = PASS if growth < limit else FAIL
    words = "still growing: a transient, not a steady state" if status == FAIL else "steady"
    return _check(status, f"waiting queue {growth:+.1f} over the second half of the arrivals "
                          f"(limit {limit:g}): {words}")


def check_stream(itl_p50_s: float, tpot_p50_s: float) -> dict:
    """Fail a stream whose inter-token gaps are mostly far below its time per output token."""
    if not (math.isfinite(itl_p50_s) and math.isfinite(tpot_p50_s)) or tpot_p50_s <= 0:
        return _check(NA, "no inter-token gaps to compare")
    ratio = itl_p50_s / tpot_p50_s
    detail = (f"ITL p50 {itl_p50_s * 1e3:.3g} ms vs TPOT p50 {tpot_p50_s * 1e3:.3g} ms "
              f"({ratio:.0%})")
    if ratio < BURST_RATIO:
        return _check(FAIL, detail + f": tokens arrive in bursts (ITL p50 under {BURST_RATIO:.0%} "
                      "of TPOT); ITL does not measure the server's steps, read TPOT")
    return _check(PASS, detail)


def verdict(checks: Mapping[str, dict]) -> dict:
    """The validity object: every check, ``valid`` (no check failed), the
    failed checks' names in ``reasons`` and each metric kind's verdict in
    ``metrics`` (`metric_verdicts`)."""
    failed = [name for name, c in checks.items() if c["status"] == FAIL]
    out = {"valid": not failed, "reasons": failed, "checks": dict(checks)}
    out["metrics"] = metric_verdicts(out)
    return out


RATE, LEDGER, LATENCY, ITL = "rate", "ledger", "latency", "itl"
METRIC_KINDS = (RATE, LEDGER, LATENCY, ITL)
#: The metric kinds a failed check spoils (module docstring); a check not
#: named here (``cache_state``, which only warns; ``later_turns``, never
#: tested) spoils none.
SPOILS: dict[str, tuple[str, ...]] = {
    "arrival_rate": METRIC_KINDS, "arrival_process": METRIC_KINDS,
    "dispatch_lag": METRIC_KINDS, "failures": METRIC_KINDS,
    "overload": (LATENCY, ITL), "stream": (ITL,),
}
#: What each kind measures, by the run's regime: a growing queue (the
#: ``overload`` check failed) or a steady state.
_MEASURES = {
    RATE: ("the sustained service rate (the queue grew: throughput is what the organization "
           "serves)", "the delivered rate (steady state: throughput follows the offered load)"),
    LEDGER: ("the served-state ledger of this request stream", "the served-state ledger"),
    LATENCY: ("", "steady-state latency"),   # never valid under a growing queue
    ITL: ("", "steady-state latency"),
}
#: A failed check in a few words, for one-line reasons.
CHECK_WORDS = {
    "arrival_rate": "arrivals off the nominal rate", "arrival_process": "arrivals not the process asked for",
    "dispatch_lag": "the client dispatched late", "failures": "requests failed",
    "overload": "the waiting queue kept growing", "stream": "tokens streamed in bursts",
}
_KIND_WORDS = {RATE: "throughput", LEDGER: "work and cache counters", LATENCY: "latency",
               ITL: "inter-token latency"}


def kind_words(kind: str) -> str:
    """A metric kind as a reader says it ("throughput", "latency", ...)."""
    return _KIND_WORDS[kind]


def metric_kind(metric: str) -> str:
    """The kind of a summary metric (module docstring): ``itl`` for
    inter-token gaps, ``latency`` for TTFT, TPOT, end-to-end times, the
    waiting queue and goodput, ``rate`` for throughput and delivered rates,
    ``ledger`` for the rest."""
    words = set(metric.lower().split("_"))
    if "itl" in words:
        return ITL
    if words & {"ttft", "tpot", "e2e", "goodput", "latency", "slo"} or metric == "waiting_median":
        return LATENCY
    if metric.startswith(("throughput", "delivered_")):
        return RATE
    return LEDGER


def metric_verdicts(validity: Mapping | None) -> dict[str, dict]:
    """Each metric kind's verdict from a validity object's checks:
    ``{kind: {"valid", "reasons" (the checks that spoil it), "as" (what it
    measures in this run; "" where it is not valid)}}``. A run written before
    validity existed (None) is valid for every kind."""
    checks = validity.get("checks", {}) if isinstance(validity, Mapping) else {}
    failed = [n for n, c in checks.items() if isinstance(c, Mapping) and c.get("status") == FAIL]
    growing = "overload" in failed
    out = {}
    for kind in METRIC_KINDS:
        spoiled = spoiling_checks(failed, kind)
        out[kind] = {"valid": not spoiled, "reasons": spoiled,
                     "as": "" if spoiled else _MEASURES[kind][0 if growing else 1]}
    return out


def spoiling_checks(failed: Sequence[str], kind: str) -> list[str]:
    """Which of the ``failed`` checks spoil metrics of ``kind``."""
    return [n for n in failed if kind in SPOILS.get(n, ())]


def metric_is_valid(summary: Mapping, metric: str) -> bool:
    """Whether a run's ``metric`` is valid (its kind's verdict)."""
    return kind_is_valid(summary, metric_kind(metric))


def kind_is_valid(summary: Mapping, kind: str) -> bool:
    """Whether a run's metrics of ``kind`` are valid; runs written before
    validity existed count as valid."""
    return metric_verdicts(summary.get("validity"))[kind]["valid"]


def check_later_turns(later_turns: int) -> dict:
    """The closed-loop turns of a multi-turn run: counted, not tested (their
    arrivals follow the engine's finish times, not a nominal rate)."""
    return _check(NA, f"{later_turns} later turns are closed-loop (sent a think time after the "
                      "previous turn finished): not tested against the session rate")


def run_validity(*, arrivals, nominal_rate, process, failed, cancelled, dispatch_lags,
                 cache_state, warmup, step_times, step_waiting, stream=None,
                 later_turns: int | None = None) -> dict:
    """The validity object of one run from its measured requests and step
    table; ``stream`` (ITL p50, TPOT p50), given for served runs, adds the
    ``stream`` check. For a multi-turn run ``arrivals`` are the session
    starts (first turns) and ``later_turns`` counts the closed-loop turns,
    which adds the ``later_turns`` entry."""
    checks = {
        "arrival_rate": check_rate(arrivals, nominal_rate,
                                   "req/s" if later_turns is None else "sessions/s"),
        "arrival_process": check_process(arrivals, process, nominal_rate),
        "dispatch_lag": check_dispatch(dispatch_lags),
        "failures": check_failures(failed, cancelled),
        "cache_state": check_cache(cache_state, warmup),
    }
    if stream is not None:
        checks["stream"] = check_stream(*stream)
    checks["overload"] = check_overload(step_times, step_waiting, arrivals)
    if later_turns is not None:
        checks["later_turns"] = check_later_turns(later_turns)
    return verdict(checks)


def run_is_valid(summary: Mapping) -> bool:
    """A run's verdict from its summary; runs written before validity existed count as valid."""
    v = summary.get("validity")
    return True if not isinstance(v, Mapping) else bool(v.get("valid", True))


def describe_validity(summary: Mapping, detail: bool = True) -> str:
    """``valid``, ``NOT VALID: check (detail); ...``, or for a run valid for
    some metric kinds only, which kinds and why the others are not
    (``throughput, work and cache counters valid; latency, inter-token
    latency NOT VALID: overload``), for tables (without the details when not
    ``detail``)."""
    v = summary.get("validity")
    if not isinstance(v, Mapping):
        return "not checked"
    if v.get("valid"):
        warns = [n for n, c in v.get("checks", {}).items() if c.get("status") == WARN]
        return "valid" + (f" (warn: {', '.join(warns)})" if warns else "")
    checks = v.get("checks", {})
    reasons = list(v.get("reasons", []))
    why = (", ".join(reasons) if not detail else
           "; ".join(f"{n} ({checks.get(n, {}).get('detail', '')})" for n in reasons))
    kinds = metric_verdicts(v)
    good = [k for k in METRIC_KINDS if kinds[k]["valid"]]
    if not good:
        return "NOT VALID: " + why
    bad = ", ".join(kind_words(k) for k in METRIC_KINDS if k not in good)
    return f"{', '.join(kind_words(k) for k in good)} valid; {bad} NOT VALID: {why}"


def valid_as(summary: Mapping) -> str:
    """For a run valid for some metric kinds only, one line saying what each
    valid kind measures (``valid: throughput as the sustained service rate
    ...``); "" for a run valid for all or none."""
    v = summary.get("validity")
    if not isinstance(v, Mapping) or v.get("valid"):
        return ""
    kinds = metric_verdicts(v)
    good = [f"{kind_words(k)} as {kinds[k]['as']}" for k in METRIC_KINDS if kinds[k]["valid"]]
    return "valid: " + "; ".join(good) if good else ""


def failed_details(summary: Mapping) -> list[str]:
    """``check: detail`` for every check that failed or warned."""
    v = summary.get("validity")
    if not isinstance(v, Mapping):
        return []
    return [f"{n}: {c.get('detail', '')}" for n, c in v.get("checks", {}).items()
            if c.get("status") in (FAIL, WARN)]


def _has_number(a: Mapping, b: Mapping, key: str) -> bool:
    return all(isinstance(x.get(key), (int, float)) and not math.isnan(x.get(key)) for x in (a, b))


def arm_parity(a: Mapping, b: Mapping) -> list[str]:
    """Why two runs (rows of `analysis.load.load_runs`) are not a fair pair:
    different workload hash, engine version, or delivered load; [] when fair."""
    problems = []
    for key, words in (("workload_hash", "workload hash"), ("engine_version", "engine version")):
        if a.get(key) != b.get(key):
            problems.append(f"{words} differs")
    # a multi-turn run's load is its session starts: later turns follow each
    # arm's own finish times, so their rate differs between fair arms
    key = "delivered_session_rate" if _has_number(a, b, "delivered_session_rate") else "delivered_rate_req_s"
    ra, rb = a.get(key), b.get(key)
    if ra is not None and rb is not None and not (math.isnan(ra) or math.isnan(rb)):
        if abs(ra / rb - 1) > PARITY_RATE_TOLERANCE:
            unit = "sessions/s" if key == "delivered_session_rate" else "req/s"
            problems.append(f"measured load differs ({ra:.3f} vs {rb:.3f} {unit})")
    return problems
