"""hbench advise's answer (analysis/advise.py) on hand-made capacity grids:
which arm leads and by how much, when organizations are level, and what
limit a failing run names from its SLO terms and TTFT attribution."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import advise as A
from analysis.capacity import parse_slo

SLO = parse_slo("ttft_p99<=2s")


def cells(arms: dict[tuple, dict[int, float]], rates=(1.0, 2.0, 4.0)) -> pd.DataFrame:
    """arm (label, org, cap, split) -> seed -> capacity; a run meets the SLO
    at every rate up to its seed's capacity."""
    rows = []
    for (label, org, cap, split), per_seed in arms.items():
        for seed, capacity in per_seed.items():
            for rate in rates:
                rows.append({"arm": label, "org": org, "cap": cap, "d0_attn_fraction": split,
                             "rate": rate, "seed": seed, "meets": rate <= capacity,
                             "run_dir": f"{label}/{seed}/{rate:g}"})
    return pd.DataFrame(rows)


S2 = ("s2 cap 63", "s2", 63, math.nan)
D0 = ("d0 cap 63 split 0.5", "d0", 63, 0.5)
S0 = ("s0 cap 63", "s0", 63, math.nan)


def test_an_arm_with_one_pool_is_kept_beside_one_with_a_split():
    table = A.arm_table(cells({S2: {1: 2, 2: 4}, D0: {1: 1, 2: 1}}))
    assert list(table["arm"]) == ["s2 cap 63", "d0 cap 63 split 0.5"]
    assert table.iloc[0]["capacity_req_s"] == 3.0


def test_the_runner_up_is_the_best_arm_of_another_organization():
    s2_big = ("s2 cap 126", "s2", 126, math.nan)
    c = cells({s2_big: {1: 4, 2: 4}, S2: {1: 2, 2: 4}, D0: {1: 1, 2: 2}})
    d = A.decide(c, A.arm_table(c))
    assert d.best["arm"] == "s2 cap 126" and d.runner_up["arm"] == "d0 cap 63 split 0.5"
    assert d.diff == pytest.approx(2.5) and not d.level
    assert d.at_top                                     # 4 req/s is the grid's top


def test_organizations_with_the_same_capacity_at_every_seed_are_level():
    c = cells({S2: {1: 2, 2: 4}, D0: {1: 2, 2: 4}, S0: {1: 2, 2: 4}})
    table = A.arm_table(c)
    d = A.decide(c, table)
    assert d.level and not d.significant and A.all_level(table)
    assert "do not differ" in A.margin_words(d, 0.05)


def summary(ttft, parts=None, **extra):
    out = {"ttft_p99_s": ttft, **extra}
    for cause, seconds in (parts or {}).items():
        out[f"ttft_p99_{cause}_s"] = seconds
    return out


@pytest.mark.parametrize("parts, kind", [
    ({"wait_cap": 3.0, "wait_memory": 0.5, "prefill": 0.2}, "cap"),
    ({"wait_memory": 1.0, "recompute": 1.5, "wait_cap": 2.0}, "memory"),   # 2.5 s of memory
    ({"wait_budget": 2.2, "prefill": 0.3}, "token budget"),
    ({"prefill": 2.4}, "compute"),
])
def test_a_failing_ttft_names_the_cause_with_most_of_the_percentile(parts, kind):
    got, failed, _ = A.limit_of_run(summary(2.5, parts), SLO)
    assert got == kind and failed == ("ttft_p99<=2s",)


def test_a_decode_limit_is_compute_and_a_held_slo_is_no_limit():
    tpot = parse_slo("ttft_p99<=2s,tpot_p99<=50ms")
    got, failed, _ = A.limit_of_run(summary(1.0, tpot_p99_s=0.08), tpot)
    assert (got, failed) == ("compute", ("tpot_p99<=50ms",))
    assert A.limit_of_run(summary(1.0), SLO)[0] == "grid"


def test_the_seeds_vote_at_each_ones_first_failing_rate():
    c = cells({S2: {1: 2, 2: 1, 3: 4}})
    runs = {"s2 cap 63/1/4": summary(3.0, {"wait_cap": 2.0}),
            "s2 cap 63/2/2": summary(3.0, {"wait_memory": 2.0}),
            "s2 cap 63/3/4": summary(1.0)}
    assert [r[:2] for r in A.failing_runs(c, "s2 cap 63")] == [(1, 4.0), (2, 2.0)]
    runs["s2 cap 63/2/2"] = summary(3.0, {"wait_cap": 1.0})
    found = A.limit_found(c, "s2 cap 63", SLO, runs.__getitem__)
    assert found.kind == "cap" and found.votes == {"cap": 2} and found.rate == 2.0


def test_an_arm_that_held_the_top_rate_has_no_limit_inside_the_grid():
    c = cells({S2: {1: 4, 2: 4}})
    assert A.limit_found(c, "s2 cap 63", SLO, lambda d: pytest.fail(d)).kind == "grid"


def test_the_answer_says_the_cap_not_the_organization_decides_when_all_are_level():
    first_cells = cells({S2: {1: 2, 2: 2}, D0: {1: 2, 2: 2}})
    t0 = A.arm_table(first_cells)
    d0 = A.decide(first_cells, t0)
    l0 = A.LimitFound("cap", ("ttft_p99<=2s",), {"cap": 2}, {"wait_cap": 3.1}, 4.0)
    big = ("s2 cap 126", "s2", 126, math.nan)
    c = cells({big: {1: 4, 2: 4}, S2: {1: 2, 2: 2}, D0: {1: 2, 2: 2}})
    d = A.decide(c, A.arm_table(c))
    text = " ".join(A.sentences(d, A.LimitFound("grid"), slo="ttft_p99<=2s", top_rate=4.0,
                                alpha=0.05, setting="For m", unit="sessions/s",
                                first=(t0, d0, l0), peak=(9.2e9, 59e9)))
    assert "with a running cap of 63, every organization searched sustains 2.00 sessions/s" in text
    assert "the organization does not matter; the cap does" in text
    assert "With the cap raised to 126, use S2 with a running cap of 126" in text
    assert "at least 4.00 sessions/s" in text and "pass higher --rates" in text
    assert "peak state was 9.2 GB of the 59.0 GB given (16%)" in text


def test_among_equal_capacities_an_organization_an_engine_ships_comes_first():
    s1 = ("s1 cap 63", "s1", 63, math.nan)
    table = A.arm_table(cells({s1: {1: 2, 2: 4}, S2: {1: 2, 2: 4}, D0: {1: 2, 2: 4}}))
    assert list(table["org"]) == ["d0", "s1", "s2"]
    d = A.decide(cells({s1: {1: 2, 2: 4}, D0: {1: 2, 2: 4}}), table)
    text = " ".join(A.sentences(d, A.LimitFound("grid"), slo="ttft_p99<=2s", top_rate=4.0,
                                alpha=0.05, setting="For m", level=True))
    assert "use D0 with a running cap of 63, 0.5 of the bytes to attention, which a released " \
           "engine serves: every organization tried at this cap sustains" in text
    d = A.decide(cells({s1: {1: 2, 2: 4}, S2: {1: 2, 2: 4}}), A.arm_table(
        cells({s1: {1: 2, 2: 4}, S2: {1: 2, 2: 4}})))
    text = " ".join(A.sentences(d, A.LimitFound("grid"), slo="ttft_p99<=2s", top_rate=4.0,
                                alpha=0.05, setting="For m", level=True))
    assert "use S1 with a running cap of 63: every organization tried" in text
    assert "released engine" not in text


def point_cells(arms: dict[tuple, dict[int, tuple[float, bool]]], *, valid=False,
                rate=3.0) -> pd.DataFrame:
    """arm (label, org) -> seed -> (throughput, SLO held) at one rate."""
    rows = []
    for (label, org), per_seed in arms.items():
        for seed, (tok_s, held) in per_seed.items():
            rows.append({"arm": label, "org": org, "cap": 63, "rate": rate, "seed": seed,
                         "meets": held, "valid": valid, A.POINT_METRIC: tok_s,
                         "ttft_p99_s": 10.0 / tok_s, "run_dir": f"{label}/{seed}"})
    return pd.DataFrame(rows)


def test_at_one_rate_a_growing_queue_compares_throughput_by_the_paired_ratio():
    c = point_cells({("s2", "s2"): {1: (400.0, False), 2: (500.0, False)},
                     ("d0", "d0"): {1: (420.0, False), 2: (525.0, False)}})
    metric, higher = A.point_metric(c, SLO)
    assert (metric, higher) == (A.POINT_METRIC, True)
    table = A.point_table(c, metric, higher)
    assert list(table["arm"]) == ["d0", "s2"]
    d = A.decide_point(c, table, higher)
    # both seeds 5 % ahead: geometric mean ratio 1.05, no spread
    assert d.effect_pct == pytest.approx(5.0) and d.n == 2 and not d.level
    assert "+5.00% throughput" in A.point_margin_words(d, 0.05)


def test_at_one_rate_a_steady_state_compares_the_slos_latency_lower_first():
    c = point_cells({("s2", "s2"): {1: (400.0, True), 2: (500.0, True)},
                     ("d0", "d0"): {1: (380.0, True), 2: (450.0, True)}}, valid=True)
    metric, higher = A.point_metric(c, SLO)
    assert (metric, higher) == ("ttft_p99_s", False)
    table = A.point_table(c, metric, higher)
    assert table.iloc[0]["arm"] == "s2"         # the lower TTFT (10/400 < 10/380)
    d = A.decide_point(c, table, higher)
    assert d.effect_pct < 0                      # best / runner-up latency, below 1
    ratios = [(10 / 400) / (10 / 380), (10 / 500) / (10 / 450)]
    assert d.effect_pct == pytest.approx((math.prod(ratios) ** 0.5 - 1) * 100)


def test_at_one_rate_an_arm_holding_the_slo_ranks_before_a_faster_one_that_misses_it():
    c = point_cells({("s2", "s2"): {1: (600.0, False), 2: (600.0, True)},
                     ("s0", "s0"): {1: (300.0, True), 2: (300.0, True)}})
    table = A.point_table(c, A.POINT_METRIC, True)
    assert list(table["arm"]) == ["s0", "s2"]
    assert A.limit_at_point(c, "s0", SLO, lambda d: pytest.fail(d)).kind == "held"
    found = A.limit_at_point(c, "s2", SLO,
                             lambda d: summary(3.0, {"wait_memory": 2.5, "prefill": 0.2}))
    assert found.kind == "memory" and found.votes == {"memory": 1} and found.rate == 3.0


def test_equal_throughput_at_every_seed_is_level():
    c = point_cells({("s2", "s2"): {1: (400.0, False), 2: (500.0, False)},
                     ("d0", "d0"): {1: (400.0, False), 2: (500.0, False)}})
    d = A.decide_point(c, A.point_table(c, A.POINT_METRIC, True), True)
    assert d.level and "do not differ" in A.point_margin_words(d, 0.05)


def test_peak_state_is_the_peak_total_less_the_weights_not_a_sum_of_kinds():
    # kinds peak at different moments: 3 + 2 GB would overstate a 4 GB state peak
    s = {"peak_mem_total_bytes": 18e9, "peak_mem_attention_bytes": 3e9,
         "peak_mem_ssm_bytes": 2e9}
    assert A.state_peak_bytes(s, 14e9) == pytest.approx(4e9)
    assert math.isnan(A.state_peak_bytes({}, 14e9))


def test_the_arm_words_name_a_headroom_and_a_checkpoint_policy_away_from_the_default():
    row = {"org": "s2", "cap": 63, "headroom": 0.19, "ckpt": "marconi/utility"}
    assert A._arm_words(row) == ("S2 with a running cap of 63, admission headroom 0.19, "
                                 "checkpoints marconi/utility")
    assert A._arm_words({**row, "headroom": 0.0, "ckpt": A.DEFAULT_CKPT}) == \
        "S2 with a running cap of 63"


def test_what_would_change_a_level_answer_is_said_from_the_smaller_budget():
    c = cells({S2: {1: 2, 2: 2}, D0: {1: 1, 2: 1}})
    smaller = {"decision": A.decide(c, A.arm_table(c)), "table": A.arm_table(c),
               "budget": "27.50GiB", "share": 0.5, "level": False, "top_rate": 4.0}
    text = A.smaller_words(smaller, 0.05)
    assert text.startswith("What would change that: less memory; with 27.50GiB for state "
                           "(0.5 of it) S2 with a running cap of 63 leads, sustaining 2.00 req/s")
    assert "ahead of d0 cap 63 split 0.5 by +1.00 req/s at every seed" in text
    c = cells({S2: {1: 2, 2: 2}, D0: {1: 2, 2: 2}, S0: {1: 1, 2: 2}})
    t = A.arm_table(c)
    some = {**smaller, "decision": A.decide(c, t), "table": t}
    assert A.smaller_words(some, 0.05) == (
        "What would change that: less memory; with 27.50GiB for state (0.5 of it) D0, S2 still "
        "sustain 2.00 req/s (every seed), level at every seed, while S0 1.50 req/s [1.00, 2.00] "
        "falls behind.")
    c = cells({S2: {1: 2, 2: 4}, D0: {1: 2, 2: 4}})
    level = {**smaller, "decision": A.decide(c, A.arm_table(c)), "level": True, "share": 0.25}
    assert "not less memory either" in A.smaller_words(level, 0.05)
    at_top = {**level, "top_rate": 3.0}
    assert "beyond the rate grid" in A.smaller_words(at_top, 0.05)
    refused = {"budget": "0.65GiB", "share": 0.5, "refused": "budget 0.65GiB cannot admit it"}
    assert A.smaller_words(refused, 0.05) == (
        "Less memory would not change that: with 0.65GiB for state (0.5 of it) the workload "
        "cannot be served (budget 0.65GiB cannot admit it).")
