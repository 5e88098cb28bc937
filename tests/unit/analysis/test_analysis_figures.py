"""Figures render (PNG + SVG, non-empty) with the expected axes, and are
skipped when the data lack the variation they need."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import figure_set, figures
from analysis.contrasts import auto_contrasts, evaluate
from analysis.load import load_runs
from harness.results import read_run
from tests.support.results_factory import write_run

METRIC = "throughput_ledger_tok_s"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """s2 and d0 over budgets x headroom x 2 seeds, plus a rate sweep at b63."""
    root = tmp_path_factory.mktemp("runs")
    for org, gain in (("s2", 1.0), ("d0", 1.05)):
        for budget in ("b63", "b83", "b108"):
            for f in (0.0, 0.19):
                for seed in (0, 1):
                    write_run(root, f"{org}-{budget}-{f}-{seed}", org=org, budget=budget, headroom=f, seed=seed,
                              tables=(budget == "b63" and f == 0.0),
                              summary={METRIC: 300 * gain * (1 - f / 2) * (1 + 0.01 * seed),
                                       "j_adopt_mean": 500.0 + seed, "r_max_mean": 900.0, "attn_depth_mean": 1000.0})
        for rate in (0.8, 4.5):
            for seed in (0, 1):
                write_run(root, f"{org}-rate{rate}-{seed}", org=org, budget="b63", rate=rate, seed=seed,
                          summary={METRIC: 200 * gain * rate * (1 + 0.02 * seed)})
    return load_runs(root)


def _written(paths):
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.slow
def test_headroom_figure_axes_and_files(runs, tmp_path):
    at_rate3 = runs[runs["rate"] == 3.0]
    fig = figures.headroom_figure(at_rate3, METRIC)
    axes = fig.axes
    assert [a.get_title() for a in axes] == ["budget b63", "budget b83", "budget b108"]
    assert axes[0].get_xlabel() == "admission headroom f (fraction of budget)"
    assert axes[0].get_ylabel() == "output tok/s (ledger window)"
    assert sorted(t.get_text() for t in axes[-1].get_legend().get_texts()) == ["D0", "S2"]
    _written(figures.save(fig, tmp_path, "headroom"))


def test_headroom_figure_needs_two_headrooms(runs):
    assert figures.headroom_figure(runs[runs["headroom"] == 0.0], METRIC) is None


def test_ratio_figures_vs_budget_and_rate(runs):
    fig = figures.ratio_figure(runs[(runs["rate"] == 3.0) & (runs["headroom"] == 0.0)], "budget")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "budget (label)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b63", "b83", "b108"]
    assert ax.get_ylabel() == "D0/S2 ratio (unitless, 1 = parity)"
    assert ax.get_title().startswith("D0 vs S2: output tok/s (ledger window) by ")
    line = ax.lines[0]
    assert list(line.get_ydata()) == pytest.approx([1.05, 1.05, 1.05])
    assert any(list(ln.get_ydata()) == [1.0, 1.0] for ln in ax.lines)  # the y = 1 reference
    fig = figures.ratio_figure(runs[(runs["budget"] == "b63") & (runs["headroom"] == 0.0)], "rate")
    assert fig.axes[0].get_xlabel() == "arrival rate (req/s)"
    assert list(fig.axes[0].lines[0].get_xdata()) == [0.8, 3.0, 4.5]
    assert figures.ratio_figure(runs[runs["budget"] == "b83"], "budget") is None


def test_joint_depth_figure(runs):
    fig = figures.joint_depth_figure(runs)
    assert [a.get_title() for a in fig.axes] == ["J_adopt (tokens)", "R_max (tokens)", "attention depth (tokens)"]
    # three budgets: one bar per (budget, organization), never pooled
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == \
        [f"{o}\n{b}" for b in ("b63", "b83", "b108") for o in ("D0", "S2")]
    one = figures.joint_depth_figure(runs[runs["budget"] == "b83"])
    assert [t.get_text() for t in one.axes[0].get_xticklabels()] == ["D0", "S2"]


def test_latency_cdfs_and_memory(runs, tmp_path):
    with_tables = runs[runs["path"].str.endswith("b63-0.0-0")]
    by_org = {r["org"]: read_run(r["path"]).table("requests") for _, r in with_tables.iterrows()}
    fig = figures.latency_cdf_figure(by_org)
    assert [a.get_title() for a in fig.axes] == ["TTFT", "ITL (per-request mean)"]
    assert fig.axes[0].get_ylabel() == "cumulative fraction of requests (0-1)"
    ydata = fig.axes[0].lines[0].get_ydata()
    assert ydata[-1] == 1.0 and np.all(np.diff(ydata) >= 0)
    steps = read_run(with_tables.iloc[0]["path"]).table("steps")
    fig = figures.memory_figure(steps, "memory")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("time (s)", "memory in use (GiB)")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["attention KV", "SSM state", "conv state"]
    _written(figures.save(fig, tmp_path, "memory"))


@pytest.mark.slow
def test_render_figures_writes_every_supported_figure(runs, tmp_path):
    paths = figure_set.render_figures(runs[runs["rate"] == 3.0], tmp_path)
    d0_b63 = next(p for p in runs["path"] if p.endswith("d0-b63-0.0-0"))
    stems = sorted({p.stem for p in paths})
    assert stems == ["d0_s2_ratio_vs_budget_" + METRIC, "headroom_" + METRIC, "joint_depth", "latency_cdf",
                     "memory_" + runs.set_index("path").loc[d0_b63, "run_id"]]
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    table = evaluate(runs, auto_contrasts(runs))
    with_forest = figure_set.render_figures(runs[runs["rate"] == 3.0], tmp_path / "f", contrasts=table)
    assert "contrasts_forest" in {p.stem for p in with_forest}


def test_forest_figure_shows_effect_ci_n_and_significance():
    table = pd.DataFrame([
        {"family": "Q4", "name": "D0/S2 b63", "effect_pct": 5.0, "effect_ci_low": 2.0, "effect_ci_high": 8.0,
         "n": 6, "significant": True, "verdict": "significant"},
        {"family": "Q4", "name": "D0/S2 b83", "effect_pct": -1.0, "effect_ci_low": -4.0, "effect_ci_high": 2.5,
         "n": 6, "significant": False, "verdict": "not significant"},
        {"family": "Q4", "name": "D0/S2 b108", "effect_pct": np.nan, "effect_ci_low": np.nan,
         "effect_ci_high": np.nan, "n": 4, "significant": False, "verdict": "invalid values"},
    ])
    ax = figures.forest_figure(table).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["Q4: D0/S2 b63", "Q4: D0/S2 b83", "Q4: D0/S2 b108"]
    assert [t.get_text() for t in ax.texts] == ["n=6 *", "n=6", "not tested: values form no ratio"]
    assert ax.get_xlabel() == "effect (%): geometric mean of within-seed ratios, 95% t CI"
    assert ax.get_ylabel() == "contrast (A/B, where)"
    first = ax.containers[0]  # errorbar of the top row: point at +5%, bar from +2% to +8%
    assert list(first.lines[0].get_xdata()) == [5.0]
    segments = first.lines[2][0].get_segments()[0]
    assert [segments[0][0], segments[1][0]] == pytest.approx([2.0, 8.0])
    assert figures.forest_figure(table.iloc[0:0]) is None


def test_forest_figure_draws_an_untested_contrast_hollow_without_an_interval():
    # a large, tight effect whose arms are not valid: left out of its Holm family, so not tested
    table = pd.DataFrame([
        {"family": METRIC, "name": "d0/s2 @ budget=b83", "metric": METRIC, "numerator": "budget=b83, org=d0",
         "denominator": "budget=b83, org=s2", "effect_pct": 20.0, "effect_ci_low": 19.0, "effect_ci_high": 21.0,
         "n": 3, "significant": False, "excluded": True, "verdict": "arms not valid",
         "arms_invalid": "seed 1: run a, b not valid; seed 2: run c not valid"},
        {"family": METRIC, "name": "d0/s2 @ budget=b108", "metric": METRIC, "numerator": "budget=b108, org=d0",
         "denominator": "budget=b108, org=s2", "effect_pct": 5.0, "effect_ci_low": 2.0, "effect_ci_high": 8.0,
         "n": 3, "significant": True, "excluded": False, "verdict": "significant", "arms_invalid": ""},
    ])
    ax = figures.forest_figure(table).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["D0/S2 budget b83", "D0/S2 budget b108"]
    assert [t.get_text() for t in ax.texts] == ["not tested: arms not valid: 3 runs not valid (seeds 1, 2)",
                                                "n=3 *"]
    assert len(ax.containers) == 1            # one interval: the tested contrast's
    (hollow,) = [ln for ln in ax.lines if list(ln.get_xdata()) == [20.0]]
    assert hollow.get_markerfacecolor() == "white"
    assert ax.get_xlabel() == "effect (%) of output tok/s (ledger window): geometric mean of within-seed ratios, 95% t CI"


@pytest.mark.slow
def test_every_axis_of_every_figure_names_its_unit(runs):
    at_rate3 = runs[runs["rate"] == 3.0]
    with_tables = runs[runs["path"].str.endswith("b63-0.0-0")]
    figs = [figures.headroom_figure(at_rate3, METRIC), figures.headroom_figure(at_rate3, "ttft_p99_s"),
            figures.ratio_figure(at_rate3[at_rate3["headroom"] == 0.0], "budget"),
            figures.joint_depth_figure(runs),
            figures.latency_cdf_figure({r["org"]: read_run(r["path"]).table("requests")
                                        for _, r in with_tables.iterrows()}),
            figures.memory_figure(read_run(with_tables.iloc[0]["path"]).table("steps"), "m"),
            figures.forest_figure(evaluate(runs, auto_contrasts(runs)))]
    for fig in figs:
        for i, ax in enumerate(fig.axes):
            assert ax.get_xlabel(), fig
            if i == 0 or not ax.get_shared_y_axes().joined(ax, fig.axes[0]):
                assert ax.get_ylabel(), fig
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                # a unit in parentheses or after a colon; a category axis names what it lists
                assert not label or "(" in label or ":" in label or label == "organization", label
    assert figs[1].axes[0].get_ylabel() == "TTFT p99 (s)"


def test_intervals_of_bounded_quantities_stay_within_the_seeds():
    # two seeds of J_adopt: the geometric mean's log-t interval (t = 12.7 on one
    # degree of freedom) reaches past 7,000 tokens, more than the 3,213-token prefix
    j_adopt = [2500.0, 3000.0]
    lo, hi = figures.stats.log_t_interval(j_adopt)
    assert hi > 7000
    centre, below, above = figures.centre_ci(j_adopt, "j_adopt_mean")
    assert centre == pytest.approx(2750.0)
    assert 2500.0 <= centre - below <= centre + above <= 3000.0
    # a fraction stays in [0, 1], a count at or above 0
    c, below, above = figures.centre_ci([0.2, 0.9, 0.95], "token_hit_rate")
    assert 0.2 <= c - below and c + above <= 0.95
    c, below, above = figures.centre_ci([0.0, 1.0, 9.0], "preemptions")
    assert c - below >= 0.0 and c + above <= 9.0
    # a throughput keeps the geometric mean and its log-t interval
    c, below, above = figures.centre_ci([100.0, 110.0, 121.0], METRIC)
    assert c == pytest.approx(110.0) and c - below == pytest.approx(figures.stats.log_t_interval([100, 110, 121])[0])


def test_joint_depth_bars_never_reach_past_their_seeds(tmp_path):
    for seed, j in ((1, 2500.0), (2, 3000.0)):
        write_run(tmp_path, f"s2-{seed}", org="s2", seed=seed,
                  summary={"j_adopt_mean": j, "r_max_mean": j, "attn_depth_mean": j})
    ax = figures.joint_depth_figure(load_runs(tmp_path)).axes[0]
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar") and c.errorbar is not None]
    segment = bars.errorbar.lines[2][0].get_segments()[0]
    assert 2500.0 <= min(segment[:, 1]) and max(segment[:, 1]) <= 3000.0


def test_forest_figure_gives_each_metric_its_own_effect_axis():
    # a -4 % throughput effect beside a +2,000 % TTFT p99 effect: one axis would flatten the first
    rows = [{"family": m, "name": f"d0/s2 @ budget=b83 [{m}]", "metric": m, "numerator": "budget=b83, org=d0",
             "denominator": "budget=b83, org=s2", "effect_pct": e, "effect_ci_low": e - w, "effect_ci_high": e + w,
             "n": 3, "significant": True, "excluded": False, "verdict": "significant", "arms_invalid": ""}
            for m, e, w in ((METRIC, -4.0, 1.0), ("ttft_p99_s", 2000.0, 500.0))]
    fig = figures.forest_figure(pd.DataFrame(rows))
    assert len(fig.axes) == 2
    assert [ax.get_xlabel().split(":")[0] for ax in fig.axes] == [
        "effect (%) of output tok/s (ledger window)", "effect (%) of TTFT p99 (s)"]
    assert fig.axes[0].get_xlim()[1] < 100 < fig.axes[1].get_xlim()[1]
    assert [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()] == ["D0/S2 budget b83"] * 2
