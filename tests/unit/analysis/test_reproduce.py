"""hbench reproduce: the study's designs as data, the study-vs-hbench table,
and an end-to-end quick reproduction of Q3 at 30 requests per run."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from click.testing import CliRunner

from analysis import designs as D
from analysis import reproduce as R
from analysis import stats
from analysis.load import load_runs
from hbench.cli import cli


def test_every_published_figure_points_at_a_declared_contrast_or_interaction():
    for p in R.PUBLISHED:
        d = D.DESIGNS[p.design]
        if p.kind == "contrast":
            assert p.target in {c.name for c in d.contrasts}, p
        elif p.kind == "interaction":
            assert p.target in {i.name for i in d.interactions}, p
        else:
            assert p.kind == "arm" and p.where, p


@pytest.mark.parametrize("name,cells,quick_cells", [
    ("q1", 3 * 3 * 6, 3 * 3 * 3), ("q2", 2 * 3 * 6, 2 * 3 * 2), ("q3", 3 * 6, 3 * 2),
    ("q4", 2 * 3 * 6, 2 * 3 * 2), ("q5", 2 * 2 * 3 * 6, 2 * 2 * 3 * 2), ("q6", 360, 60),
    ("q7", 2 * 3, 2 * 2), ("q8", 2 * 3, 2 * 2), ("q9", 4 * 6, 4 * 3),
])
def test_design_grid_sizes(name, cells, quick_cells):
    d = D.DESIGNS[name]
    assert len(d.configs()) == cells
    assert len(d.configs(quick=True)) == quick_cells
    assert {c.requests for c in d.configs(quick=True)} == {D.QUICK_REQUESTS}


def test_designs_use_the_studys_seeds_and_working_points():
    assert {c.seed for c in D.DESIGNS["q6"].configs()} == set(range(76400, 76412))
    assert {c.seed for c in D.DESIGNS["q8"].configs()} == {79010, 79011, 79012}
    assert {c.seed for c in D.DESIGNS["q9"].configs()} == set(range(88001, 88007))
    q5 = D.DESIGNS["q5"].configs()
    assert {(c.budget, c.cap) for c in q5} == {("b63", 63), ("b108", 109)}
    q4 = D.DESIGNS["q4"].configs()
    assert {(c.rate, c.cap, c.headroom, c.q) for c in q4} == {(3.0, 63, 0.0, 1.0)}
    assert {c.budget for c in D.DESIGNS["q8"].configs()} == {"254p"}
    assert len(D.DESIGNS["q1"].contrasts) == 6 and {c.family for c in D.DESIGNS["q1"].contrasts} == {"Q1"}


def _contrast_row(name, ratio, lo, hi, n=6, verdict="significant"):
    return {"name": name, "effect_pct": (ratio - 1) * 100, "ci_low": lo, "ci_high": hi, "n": n,
            "verdict": verdict}


def test_compare_direction_coverage_and_magnitude():
    contrasts = pd.DataFrame([
        _contrast_row("D0/S2 b63", 1.10, 1.06, 1.14),       # right sign, CI misses +4.978%
        _contrast_row("D0/S2 b83", 0.99, 0.95, 1.03),       # right sign, CI covers -1.728%
        _contrast_row("D0/S2 b108", 1.05, 1.01, 1.09),      # wrong sign
    ])
    t = R.compare("q4", contrasts, None, pd.DataFrame()).set_index("figure")
    b63, b83, b108 = (t.loc[f"D0 vs S2 at {b}"] for b in ("b63", "b83", "b108"))
    assert (b63["direction_reproduced"], b63["ci_covers_published"]) == ("yes", "no")
    assert b63["magnitude_ratio"] == pytest.approx(10.0 / 4.978)
    assert b63["ci_low"] == pytest.approx(6.0) and b63["ci_high"] == pytest.approx(14.0)
    assert (b83["direction_reproduced"], b83["ci_covers_published"]) == ("yes", "yes")
    assert b108["direction_reproduced"] == "no"


def test_compare_marks_missing_numbers_not_evaluated():
    t = R.compare("q4", pd.DataFrame(columns=["name"]), None, pd.DataFrame())
    assert list(t["hbench_verdict"]) == ["not evaluated"] * 3
    assert math.isnan(t["hbench"].iloc[0]) and set(t["direction_reproduced"]) == {"n/a"}


@pytest.mark.slow
def test_reproduce_q3_quick_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "QUICK_REQUESTS", 30)
    result = CliRunner().invoke(cli, ["reproduce", "q3", "--quick", "--no-figures", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    root = tmp_path / "q3-quick"
    table = pd.read_csv(root / "reproduce.csv")
    assert list(table["figure"]) == [p.figure for p in R.published_for("q3")]
    assert list(table["published"].round(3)) == [293.836, 405.376, 415.862, 37.96, 2.587, 0.0, 0.0, 0.0, 0.0, 0.0]
    # hbench values come from the runs: the S0 arm mean is the mean of the two S0 summaries
    runs = load_runs(root)
    s0 = runs[runs["org"] == "s0"]["throughput_ledger_tok_s"].mean()
    assert table.loc[0, "hbench"] == pytest.approx(s0)
    # initial input work is identical across organizations at q = 0
    assert table.loc[5, "hbench"] == 0.0 and table.loc[5, "direction_reproduced"] == "yes"
    md = (root / "reproduce.md").read_text()
    assert "| q3 | no-share control: S0 throughput | 293.836 tok/s |" in md
    assert (root / "analysis" / "report.md").is_file()
    assert "Runs and validity" in (root / "analysis" / "report.html").read_text()
    assert "no-share control" in result.output


def test_compare_shows_the_arithmetic_mean_beside_the_geometric_effect():
    row = {**_contrast_row("D0/S2 b63", 1.05, 1.01, 1.09), "mean_effect_pct": 5.4}
    t = R.compare("q4", pd.DataFrame([row]), None, pd.DataFrame()).set_index("figure")
    assert t.loc["D0 vs S2 at b63", "hbench"] == pytest.approx(5.0)
    assert t.loc["D0 vs S2 at b63", "hbench_arith"] == pytest.approx(5.4)
    assert math.isnan(t.loc["D0 vs S2 at b83", "hbench_arith"])  # not evaluated
    text = R.markdown(t.reset_index(), "q4")
    assert "| hbench arith. mean |" in text and "| 5.400 % |" in text


def test_arm_interval_of_a_token_depth_stays_within_its_seeds():
    # two seeds of J_adopt: a t interval (cut at 0) reaches far above the larger seed
    runs = pd.DataFrame({"org": ["s2", "s2"], "seed": [1, 2], "j_adopt_mean": [2500.0, 3000.0]})
    fig = R.Published("q7", "J_adopt", "arm", 3000.0, "tok", where={"org": "s2"}, metric="j_adopt_mean")
    value, lo, hi, n, _, verdict = R._lookup(fig, pd.DataFrame(), None, runs)
    assert (value, n, verdict) == (2750.0, 2, "arm mean")
    assert 2500.0 <= lo <= value <= hi <= 3000.0
    assert stats.bounded_t_interval([2500.0, 3000.0])[1] > 4000     # what it replaced


@pytest.mark.slow
def test_reproduce_tests_its_throughput_contrasts_at_the_studys_loaded_working_point(tmp_path):
    """Q8 at the study's working point: queues build (some runs' latency is not
    valid), yet throughput is the service rate each arm sustains, so every
    contrast on it is tested by default (a Holm p, no "arms not valid")."""
    result = CliRunner().invoke(cli, ["reproduce", "q8", "--quick", "--no-figures", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    root = tmp_path / "q8-quick"
    runs = load_runs(root)
    assert runs["invalid_reasons"].str.contains("overload").any()
    assert not runs["valid_for_latency"].all() and runs["valid_for_rate"].all()
    contrasts = pd.read_csv(root / "analysis" / "contrasts.csv")
    assert set(contrasts["metric"]) >= {"throughput_ledger_tok_s"}
    tput = contrasts[contrasts["metric"].str.startswith("throughput")]
    assert (tput["verdict"] != "arms not valid").all() and tput["p_holm"].notna().all()
    assert "throughput valid in 4 of 4" in result.output
