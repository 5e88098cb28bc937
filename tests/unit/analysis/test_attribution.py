"""TTFT attribution: exact parts on a hand-made step table, then simulated
runs through `hbench run` where the parts must add up to every request's
TTFT within one step, and a cap-1 run checked against its finish times."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.answer_figures import attribution_figure
from analysis.load import load_runs
from harness.attribution import CAUSES, attribute, breakdown
from tests.support.cli import hbench_run


def _steps(rows):
    return pd.DataFrame(rows, columns=["start_s", "time_s", "wait_reason", "admitted_ids",
                                       "preempted_ids", "skipped_ids"])


def test_parts_on_a_hand_made_step_table():
    steps = _steps([
        (0, 1, "", "0", "", ""),          # r1 arrives at 0.5, during this step
        (1, 2, "memory", "", "", ""),     # r1 waits: memory short
        (2, 3, "cap", "", "", ""),        # r1 waits: cap full
        (3, 4, "", "1", "", ""),          # admitted: prefill
        (4, 5, "budget", "", "", "1"),    # running but skipped: token budget
        (5, 6, "memory", "", "1", ""),    # preempted: waits for memory
        (6, 7, "", "1", "", ""),          # re-admitted: recompute
        (7, 8, "", "", "", ""),           # recompute; first token at 8
    ])
    reqs = pd.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.5, 0.0],
                         "first_token_s": [1.0, 8.0, 1.0], "warmup": [False, False, True]})
    parts = pd.DataFrame(attribute(reqs, steps)).set_index("request_id")
    assert list(parts.index) == [0, 1]          # the warm-up request is left out
    r1 = parts.loc[1]
    assert (r1["wait_memory_s"], r1["wait_cap_s"], r1["wait_budget_s"]) == (2.0, 1.0, 1.0)
    assert (r1["prefill_s"], r1["recompute_s"]) == (1.0, 2.0)
    assert r1["ttft_s"] == 7.5 and r1["unattributed_s"] == 0.5 and r1["step_s"] == 1.0
    assert parts.loc[0, "prefill_s"] == 1.0 and parts.loc[0, "unattributed_s"] == 0.0
    b = breakdown(parts.reset_index())
    assert set(b) == {f"ttft_{band}_{c}_s" for band in ("p50", "p99") for c in CAUSES}
    assert b["ttft_p99_recompute_s"] == 2.0      # the top band is request 1 alone


def test_no_reasons_no_attribution():
    steps = pd.DataFrame({"start_s": [0.0], "time_s": [1.0], "waiting": [0]})
    reqs = pd.DataFrame({"request_id": [0], "arrival_s": [0.0], "first_token_s": [1.0], "warmup": [False]})
    assert all(len(column) == 0 for column in attribute(reqs, steps).values())
    assert all(np.isnan(v) for v in breakdown(attribute(reqs, steps)).values())


def run_tables(out, *args):
    """``hbench run`` at seed 2: its JSON answer and its requests and steps tables."""
    doc, d = hbench_run(out, "--seed", "2", *args)
    return doc, pd.read_parquet(f"{d}/requests.parquet"), pd.read_parquet(f"{d}/steps.parquet")


@pytest.mark.parametrize("args, dominant", [
    (["--org", "s0", "--budget", "b63", "--q", "0", "--rate", "3", "--requests", "30"], "wait_memory"),
    (["--org", "s2", "--budget", "b108", "--rate", "4", "--requests", "12", "--cap", "1"], "wait_cap"),
    (["--org", "s2", "--budget", "b108", "--rate", "4", "--requests", "12", "--token-budget", "512"],
     "wait_budget"),
])
def test_parts_add_up_to_each_ttft_within_one_step(tmp_path, args, dominant):
    summary, reqs, steps = run_tables(tmp_path / "res", *args)
    parts = pd.DataFrame(attribute(reqs, steps))
    measured = reqs[~reqs["warmup"] & reqs["first_token_s"].notna()]
    assert len(parts) == len(measured) > 0
    total = parts[[f"{c}_s" for c in CAUSES]].sum(axis=1)
    gap = parts["ttft_s"] - total
    assert (gap >= -1e-9).all()
    assert (gap <= parts["step_s"] + 1e-9).all(), parts[gap > parts["step_s"]]
    sums = parts[[f"{c}_s" for c in CAUSES]].sum()
    assert sums.idxmax() == f"{dominant}_s", sums
    # the summary's p99 breakdown explains its top band: within one step of its mean TTFT
    top = parts[parts["ttft_s"] >= np.percentile(parts["ttft_s"], 98)]
    p99_sum = sum(summary[f"ttft_p99_{c}_s"] for c in CAUSES)
    assert abs(p99_sum - top["ttft_s"].mean()) <= steps["duration_s"].max()


def test_cap_one_waits_are_the_previous_requests_service(tmp_path):
    # With one running slot and a large budget, request k is admitted when
    # request k-1 finishes (or on arrival if idle): its wait is
    # max(0, finish[k-1] - arrival[k]), read from the request table alone.
    _, reqs, steps = run_tables(tmp_path / "res", "--org", "s2", "--budget", "b108", "--rate", "4",
                          "--requests", "12", "--cap", "1")
    reqs = reqs.sort_values("arrival_s").reset_index(drop=True)
    expected = np.maximum(0.0, reqs["finish_s"].shift(1).fillna(0.0) - reqs["arrival_s"])
    parts = pd.DataFrame(attribute(reqs, steps)).set_index("request_id").loc[reqs["request_id"]]
    waited = parts["wait_cap_s"].to_numpy() + parts["unattributed_s"].to_numpy()
    assert waited == pytest.approx(expected.to_numpy(), abs=1e-6)
    assert parts["wait_memory_s"].sum() == 0 and parts["recompute_s"].sum() == 0


def test_attribution_figure_stacks_per_organization(tmp_path):
    out = tmp_path / "res"
    for org in ("s2", "d0"):
        run_tables(out, "--org", org, "--budget", "b83", "--rate", "3", "--requests", "16")
    fig = attribution_figure(load_runs(out))
    assert fig is not None and len(fig.axes) == 2
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["D0", "S2"]
