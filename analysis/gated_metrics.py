"""Which summary metrics `hbench regress` gates, which way is better, and the
tolerance rule each is judged by. Every key a run's summary can hold is
either gated here (`GATES`) or named in `UNGATED` with the reason it has no
direction; a test holds the two together with `harness.metrics`' keys, so a
new metric cannot go unwatched by accident.

Two tolerance rules (`RULES`), both with the gate's ``min_effect`` (a
fraction, default 2%):

- ``relative``: a quantity every run that served requests has above zero
  (throughput, latency percentiles, TPOT, finished requests, total memory
  peak). The candidate regresses when it is worse than the baseline by more
  than ``min_effect`` of the baseline. A baseline of zero or less is bad
  input: nothing can be measured against it.
- ``count``: a quantity that is zero when nothing of its kind happened
  (failed or cancelled requests, preemptions, recomputed or reused tokens,
  invalidations, the memory peak of one kind of state, the parts of TTFT).
  The candidate regresses when it is worse by more than ``min_effect`` of
  the baseline or, from a baseline of zero, by more than ``min_effect`` of
  one unit of the metric (one request, token, byte or second). A negative
  baseline is bad input.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.attribution import SUMMARY_KEYS as ATTRIBUTION_KEYS


@dataclass(frozen=True)
class Gate:
    """How one metric is gated: ``better`` is ``"higher"`` or ``"lower"``,
    ``rule`` a key of `RULES`."""

    better: str
    rule: str


RULES = {
    "relative": "worse by more than the tolerance, relative to the baseline; "
                "the baseline must be above 0",
    "count": "worse by more than the tolerance, relative to the baseline, or, "
             "from a baseline of 0, by more than the tolerance of one unit",
}

_HIGHER, _LOWER = "higher", "lower"
_LATENCIES = [f"{m}_p{q}_s" for m in ("ttft", "itl", "tpot", "e2e") for q in (50, 90, 99)]
_SERVER = [f"server_{m}_p{q}_s" for m in ("ttft", "itl", "tpot", "e2e") for q in (50, 99)]

GATES: dict[str, Gate] = {
    **{m: Gate(_HIGHER, "relative") for m in (
        "throughput_ledger_tok_s", "throughput_span_tok_s", "output_tokens", "finished")},
    **{m: Gate(_LOWER, "relative") for m in (
        *_LATENCIES, "peak_mem_total_bytes", "ttft_send_p50_s", "ttft_send_p99_s", *_SERVER,
        "turn0_ttft_p50_s", "later_turn_ttft_p50_s")},
    **{m: Gate(_HIGHER, "count") for m in (
        "reused_tokens", "j_adopt_mean", "r_max_mean", "attn_depth_mean",
        "history_reused_tokens", "history_reuse_fraction", "history_survived_fraction")},
    **{m: Gate(_LOWER, "count") for m in (
        "failed", "cancelled", "preemptions", "recomputed_tokens", "history_recomputed_tokens",
        "peak_mem_attention_bytes", "peak_mem_ssm_bytes", "peak_mem_conv_bytes",
        "member_pages_peak", "slab_pages_peak", "rounding_waste_bytes", "waiting_median",
        "invalidations_attention", "invalidations_checkpoint", "invalidated_tokens",
        "dispatch_lag_p99_s", *ATTRIBUTION_KEYS,
        "alloc_refusals", "alloc_refusals_with_room", "fragmented_bytes_peak", "capacity_move_s",
        "compaction_copy_s", "cascaded_checkpoints",
        "sglang_evictions", "sglang_evicted_kv_tokens", "sglang_evicted_mamba_slots",
        "sglang_tombstoned_nodes", "sglang_mamba_slots_in_use_peak")},
}

#: Summary keys with no better direction, and why.
UNGATED: dict[str, str] = {
    **dict.fromkeys(("requests", "initial_input_tokens", "sessions", "later_turns",
                     "history_tokens"), "the workload's size, not a measurement"),
    **dict.fromkeys(("delivered_rate_req_s", "delivered_session_rate"),
                    "the offered load as delivered, judged by the validity checks"),
    "running_median": "follows admission and load: more running is neither better nor worse",
    "slab_occupancy_mean": "a packing ratio that follows what is cached",
    **dict.fromkeys(("capacity_moves", "capacity_moved_bytes", "capacity_moved_to_attention_bytes",
                     "capacity_moved_to_checkpoint_bytes"),
                    "e0's moves: their cost is gated as capacity_move_s and in the latencies"),
    **dict.fromkeys(("compactions", "compaction_moved_pages", "compaction_moved_bytes"),
                    "u0's compactions: their cost is gated as compaction_copy_s and in the latencies"),
    "donated_attention_pages": "u0's trade between its sides (cached attention evicted to fund "
                               "states): its cost shows in reuse and the latencies",
    "sglang_mamba_slots": "the Mamba pool's size: configuration, not a measurement",
    **dict.fromkeys(("utility_alpha_tuned", "utility_alpha_tuned_at"),
                    "a choice the eviction policy made, not a measurement"),
    "validity": "the run's verdict, named in the report, not a number",
}
