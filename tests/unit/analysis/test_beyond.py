"""The ``beyond`` design (`analysis.designs._beyond`) and its findings
(`analysis.beyond`): the grid, the arms every contrast selects, and the
tables on a hand-made run table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import designs as D
from analysis.beyond import best_combinations, factor_spread, policy_of, write_beyond
from analysis.contrasts import evaluate, select
from analysis.reproduce import add_derived_columns


def config_table(quick: bool = False) -> pd.DataFrame:
    return pd.DataFrame([c.to_dict() for c in D.DESIGNS["beyond"].configs(quick)])


def test_the_grid_crosses_orgs_policies_budgets_and_workloads():
    d = D.DESIGNS["beyond"]
    full, quick = config_table(), config_table(quick=True)
    assert len(full) == 4 * 4 * 2 * 2 * 6 and len(quick) == 4 * 4 * 2 * 2 * 2
    assert set(full["org"]) == {"d0", "u0", "e0", "s2"} and set(full["budget"]) == {"b63", "b108"}
    assert set(full["seed"]) == set(range(1, 7)) and set(quick["seed"]) == {1, 2}
    by_kind = full.groupby("workload_kind")["requests"].unique().to_dict()
    assert list(by_kind["sharegpt"]) == [D.FULL_REQUESTS] and list(by_kind["multiturn"]) == [60]
    assert set(quick.groupby("workload_kind")["requests"].first()) == {D.QUICK_REQUESTS, 30}
    assert {policy_of(r) for _, r in full.iterrows()} == set(D.BEYOND_POLICIES)
    assert set(full[full["ckpt_evict"] == "utility"]["utility_alpha"].astype(str)) == {"1.0", "auto"}
    assert len(d.contrasts) == 12 + 12 + 48 + 48 + 8 and len(d.interactions) == 36


@pytest.mark.slow
def test_every_contrast_selects_one_run_per_seed_on_each_side():
    runs = config_table()
    d = D.DESIGNS["beyond"]
    for c in d.contrasts:
        for side in (c.numerator, c.denominator):
            arm = select(runs, side)
            assert len(arm) == 6 and sorted(arm["seed"]) == [1, 2, 3, 4, 5, 6], (c.name, side)
        num, den = select(runs, c.numerator), select(runs, c.denominator)
        assert not set(num.index) & set(den.index), c.name
    names = {c.name for c in d.contrasts}
    for it in d.interactions:
        assert it.a in names and it.b in names


def synthetic_runs() -> pd.DataFrame:
    """The design's configs with made-up summaries: throughput is higher for
    u0 and for marconi/lru; TTFT the reverse; hits from reused/initial."""
    runs = config_table()
    bonus = {"d0": 1.0, "u0": 1.2, "e0": 1.1, "s2": 0.9}
    pol = {"every/lru": 1.0, "marconi/lru": 1.05, "every/utility": 0.95, "marconi/utility-auto": 1.0}
    rows = []
    for i, r in runs.iterrows():
        p = policy_of(r)
        noise = 1 + 0.01 * r["seed"]
        rows.append({"run_id": f"r{i}", "workload_hash": f"{r['workload_kind']}-{r['seed']}",
                     "throughput_ledger_tok_s": 500 * bonus[r["org"]] * pol[p] * noise,
                     "ttft_p99_s": 10 / (bonus[r["org"]] * pol[p]) * noise,
                     "reused_tokens": 100 * (2 if p == "marconi/utility-auto" else 1) + r["seed"],
                     "initial_input_tokens": 900})
    return add_derived_columns(pd.concat([runs, pd.DataFrame(rows)], axis=1))


@pytest.mark.slow
def test_best_combinations_and_factor_spread():
    runs = synthetic_runs()
    best = best_combinations(runs, D.THROUGHPUT)
    top = best[best["rank"] == 1]
    assert set(top["org"]) == {"u0"} and set(top["policy"]) == {"marconi/lru"}
    assert set(best[best["rank"] == 2]["org"]) == {"u0"}
    worst_ttft = best_combinations(runs, "ttft_p99_s")
    assert set(worst_ttft[worst_ttft["rank"] == 1]["org"]) == {"u0"}   # lowest TTFT first
    table = evaluate(runs, D.DESIGNS["beyond"].contrasts)
    spread = factor_spread(table)
    thr = spread[spread["metric"] == "throughput"].iloc[0]
    assert thr["org_max_abs_pct"] == pytest.approx(20.0) and thr["org_max_name"].startswith("U0/D0")
    assert abs(thr["policy_max_abs_pct"]) == pytest.approx(5.0)   # marconi/lru +5, every/utility -5
    hits = table[table["family"] == "Marconi cross-check (token hit rate)"]
    assert len(hits) == 8 and (hits["effect_pct"] > 70).all()   # reused tokens doubled


@pytest.mark.slow
def test_write_beyond_writes_the_findings_without_figures(tmp_path):
    runs = synthetic_runs()
    d = D.DESIGNS["beyond"]
    from analysis.contrasts import evaluate_interactions

    table = evaluate(runs, d.contrasts)
    inter = evaluate_interactions(runs, d.contrasts, d.interactions)
    assert write_beyond(tmp_path, runs, table, inter, figures=False) == []
    md = (tmp_path / "beyond.md").read_text()
    assert "## Highest arm means by output tok/s (ledger window)" in md
    assert "A ranking of arm means, not a test" in md
    assert "| multiturn | b108 | 1 | U0 | marconi/lru |" in md
    assert "## Marconi cross-check (token hit rate)" in md
    assert "## policy x organization (throughput)" in md
    assert not math.isnan(inter["effect"].iloc[0])
