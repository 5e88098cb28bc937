"""What each summary metric is called, its unit, its bounds: one table for every report.

A `Metric` names a ``summary.json`` key for a reader: its label (``TTFT
p99``), the unit its stored value is in (``s``), how a terminal shows it
(``x 1000``, ``ms``), which direction is better, and its **kind**, which
fixes the values it can take:

===========  =======================================  ==================
kind         what                                      bounds
===========  =======================================  ==================
``rate``     a throughput or an arrival rate            > 0, no upper
``latency``  a time                                     > 0, no upper
``bytes``    memory                                     >= 0
``count``    a number of requests, tokens, events       >= 0
``tokens``   a mean depth per request, in tokens        >= 0
``fraction`` a share                                    [0, 1]
===========  =======================================  ==================

`bounded` says which kinds an interval over seeds must keep inside their
range by construction (`analysis.figures.centre_ci`): a mean token depth,
a count and a fraction, whose t interval (or the geometric mean's log-t
interval) on two or three seeds can reach far past any value the quantity
can take (a J_adopt interval to 7,000 tokens for a 3,213-token prefix).

Nothing here imports beyond the standard library: ``hbench run`` prints
its summary table (`SUMMARY_ROWS`) from this module too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Metric:
    """A summary metric as a reader sees it; ``unit`` is the stored value's,
    ``scale`` and ``shown`` the terminal's (value x scale, in ``shown``)."""

    label: str
    unit: str
    kind: str
    better: str | None = None   # "higher", "lower" or None (neither)
    scale: float = 1.0
    shown: str = ""

    @property
    def lower(self) -> float:
        return 0.0

    @property
    def upper(self) -> float:
        return 1.0 if self.kind == "fraction" else float("inf")


def _latency(label: str, *, ms: bool = True) -> Metric:
    return Metric(label=label, unit="s", kind="latency", better="lower",
                  scale=1e3 if ms else 1.0, shown="ms" if ms else "s")


def _count(label: str, unit: str = "", better: str | None = None) -> Metric:
    return Metric(label=label, unit=unit, kind="count", better=better)


METRICS: dict[str, Metric] = {
    "throughput_ledger_tok_s": Metric(label="output tok/s (ledger window)", unit="tok/s", kind="rate",
                                      better="higher"),
    "throughput_span_tok_s": Metric(label="output tok/s (request span)", unit="tok/s", kind="rate",
                                    better="higher"),
    "delivered_rate_req_s": Metric(label="delivered rate", unit="req/s", kind="rate", better="higher",
                                   shown="req/s"),
    "goodput_req_s": Metric(label="goodput", unit="req/s", kind="rate", better="higher", shown="req/s"),
    **{f"{m}_{q}_s": _latency(f"{name} {q}", ms=m != "e2e")
       for m, name in (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "end-to-end"))
       for q in ("p50", "p90", "p99")},
    "initial_input_tokens": _count("initial input tokens", "tokens"),
    "reused_tokens": _count("reused prompt tokens", "tokens", "higher"),
    "recomputed_tokens": _count("recomputed tokens", "tokens", "lower"),
    "j_adopt_mean": Metric(label="mean J_adopt", unit="tokens", kind="tokens", better="higher", shown="tok"),
    "r_max_mean": Metric(label="mean R_max", unit="tokens", kind="tokens", better="higher", shown="tok"),
    "attn_depth_mean": Metric(label="mean attention depth", unit="tokens", kind="tokens", shown="tok"),
    "gap_r_mean": Metric(label="mean Gap_R (R_max - J_adopt)", unit="tokens", kind="tokens", shown="tok"),
    "preemptions": _count("preemptions", better="lower"),
    "invalidations": _count("invalidations"),
    "invalidations_attention": _count("invalidated attention blocks"),
    "invalidations_checkpoint": _count("invalidated checkpoints"),
    "invalidated_tokens": _count("invalidated tokens", "tokens"),
    "waiting_median": _count("waiting (median)", "requests", "lower"),
    "running_median": _count("running (median)", "requests"),
    "peak_mem_total_bytes": Metric(label="peak memory incl. weights", unit="bytes", kind="bytes",
                                   better="lower", scale=2**-30, shown="GiB"),
    "peak_mem_attention_bytes": Metric(label="peak attention state", unit="bytes", kind="bytes",
                                       scale=2**-30, shown="GiB"),
    "peak_mem_ssm_bytes": Metric(label="peak SSM state", unit="bytes", kind="bytes", scale=2**-30,
                                 shown="GiB"),
    "peak_mem_conv_bytes": Metric(label="peak conv state", unit="bytes", kind="bytes", scale=2**-30,
                                  shown="GiB"),
    "slab_occupancy_mean": Metric(label="slab occupancy (mean)", unit="", kind="fraction", scale=100,
                                  shown="%"),
    "finished": _count("finished"),
    "failed": _count("failed", better="lower"),
    "cancelled": _count("cancelled", better="lower"),
    "ttft_send_p99_s": _latency("TTFT p99 from the send"),
    "server_ttft_p99_s": _latency("TTFT p99, server's histogram"),
    "server_itl_p50_s": _latency("ITL p50, server's histogram"),
    "member_pages_peak": _count("peak member pages (plugin)"),
    "later_turn_ttft_p50_s": _latency("TTFT p50, turns after the first"),
    "history_reuse_fraction": Metric(label="history served from cache", unit="", kind="fraction",
                                     better="higher", scale=100, shown="%"),
    "history_recomputed_tokens": _count("history tokens recomputed", "tokens", "lower"),
    "history_survived_fraction": Metric(label="turns whose history survived", unit="", kind="fraction",
                                        better="higher", scale=100, shown="%"),
    "token_hit_rate": Metric(label="token hit rate (reused / prompt tokens)", unit="", kind="fraction",
                             better="higher", scale=100, shown="%"),
    "capacity_move_s": _latency("time moving capacity", ms=False),
}

#: The rows of ``hbench run``'s summary table, in its order: (key, label, scale, unit).
RUN_SUMMARY = ("throughput_ledger_tok_s", "throughput_span_tok_s", "ttft_p50_s", "ttft_p99_s",
               "itl_p50_s", "itl_p99_s", "tpot_p99_s", "e2e_p99_s", "initial_input_tokens",
               "reused_tokens", "recomputed_tokens", "j_adopt_mean", "r_max_mean", "preemptions",
               "invalidations_attention", "invalidations_checkpoint", "waiting_median",
               "running_median", "peak_mem_total_bytes", "peak_mem_attention_bytes",
               "peak_mem_ssm_bytes", "slab_occupancy_mean", "finished", "failed", "cancelled",
               "ttft_send_p99_s", "server_ttft_p99_s", "server_itl_p50_s", "member_pages_peak",
               "later_turn_ttft_p50_s", "history_reuse_fraction", "history_recomputed_tokens",
               "history_survived_fraction")
SUMMARY_ROWS = [(k, METRICS[k].label, METRICS[k].scale, METRICS[k].shown) for k in RUN_SUMMARY]

# A key no table names: its kind and unit by its suffix (first match wins).
_SUFFIXES = (("_tok_s", "tok/s", "rate"), ("_req_s", "req/s", "rate"), ("_bytes", "bytes", "bytes"),
             ("_fraction", "", "fraction"), ("_s", "s", "latency"), ("_tokens", "tokens", "count"),
             ("_mean", "tokens", "tokens"), ("_median", "requests", "count"))


def metric(key: str) -> Metric:
    """The `Metric` of a summary key; a key not in `METRICS` gets its unit and
    kind from its suffix and its own name as the label."""
    if key in METRICS:
        return METRICS[key]
    unit, kind = next(((u, k) for suffix, u, k in _SUFFIXES if key.endswith(suffix)), ("", "count"))
    return Metric(label=key, unit=unit, kind=kind)


def name(key: str) -> str:
    """The metric's words for a sentence, without its unit: ``TTFT p99``."""
    return metric(key).label


def label(key: str) -> str:
    """An axis or column label with the stored value's unit: ``TTFT p99 (s)``,
    ``output tok/s (ledger window)`` (a label that already names its unit
    keeps it once), ``slab occupancy (mean) (fraction, 0-1)``."""
    m = metric(key)
    unit = "fraction, 0-1" if m.kind == "fraction" else m.unit or "count"
    return m.label if re.search(rf"(^|\W){re.escape(unit)}(\W|$)", m.label) else f"{m.label} ({unit})"


def bounded(key: str) -> bool:
    """Whether intervals of ``key`` over seeds must stay within the seeds'
    own range (a count, a mean token depth, a fraction)."""
    return metric(key).kind in ("count", "tokens", "fraction")


def higher_is_better(key: str) -> bool | None:
    """True, False, or None when neither direction is better."""
    better = metric(key).better
    return None if better is None else better == "higher"
