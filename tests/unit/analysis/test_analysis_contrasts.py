"""Contrasts: strict seed pairing, Holm per family, planted and null effects,
automatic contrasts and design files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import stats
from analysis.contrasts import (
    Contrast,
    Interaction,
    arm_means,
    auto_contrasts,
    evaluate,
    evaluate_interactions,
    load_design,
    org_pairs,
)
from analysis.default_metrics import DEFAULT_METRICS
from analysis.load import load_runs
from common.errors import HbenchError
from tests.support.results_factory import write_design, write_run

METRIC = "throughput_ledger_tok_s"


def frame(num: np.ndarray, den: np.ndarray) -> pd.DataFrame:
    """Two orgs, one run per seed each, same workload per seed."""
    rows = []
    for s, (a, b) in enumerate(zip(num, den, strict=True)):
        rows.append({"org": "s1", "seed": s, "workload_hash": f"w{s}", "run_id": f"s1-{s}", METRIC: a})
        rows.append({"org": "s0", "seed": s, "workload_hash": f"w{s}", "run_id": f"s0-{s}", METRIC: b})
    return pd.DataFrame(rows)


S1_S0 = Contrast("s1/s0", METRIC, {"org": "s1"}, {"org": "s0"})


def test_planted_ten_percent_effect_is_detected():
    rng = np.random.default_rng([1, 0])
    base = rng.uniform(250, 350, 6)  # seeds differ a lot in absolute throughput
    df = frame(base * 1.10 * rng.lognormal(0, 0.01, 6), base)
    row = evaluate(df, [S1_S0], n_resamples=1000).iloc[0]
    assert row["n"] == 6
    assert row["effect_pct"] == pytest.approx(10.0, abs=1.5)
    assert row["ci_low"] > 1.0 and row["mean_ci_low"] > 1.0
    assert row["p_signflip"] == pytest.approx(2 / 2**6)   # every ratio above 1
    assert row["p_holm"] < 0.001
    assert row["significant"] and row["verdict"] == "significant"


@pytest.mark.slow
def test_null_effect_false_positive_rate_is_nominal():
    # 400 null experiments of 6 seeds through the same summary and decision
    # rule `evaluate` uses (a family of one, so p_holm = p).
    rng = np.random.default_rng([2, 0])
    hits = 0
    for _ in range(400):
        s = stats.summarize_ratios(rng.lognormal(0, 0.05, 6))
        hits += stats.is_significant(stats.holm([s.p])[0], s.ci, 1.0, 0.05)
    assert hits / 400 <= 0.08


def test_ci_containing_one_is_not_significant():
    df = frame(np.array([110.0, 90.0, 105.0, 95.0]), np.full(4, 100.0))
    row = evaluate(df, [S1_S0], n_resamples=200).iloc[0]
    assert row["ci_low"] < 1.0 < row["ci_high"]
    assert not row["significant"] and row["verdict"] == "not significant"


def test_refuses_to_pair_mismatched_workload_hashes():
    df = frame(np.array([110.0, 120.0]), np.array([100.0, 100.0]))
    df.loc[(df["org"] == "s0") & (df["seed"] == 1), "workload_hash"] = "other"
    with pytest.raises(HbenchError, match="refusing to pair s1-1 with s0-1 at seed 1: workload hash differs"):
        evaluate(df, [S1_S0])


def test_refuses_ambiguous_arm_and_empty_arm():
    df = frame(np.array([110.0, 120.0]), np.array([100.0, 100.0]))
    dup = pd.concat([df, df.iloc[[0]].assign(run_id="again")], ignore_index=True)
    with pytest.raises(HbenchError, match="several runs for seed 0"):
        evaluate(dup, [S1_S0])
    with pytest.raises(HbenchError, match="matches no runs"):
        evaluate(df, [Contrast("d0/s0", METRIC, {"org": "d0"}, {"org": "s0"})])


@pytest.mark.slow
def test_holm_applies_within_each_family_only():
    rng = np.random.default_rng([3, 0])
    base = rng.uniform(250, 350, 5)
    df = frame(base * 1.05 * rng.lognormal(0, 0.03, 5), base)
    df["other"] = df[METRIC] * rng.lognormal(0, 0.03, len(df))
    cs = [S1_S0, Contrast("b", "other", {"org": "s1"}, {"org": "s0"}, family="default"),
          Contrast("c", METRIC, {"org": "s1"}, {"org": "s0"}, family="alone")]
    out = evaluate(df, cs, n_resamples=100)
    fam = out[out["family"] == "default"]
    assert list(fam["p_holm"]) == pytest.approx(list(stats.holm(fam["p"])))
    alone = out[out["family"] == "alone"].iloc[0]
    assert alone["p_holm"] == pytest.approx(alone["p"])


def _grid(tmp_path):
    """q in {0, 1} x orgs {s0, s1, s2} x seeds {0..3}; s1 is 20% better at q=1, 10% at q=0."""
    gain = {("s0", 0.0): 1.0, ("s1", 0.0): 1.10, ("s2", 0.0): 1.12,
            ("s0", 1.0): 1.0, ("s1", 1.0): 1.20, ("s2", 1.0): 1.25}
    jitter = np.random.default_rng([4, 0]).lognormal(0, 0.01, (3, 2, 4))
    for i, org in enumerate(("s0", "s1", "s2")):
        for j, q in enumerate((0.0, 1.0)):
            for seed in range(4):
                tput = (300 + 10 * seed) * gain[(org, q)] * jitter[i, j, seed]
                write_run(tmp_path, f"{org}-q{q}-{seed}", org=org, q=q, seed=seed,
                          summary={METRIC: tput, "ttft_p99_s": 2.0 + seed})
    return load_runs(tmp_path)


def test_auto_contrasts_compare_every_pair_within_each_cell(tmp_path):
    runs = _grid(tmp_path)
    cs = auto_contrasts(runs, [METRIC])
    assert sorted(c.name for c in cs) == ["s1/s0 @ q=0.0", "s1/s0 @ q=1.0", "s2/s0 @ q=0.0",
                                          "s2/s0 @ q=1.0", "s2/s1 @ q=0.0", "s2/s1 @ q=1.0"]
    assert {c.family for c in cs} == {METRIC}
    out = evaluate(runs, cs, n_resamples=200).set_index("name")
    assert out.loc["s1/s0 @ q=1.0", "effect_pct"] == pytest.approx(20.0, abs=2.0)
    assert out.loc["s2/s1 @ q=1.0", "effect_pct"] == pytest.approx(100 * (1.25 / 1.20 - 1), abs=1.0)
    two = auto_contrasts(runs, [METRIC, "ttft_p99_s"])
    assert len(two) == 12 and {c.family for c in two} == {METRIC, "ttft_p99_s"}


def test_auto_contrasts_default_to_throughput_and_latency(tmp_path):
    runs = _grid(tmp_path)
    assert {c.metric for c in auto_contrasts(runs)} == set(DEFAULT_METRICS)
    assert {c.metric for c in auto_contrasts(runs.drop(columns=["tpot_p99_s"]))} == \
        set(DEFAULT_METRICS) - {"tpot_p99_s"}


def test_auto_contrasts_against_a_reference(tmp_path):
    runs = _grid(tmp_path)
    cs = auto_contrasts(runs, [METRIC], reference="s2")
    assert sorted(c.name for c in cs) == ["s0/s2 @ q=0.0", "s0/s2 @ q=1.0", "s1/s2 @ q=0.0", "s1/s2 @ q=1.0"]
    with pytest.raises(HbenchError, match="--reference d0: no run of d0"):
        auto_contrasts(runs, [METRIC], reference="d0")


def test_org_pairs_put_the_later_organization_over_the_earlier():
    assert org_pairs(["d0", "s2", "s0"]) == [("s2", "s0"), ("d0", "s0"), ("d0", "s2")]
    assert org_pairs(["d0", "s2"], reference="d0") == [("s2", "d0")]
    assert org_pairs(["s1", "s2"], reference="s0") == []


def test_auto_contrasts_unknown_metric(tmp_path):
    with pytest.raises(HbenchError, match="unknown metric 'nope'"):
        auto_contrasts(_grid(tmp_path), ["nope"])


@pytest.mark.slow
def test_design_file_contrasts_and_interactions(tmp_path):
    runs = _grid(tmp_path / "runs")
    path = write_design(tmp_path / "design.toml", """
[[contrast]]
name = "S1/S0 q=1"
family = "Q1"
numerator = {org = "s1", q = 1.0}
denominator = {org = "s0", q = 1.0}

[[contrast]]
name = "S1/S0 q=0"
family = "Q1"
numerator = {org = "s1", q = 0}
denominator = {org = "s0", q = 0}

[[interaction]]
name = "S1/S0 q=1 minus q=0"
a = "S1/S0 q=1"
b = "S1/S0 q=0"

[[interaction]]
name = "K"
kind = "ratio"
a = "S1/S0 q=1"
b = "S1/S0 q=0"
""")
    d = load_design(path)
    assert [c.name for c in d.contrasts] == ["S1/S0 q=1", "S1/S0 q=0"]
    assert d.contrasts[0].metric == METRIC and d.contrasts[0].family == "Q1"
    inter = evaluate_interactions(runs, d.contrasts, d.interactions, n_resamples=200).set_index("name")
    diff = inter.loc["S1/S0 q=1 minus q=0"]
    assert diff["unit"] == "pp" and diff["paired"]
    assert diff["effect"] == pytest.approx(10.0, abs=2.0) and diff["significant"]
    k = inter.loc["K"]
    assert k["estimate"] == pytest.approx(1.2 / 1.1, abs=0.02) and k["unit"] == "%"
    assert list(inter["p_holm"]) == pytest.approx(list(stats.holm(inter["p"])))


def test_design_file_errors(tmp_path):
    with pytest.raises(HbenchError, match="no \\[\\[contrast\\]\\] tables"):
        load_design(write_design(tmp_path / "a.toml", "x = 1\n"))
    with pytest.raises(HbenchError, match="needs name, numerator, denominator"):
        load_design(write_design(tmp_path / "b.toml", "[[contrast]]\nname = 'x'\n"))
    with pytest.raises(HbenchError, match="kind must be"):
        Interaction("i", "a", "b", kind="sum")


def test_arm_means_are_means_over_seeds(tmp_path):
    runs = _grid(tmp_path)
    arms = arm_means(runs, ["ttft_p99_s"]).set_index(["org", "q"])
    assert arms.loc[("s0", 0.0), "runs"] == 4
    assert arms.loc[("s0", 0.0), "ttft_p99_s"] == pytest.approx(np.mean([2.0, 3.0, 4.0, 5.0]))


def test_contrast_and_its_reverse_are_reciprocal():
    rng = np.random.default_rng([5, 0])
    base = rng.uniform(250, 350, 4)
    df = frame(base * rng.lognormal(0.05, 0.04, 4), base)
    ab = evaluate(df, [S1_S0]).iloc[0]
    ba = evaluate(df, [Contrast("s0/s1", METRIC, {"org": "s0"}, {"org": "s1"})]).iloc[0]
    assert ab["geo_mean_ratio"] * ba["geo_mean_ratio"] == pytest.approx(1.0)
    assert (ab["ci_low"], ab["ci_high"]) == pytest.approx((1 / ba["ci_high"], 1 / ba["ci_low"]))
    assert ab["p"] == pytest.approx(ba["p"]) and ab["significant"] == ba["significant"]


def test_zero_or_null_value_is_reported_and_keeps_its_holm_family_size():
    rng = np.random.default_rng([6, 0])
    base = rng.uniform(250, 350, 4)
    df = frame(base * 1.2 * rng.lognormal(0, 0.01, 4), base)
    df["other"] = df[METRIC]
    df.loc[(df["org"] == "s1") & (df["seed"] == 2), "other"] = 0.0
    df.loc[(df["org"] == "s0") & (df["seed"] == 3), "other"] = None
    out = evaluate(df, [S1_S0, Contrast("b", "other", {"org": "s1"}, {"org": "s0"})]).set_index("name")
    bad = out.loc["b"]
    assert bad["invalid"] == "seed 2: numerator 0; seed 3: denominator null/NaN"
    assert bad["verdict"] == "invalid values" and not bad["significant"] and np.isnan(bad["effect_pct"])
    good = out.loc["s1/s0"]
    assert good["p_holm"] == pytest.approx(min(1.0, 2 * good["p"]))  # a family of two, not one


def test_unpaired_seeds_are_listed_in_terminal_and_report(tmp_path):
    from rich.console import Console

    from analysis.report import markdown_report, print_tables

    df = frame(np.array([110.0, 120.0, 115.0]), np.array([100.0, 100.0, 100.0]))
    df = df[~((df["org"] == "s0") & (df["seed"] == 2))]
    df = pd.concat([df, df.iloc[[0]].assign(org="s0", seed=7, run_id="s0-7", workload_hash="w7")])
    table = evaluate(df, [S1_S0])
    assert table.iloc[0]["unpaired"] == "2,7" and table.iloc[0]["n"] == 2
    console = Console(record=True, width=250)
    print_tables(console, table)
    shown = console.export_text()
    assert "2 (+2 unpaired)" in shown and "s1/s0: seeds 2,7 ran in one arm only" in shown
    text = markdown_report(tmp_path, table, None, None, [], tmp_path)
    assert "- s1/s0: seeds 2,7 ran in one arm only and are not in the estimate" in text


def test_refuses_to_pair_runs_of_different_engine_versions():
    df = frame(np.array([110.0, 120.0]), np.array([100.0, 100.0]))
    df["engine_version"] = "sim-1"
    df.loc[(df["org"] == "s0") & (df["seed"] == 0), "engine_version"] = "sim-2"
    with pytest.raises(HbenchError, match=r"at seed 0: engine version differs \(sim-1 vs sim-2\)"):
        evaluate(df, [S1_S0])
