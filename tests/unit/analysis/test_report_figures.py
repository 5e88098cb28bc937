"""Figures that tell the truth: ties drawn as ties, intervals inside the
quantity's bounds, one colour per organization, readable labels and panels
that do not collide. Hand-made tables, no engine runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.colors import to_hex

from analysis import capacity as C
from analysis import figure_set as FS
from analysis import figures
from analysis.answer_figures import attribution_figure, winner_map_figure
from analysis.headlines import capacity_headlines, contrast_sentence
from analysis.load import load_runs
from common.palette import ORG_COLORS, TIE_COLOR, org_color, text_color_on
from harness.attribution import CAUSES
from tests.support.results_factory import write_run

METRIC = "throughput_ledger_tok_s"


def _cells(goodput: dict) -> pd.DataFrame:
    """One row per (org, rate, seed) at b83; ``goodput[org][rate]`` lists a value per seed."""
    return pd.DataFrame([{"org": o, "budget": "b83", "rate": r, "seed": s + 1, "meets": g > 0, "goodput": g}
                         for o, by_rate in goodput.items() for r, gs in by_rate.items()
                         for s, g in enumerate(gs)])


def _cell_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def _cell_colours(fig) -> list[str]:
    return [to_hex(p.get_facecolor()) for p in fig.axes[0].patches]


def test_zero_goodput_everywhere_is_a_tie_not_an_alphabetical_win():
    # an SLO nobody meets: every organization has goodput 0 at every rate
    wmap = C.winner_map(_cells({"s2": {1.0: [0, 0, 0], 2.0: [0, 0, 0]},
                                "d0": {1.0: [0, 0, 0], 2.0: [0, 0, 0]}}))
    assert list(wmap["winner"]) == ["tie", "tie"]
    assert wmap["leader"].isna().all() and not wmap["significant"].any()
    fig = winner_map_figure(wmap, "t")
    assert _cell_labels(fig) == ["tie\n0.00 req/s"] * 2
    assert _cell_colours(fig) == [TIE_COLOR] * 2


def test_identical_organizations_p_one_is_a_tie():
    same = [1.5, 1.7, 1.6]
    wmap = C.winner_map(_cells({"s2": {4.0: same}, "d0": {4.0: same}}))
    (row,) = wmap.to_dict("records")
    assert row["p"] == 1.0 and row["winner"] == "tie" and row["leader"] is None
    assert _cell_labels(winner_map_figure(wmap, "t")) == ["tie\n1.60 req/s"]


def test_not_significant_lead_is_a_tie_and_a_significant_one_wins():
    wmap = C.winner_map(_cells({"s2": {1.0: [1.0, 2.0, 1.2], 2.0: [1.0, 1.1, 1.2]},
                                "d0": {1.0: [1.1, 1.0, 1.3], 2.0: [2.0, 2.1, 2.2]}})).set_index("rate")
    assert wmap.loc[1.0, "winner"] == "tie" and wmap.loc[1.0, "leader"] == "s2" and wmap.loc[1.0, "p"] > 0.05
    assert wmap.loc[2.0, "winner"] == "d0" and wmap.loc[2.0, "significant"]
    fig = winner_map_figure(wmap.reset_index(), "t")
    p = wmap.loc[1.0, "p_holm"]
    assert p >= wmap.loc[1.0, "p"]
    assert _cell_labels(fig) == [f"tie\nS2 ahead, p Holm {p:.2f}\n1.40 req/s", "D0\n2.10 req/s"]
    assert _cell_colours(fig) == [TIE_COLOR, ORG_COLORS["d0"]]
    # every cell's text has the colour that reads on its cell, never white on a light cell
    for text, colour in zip(fig.axes[0].texts, _cell_colours(fig), strict=True):
        assert text.get_color() == text_color_on(colour)
    assert text_color_on(TIE_COLOR) == "black"
    assert fig.axes[0].get_xlabel() == "arrival rate (req/s)" and fig.axes[0].get_ylabel() == "budget (label)"
    lines = capacity_headlines({"slo": ["ttft_p99<=2s"], "capacity": [], "winner_map": wmap.reset_index()
                                .to_dict("records")})
    assert lines == ["1 of 2 (budget, rate) cells have a significant goodput winner; 1 is a tie (equal "
                     "goodput, or a difference the seeds cannot tell apart)."]


def test_capacity_interval_stays_inside_the_per_seed_capacities():
    # seeds reach 0, 0 and 8 req/s: a t interval would reach far below 0 req/s
    cells = pd.DataFrame([{"org": "s2", "budget": "b83", "rate": r, "seed": s, "meets": r <= cap}
                          for s, cap in ((1, 0.0), (2, 0.0), (3, 8.0)) for r in (1.0, 2.0, 4.0, 8.0)])
    (row,) = C.capacity_table(cells).to_dict("records")
    assert row["capacity_req_s"] == pytest.approx(8 / 3)
    assert 0.0 <= row["ci_low"] <= row["capacity_req_s"] <= row["ci_high"] <= 8.0


@pytest.fixture(scope="module")
def spread_runs(tmp_path_factory):
    """s2 and d0 at two headrooms with seeds far apart (a t interval of such
    values crosses 0 tok/s), and zero depths for s2."""
    root = tmp_path_factory.mktemp("spread")
    for org in ("s2", "d0"):
        for f in (0.0, 0.19):
            for seed, v in ((1, 5.0), (2, 400.0), (3, 900.0)):
                write_run(root, f"{org}-{f}-{seed}", org=org, budget="b83", headroom=f, seed=seed,
                          tables=(f == 0.0 and seed == 1 + (org == "d0")),
                          summary={METRIC: v, "j_adopt_mean": (0.0, 40.0, 60.0)[seed - 1] if org == "s2" else 10.0 * seed,
                                   "r_max_mean": 1.0 * seed, "attn_depth_mean": 2.0 * seed,
                                   **{f"ttft_{b}_{c}_s": 0.1 for b in ("p50", "p99") for c in CAUSES}})
    return load_runs(root)


def _error_bar_ranges(ax):
    """(low, high) of every vertical error bar drawn on ``ax``."""
    out = []
    for container in ax.containers:
        for coll in getattr(container, "lines", [None, None, ()])[2]:
            for seg in coll.get_segments():
                out.append((min(seg[0][1], seg[1][1]), max(seg[0][1], seg[1][1])))
    return out


def test_headroom_error_bars_never_reach_below_zero(spread_runs):
    fig = figures.headroom_figure(spread_runs, METRIC)
    ranges = _error_bar_ranges(fig.axes[0])
    assert ranges and all(lo > 0 for lo, _ in ranges)
    # the naive t interval of these seeds does cross zero: the test can fail
    from analysis.stats import t_interval
    assert t_interval([5.0, 400.0, 900.0])[0] < 0


def test_depth_bars_stay_within_the_seeds_when_one_is_zero(spread_runs):
    fig = figures.joint_depth_figure(spread_runs)
    for ax in fig.axes:
        assert all(lo >= 0 for lo, _ in _error_bar_ranges(ax))
    # J_adopt: d0 (all seeds > 0) then s2 (0, 40, 60: a percentile interval within [0, 60])
    _, (lo, hi) = _error_bar_ranges(fig.axes[0])
    assert 0.0 <= lo and hi <= 60.0
    from analysis.stats import t_interval
    assert t_interval([0.0, 40.0, 60.0])[0] < 0


def test_one_colour_per_organization_in_every_figure(spread_runs):
    two = figures.headroom_figure(spread_runs, METRIC)
    colours = {c.get_label(): to_hex(c.lines[0].get_color()) for c in two.axes[0].containers}
    assert colours == {"D0": ORG_COLORS["d0"], "S2": ORG_COLORS["s2"]}
    bars = figures.joint_depth_figure(spread_runs).axes[0].patches
    assert [to_hex(b.get_facecolor()) for b in bars] == [org_color("d0"), org_color("s2")]
    four = figures.latency_cdf_figure({o: pd.DataFrame({"ttft_s": [0.1, 0.2], "itl_mean_s": [0.01, 0.02]})
                                       for o in ("s0", "s1", "s2", "d0")})
    assert {ln.get_label(): to_hex(ln.get_color()) for ln in four.axes[0].get_lines()} == \
        {o.upper(): ORG_COLORS[o] for o in ("s0", "s1", "s2", "d0")}
    assert len(set(ORG_COLORS.values())) == len(ORG_COLORS)   # no two organizations share one


def _overlap(a, b) -> bool:
    return not (a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0)


def test_attribution_titles_do_not_overlap_with_one_organization(spread_runs):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = attribution_figure(spread_runs[spread_runs["org"] == "s2"])
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    titles = [ax.title.get_window_extent(r) for ax in fig.axes]
    assert len(titles) == 2 and not _overlap(*titles)
    width = fig.bbox.width
    for ax in fig.axes:
        for label in (ax.title, ax.yaxis.label, ax.xaxis.label):
            box = label.get_window_extent(r)
            assert box.x0 >= 0 and box.x1 <= width, label.get_text()


def _has_steps(path: str) -> bool:
    return (Path(path) / "steps.parquet").is_file()


def test_memory_figure_shows_the_run_with_the_highest_peak(spread_runs):
    # the factory's steps peak at the same bytes; the tie goes to the first run id
    row, steps = FS.peak_memory_run(spread_runs)
    assert row["run_id"] == min(spread_runs.loc[spread_runs["path"].map(_has_steps), "run_id"])
    (stem, caption, fig) = next(f for f in FS.figure_set(spread_runs) if f[0].startswith("memory_"))
    assert stem == f"memory_{row['run_id']}" and "highest peak" in caption and "highest peak" in fig.axes[0].get_title()


def test_sentences_say_not_significant_when_the_ci_contains_zero():
    row = {"name": "s2/s0 @ budget=b83, rate=2.0", "metric": METRIC, "numerator": "budget=b83, org=s2",
           "denominator": "budget=b83, org=s0", "n": 3, "effect_pct": 12.3, "effect_ci_low": 4.1,
           "effect_ci_high": 20.9, "p_holm": 0.01, "significant": True, "verdict": "significant"}
    assert contrast_sentence(row) == ("S2 serves 12.3 % more output tok/s than S0 at budget b83, 2 req/s "
                                      "(95 % CI [+4.1, +20.9] %, Holm p 0.01, 3 paired seeds).")
    null = {**row, "effect_ci_low": -3.0, "p_holm": 0.4, "significant": False, "verdict": "not significant"}
    assert contrast_sentence(null).endswith("3 paired seeds; the CI contains 0).")
    assert "do not differ significantly" in contrast_sentence(null)
    tiny = {**null, "effect_pct": -0.3, "effect_ci_low": -0.6, "effect_ci_high": -0.04}
    assert "-0.3 % (95 % CI [-0.6, +0.0] %" in contrast_sentence(tiny)
    bad = {**row, "verdict": "arms not valid", "arms_invalid": "seed 1: run abc not valid"}
    assert contrast_sentence(bad) == ("S2 vs S0 at budget b83, 2 req/s on output tok/s is not tested: arms "
                                      "not valid: 1 run not valid (seed 1).")


def test_capacity_sentence_says_when_every_seed_held_at_the_grid_top():
    doc = {"slo": ["ttft_p99<=2s"], "rates": [1.0, 3.0, 6.0], "capacity": [
        {"org": "s2", "budget": "b83", "capacity_req_s": 6.0, "ci_low": 6.0, "ci_high": 6.0, "per_seed": "1: 6, 2: 6"},
        {"org": "d0", "budget": "b83", "capacity_req_s": 4.5, "ci_low": 3.0, "ci_high": 6.0, "per_seed": "1: 3, 2: 6"}]}
    assert capacity_headlines(doc) == [
        "S2 at b83 sustains at least the grid's top rate, 6.00 req/s within ttft_p99<=2s (interval [6.00, 6.00] "
        "req/s over 2 seeds; per seed 1: 6, 2: 6).",
        "D0 at b83 sustains 4.50 req/s within ttft_p99<=2s (interval [3.00, 6.00] req/s over 2 seeds; "
        "per seed 1: 3, 2: 6)."]


def test_memory_given_lists_runs_without_a_paging_mode(tmp_path):
    from analysis.html_sections import memory_given_section

    runs = pd.DataFrame({"engine": "sim", "paging": [None, None], "budget": "b83", "org": ["s2", "d0"],
                         "allocated_bytes": [5 * 2**30, 5 * 2**30]})
    text = memory_given_section(runs)
    assert text.count("5,120.00") == 2, text


def test_attribution_bars_leave_room_above_the_tallest_and_use_no_organization_colour(spread_runs):
    from analysis.answer_figures import CAUSE_COLOURS

    assert not set(CAUSE_COLOURS.values()) & set(ORG_COLORS.values())
    fig = attribution_figure(spread_runs)
    tops = [p.get_y() + p.get_height() for ax in fig.axes for p in ax.patches]
    assert max(tops) < fig.axes[0].get_ylim()[1]


def test_a_ratio_figure_of_runs_that_cannot_be_paired_is_named_not_drawn(tmp_path):
    # one seed whose request streams differ between the arms (workload hashes):
    # pairing refuses them
    for org, stream in (("s2", "a" * 16), ("d0", "b" * 16)):
        for budget in ("b83", "b108"):
            write_run(tmp_path, f"{org}-{budget}", org=org, budget=budget, seed=1,
                      workload=stream, summary={METRIC: 100.0})
    runs = load_runs(tmp_path)
    entry = next(f for f in FS.figure_set(runs) if f[0] == f"d0_s2_ratio_vs_budget_{METRIC}")
    assert entry[2] is None and entry[1].startswith("The D0/S2 ratio by budget is not drawn: ")
    from analysis.html_report import build_html

    assert "The D0/S2 ratio by budget is not drawn: " in build_html(tmp_path, runs)


def test_budgets_are_never_pooled_in_the_depth_and_latency_figures(spread_runs):
    """Two budgets: a bar per (budget, organization) and a CDF line per
    (organization, budget), in the organization's colour, the budget's style."""
    two = spread_runs.copy()
    two.loc[two["headroom"] == 0.19, "budget"] = "b108"
    fig = figures.joint_depth_figure(two)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["D0\nb83", "S2\nb83", "D0\nb108", "S2\nb108"]
    req = pd.DataFrame({"ttft_s": [0.1, 0.2], "itl_mean_s": [0.01, 0.02]})
    cdf = figures.latency_cdf_figure({("s2", "b83"): req, ("s2", "b108"): req * 3, ("d0", "b83"): req})
    lines = {ln.get_label(): (to_hex(ln.get_color()), ln.get_linestyle()) for ln in cdf.axes[0].get_lines()}
    assert lines == {"D0 @ b83": (org_color("d0"), "-"), "S2 @ b108": (org_color("s2"), "--"),
                     "S2 @ b83": (org_color("s2"), "-")}
    one = figures.latency_cdf_figure({("s2", "b83"): req, ("d0", "b83"): req})   # one budget: as before
    assert sorted(ln.get_label() for ln in one.axes[0].get_lines()) == ["D0", "S2"]


def test_two_seeds_far_apart_keep_the_depth_interval_between_them():
    """Two seeds far apart (10 and 1,000 tokens): the interval of S2's mean
    J_adopt stays between them (a log-t interval on two seeds would reach
    past 10^5), so the axis shows it whole and nothing needs cutting."""
    runs = pd.DataFrame({"org": ["s2", "s2", "d0", "d0"], "budget": ["b83"] * 4,
                         "j_adopt_mean": [10.0, 1000.0, 500.0, 510.0]})
    ax = figures.joint_depth_figure(runs).axes[0]
    segments = [seg for c in ax.containers if getattr(c, "errorbar", None)
                for seg in c.errorbar.lines[2][0].get_segments()]
    assert max(seg[:, 1].max() for seg in segments) <= 1000.0
    assert min(seg[:, 1].min() for seg in segments) >= 10.0
    assert ax.get_ylim()[1] >= 1000.0 * 0.99 and not ax.texts
    assert figures.stats.log_t_interval([10.0, 1000.0])[1] > 1e5      # what a log-t interval would draw
