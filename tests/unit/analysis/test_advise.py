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
